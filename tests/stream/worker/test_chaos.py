"""Chaos: >= 1,000 groups with every kind of bad input while workers are SIGKILLed, restarted, joined and
left. Afterwards a read_committed reader sees every expected outcome exactly once, values equal to core."""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest

from rollout_stream.ops.synth import Expected, FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from tests.stream.helpers import assert_exactly_once, new_topics, read_topic, spawn_worker, train_samples

pytestmark = pytest.mark.kafka(timeout=240)

GROUPS = 1000


def test_exactly_once_through_kills_restarts_and_a_second_worker(kafka_bootstrap, tmp_path):
    rng = random.Random(20261129)
    topics = new_topics(kafka_bootstrap, partitions=3, prefix="chaos")
    group_id = f"chaos-{topics.input}"
    plan = SynthPlan(group_size=4, max_siblings=2, tokens=8, faults=FaultRates.uniform(0.03), seed=11,
                     run_id="chaos")
    expected = Expected()
    batches = []
    for records, exp in plan_groups(plan, GROUPS):
        expected.add(exp)
        batches.append(records)

    produce_failed: list[BaseException] = []

    def produce() -> None:
        try:
            with RolloutProducer(kafka_bootstrap, topic=topics.input) as p:
                for i, records in enumerate(batches):
                    for r in records:
                        p.send_raw(r.key, r.value)
                    if i % 25 == 24:
                        p.flush()
                        time.sleep(0.4)  # spread the input over the kills (~16 s in all)
        except BaseException as exc:  # seen by `trouble()`: the test stops waiting for output never sent
            produce_failed.append(exc)
            raise

    args = ("--group-timeout", "4", "--commit-interval", "0.2", "--session-timeout", "6")
    logs: list = []

    def start(instance: str):
        """The worker process and its log file."""
        logs.append(tmp_path / f"{instance}-{len(logs)}.log")
        process = spawn_worker(
            kafka_bootstrap, topics, group_id, *args, "--instance-id", instance, log_path=logs[-1]
        )
        return process, logs[-1]

    def exited(process, log_file) -> str | None:
        """Why a worker that should be running is not: its exit code and the end of its log."""
        if process.poll() is None:
            return None
        return f"worker exited with code {process.returncode}: {log_file.read_text()[-2000:]}"

    def trouble() -> str | None:
        """A worker or the producer gone while the test waits for their output: fail now, not at a timeout."""
        if produce_failed:
            return f"the producer failed: {produce_failed[0]!r}"
        return exited(worker, worker_log)

    def wait_working(process, log_file, timeout: float = 30.0) -> None:
        """Until this instance has restored its partitions and is processing."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log_file.exists() and "event=partition.restored" in log_file.read_text():
                return
            if (problem := exited(process, log_file)) is not None:
                raise AssertionError(f"before it got to work, {problem}")
            time.sleep(0.1)
        raise AssertionError(f"worker never got to work: {log_file.read_text()[-2000:]}")

    producer = threading.Thread(target=produce)
    worker, worker_log = start("w1")
    producer.start()
    kills = 0
    try:
        for _ in range(3):  # SIGKILL at random moments while it works; restart under the same instance id
            wait_working(worker, worker_log)
            time.sleep(rng.uniform(0.5, 2.5))
            assert (problem := trouble()) is None, problem  # it died by itself before the kill
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            kills += 1
            worker, worker_log = start("w1")
        wait_working(worker, worker_log)
        second, second_log = start("w2")  # a second worker joins mid-stream...
        wait_working(second, second_log)
        time.sleep(rng.uniform(1, 3))
        second.send_signal(signal.SIGTERM)  # ...and leaves
        assert second.wait(40) == 0, exited(second, second_log)
        deadline = time.monotonic() + 60
        while producer.is_alive() and time.monotonic() < deadline:
            assert (problem := trouble()) is None, problem
            producer.join(0.5)
        assert not producer.is_alive() and not produce_failed, trouble() or "the producer did not finish"

        total = expected.published_samples
        dead = sum(expected.dead_letters.values())
        train = train_samples(
            read_topic(kafka_bootstrap, topics.output, min_count=total, timeout=90, settle=3, abort=trouble)
        )
        dlq = read_topic(kafka_bootstrap, topics.dead_letter, min_count=dead, timeout=30, settle=2,
                         abort=trouble)
    finally:
        worker.send_signal(signal.SIGTERM)
        rc = worker.wait(40)
    assert rc == 0
    assert kills == 3

    # Exactly once: every expected output, none twice.
    assert_exactly_once(train, dlq, expected)
    rereads = [int(x.split()[0]) for f in logs for x in f.read_text().split("reread=")[1:]]
    # The kills hit workers holding open windows: a restart rebuilt them by re-reading the input.
    assert max(rereads) > 0
