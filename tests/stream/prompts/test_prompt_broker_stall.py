"""A broker that stops answering for seconds under a running prompt loop (docs/loop.md): a renewal that is
only late is not a revocation, a lease the log did end gives its prompt back, and every prompt trains once."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from rollout_stream.broker.errors import PortInUse
from rollout_stream.broker.local import LocalBroker
from rollout_stream.broker.process import free_port
from rollout_stream.clients import Connection
from rollout_stream.codec import Sample
from rollout_stream.config import WorkerConfig
from rollout_stream.core.prompts import PromptLog
from rollout_stream.pacing import AdmissionRevoked, WeightsTooOld
from rollout_stream.prompts import PromptSource, SourceFinished, prompt_fence
from rollout_stream.reader import TrainDataReader
from tests.stream.helpers import new_topics, running_worker, wait_until

pytestmark = [pytest.mark.kafka(timeout=180), pytest.mark.every_client, pytest.mark.any_client]

PROMPTS = 24
STALL_S = 3.0


@pytest.fixture
def own_broker(tmp_path):
    """A broker of this test's own: it is frozen (the session's broker is never stopped)."""
    for _ in range(3):
        broker = LocalBroker(port=free_port(), data_dir=tmp_path / "kafka")
        try:
            broker.start(timeout=90)
            break
        except PortInUse:
            continue
    else:
        pytest.fail("no free port for the test's own broker")
    try:
        yield broker
    finally:
        pid = broker.status().pid
        if pid is not None:
            os.kill(pid, signal.SIGCONT)  # never left frozen, whatever failed
        broker.stop(timeout=20)


def test_a_broker_stalled_for_seconds_under_the_loop_kills_no_loop_and_every_prompt_trains_once(own_broker):
    bootstrap = f"127.0.0.1:{own_broker.port}"
    topics = new_topics(bootstrap, partitions=2, prefix="stall")
    trainer = f"trainer-{topics.input}"
    rows = [{"prompt": f"q{i}"} for i in range(PROMPTS)]
    config = WorkerConfig(bootstrap_servers=bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)
    version = [0]
    died: list[BaseException] = []
    revoked: list[str] = []
    stop = threading.Event()
    batches: list[list[str]] = []
    finished: list[tuple[list[int], int]] = []

    def rollouts(source: PromptSource) -> None:
        """The loop of docs/loop.md."""
        try:
            with source:
                while True:
                    try:
                        lease = source.take(weight_version=version[0], timeout=60)
                    except SourceFinished:  # every prompt settled: what the log says of them
                        fold = source.gate.follower.fold
                        assert isinstance(fold, PromptLog)
                        finished.append(([s.trained for s in source.status()], fold.duplicates))
                        return
                    except WeightsTooOld:  # the trainer moved on since the version was read
                        continue
                    time.sleep(0.05)  # generating
                    samples = [Sample(group_index=0, index=i, rollout_id=i, reward=float(i))
                               for i in range(2)]
                    try:
                        futures = source.publish(lease, samples)
                    except AdmissionRevoked:  # the log ended the lease: the prompt is handed out again
                        revoked.append(str(lease.key))
                        continue
                    for future in futures:
                        future.get(60)
        except BaseException as exc:
            died.append(exc)

    def training(reader: TrainDataReader) -> None:
        try:
            while not stop.is_set():
                batch = reader.next_batch(timeout=1)
                if batch is None:
                    continue
                batches.append([g.key for g in batch.groups])
                time.sleep(0.25)  # a step
                reader.commit()
                version[0] += 1
                reader.set_weight_version(version[0])
        except BaseException as exc:
            died.append(exc)

    with running_worker(config):
        reader = TrainDataReader(bootstrap, topics.output, trainer, groups_per_batch=2,
                                 max_weight_staleness=1, start="earliest",
                                 fence=prompt_fence(Connection(bootstrap), topics.output))
        sources = [PromptSource(bootstrap, rows, name="toy", trainer_group_id=trainer, topic=topics.input,
                                train_data_topic=topics.output, producer_id=f"rollout-{i}-{topics.input}",
                                epochs=1, max_policy_lag=1, max_unconsumed_groups=4) for i in range(2)]
        threads = [threading.Thread(target=rollouts, args=(s,), daemon=True) for s in sources]
        threads.append(threading.Thread(target=training, args=(reader,), daemon=True))
        try:
            for t in threads:
                t.start()
            wait_until(lambda: len(batches) >= 2 or bool(died), timeout=30, what="two batches trained")
            pid = own_broker.status().pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(STALL_S)
            finally:
                os.kill(pid, signal.SIGCONT)
            for t in threads[:-1]:
                t.join(timeout=60)
            assert not died, died
            assert not any(t.is_alive() for t in threads[:-1]), "a rollout loop did not finish"
        finally:
            stop.set()
            threads[-1].join(timeout=30)
            reader.close()
        assert not died, died
        trained = [key.split("@")[0] + "/" + key.rsplit("/", 1)[1] for batch in batches for key in batch]
        assert sorted(trained) == sorted(f"toy/{i}" for i in range(PROMPTS))  # each prompt once
        assert finished == [([PROMPTS], 0)] * 2  # in the log: all trained, none twice
        print(f"admissions the log ended: {len(revoked)} ({revoked})")
