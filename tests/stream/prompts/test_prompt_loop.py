"""The loop on the real broker: a prompt source, the stage and a trainer; a process that takes a prompt and
goes away gives it back, and every prompt of the epoch trains once (docs/loop.md)."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from rollout_stream.app import app
from rollout_stream.clients import Connection
from rollout_stream.codec import Sample
from rollout_stream.config import WorkerConfig
from rollout_stream.core.prompt_keys import parse_attempt_key
from rollout_stream.core.prompts import PromptLog, PromptState
from rollout_stream.producer import RolloutProducer
from rollout_stream.prompts import PromptSource, SourceFinished, prompt_fence
from rollout_stream.reader import TrainDataReader
from tests.stream.helpers import new_topics, read_topic, running_worker, wait_until

ROWS = [{"prompt": f"q{i}"} for i in range(4)]


def group(row: dict[str, str]) -> list[Sample]:
    return [Sample(group_index=0, index=i, rollout_id=i, reward=float(i)) for i in range(2)]


@pytest.mark.kafka(timeout=120)
def test_every_prompt_of_the_epoch_trains_once_and_a_prompt_given_back_is_handed_out_again(
        kafka_bootstrap: str) -> None:
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="prompts")
    trainer = f"trainer-{topics.input}"
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)

    def source(name: str) -> PromptSource:
        return PromptSource(kafka_bootstrap, ROWS, name="toy", trainer_group_id=trainer, topic=topics.input,
                            train_data_topic=topics.output, producer_id=f"{name}-{topics.input}", epochs=1)

    with running_worker(config):
        reader = TrainDataReader(kafka_bootstrap, topics.output, trainer, groups_per_batch=2,
                                 start="earliest")
        main = source("rollout-0")
        try:
            gone = source("rollout-1")
            given_back = gone.take(timeout=30)
            gone.close()  # its unsent attempt is released: the prompt is the next handed out
            leases = [main.take(timeout=30) for _ in range(4)]
            assert leases[0].key.prompt == given_back.key.prompt
            assert sorted(x.key.prompt for x in leases) == [0, 1, 2, 3]
            for lease in leases:
                main.publish(lease, group(lease.row))
            trained = []
            for _ in range(2):
                batch = reader.next_batch(timeout=30)
                assert batch is not None
                trained += [g.key for g in batch.groups]
                reader.commit()
            assert sorted(trained) == sorted(str(x.key) for x in leases)
            wait_until(lambda: [s.trained for s in main.status()] == [4], timeout=30, what="all trained")
            with pytest.raises(SourceFinished):
                main.take(timeout=1)
            fold = main.gate.follower.fold
            assert isinstance(fold, PromptLog)
            states = {getattr(fold.prompt("toy", 0, p), "state", None) for p in range(4)}
            assert states == {PromptState.TRAINED}
            check_the_cli(kafka_bootstrap, topics.output, given_back.key.prompt)
        finally:
            main.close()
            reader.close()


KILLED_MID_GROUP = """
import os, sys
from rollout_stream.codec import Sample
from rollout_stream.prompts import PromptSource
bootstrap, topic, output, trainer = sys.argv[1:5]
rows = [{"prompt": f"q{i}"} for i in range(4)]
source = PromptSource(bootstrap, rows, name="toy", trainer_group_id=trainer, topic=topic,
                      train_data_topic=output, producer_id="doomed-" + topic, epochs=1)
lease = source.take(timeout=30)
source.gate.bind(str(lease.key), lease.request)
half = Sample(group_index=lease.group_index, run_id=lease.run_id, index=0, rollout_id=0, reward=1.0,
              group_size=2, sibling_count=1, sibling_index=0)
source.producer.send(half)
source.producer.flush()
print(lease.key, flush=True)
os.kill(os.getpid(), 9)  # mid-group: one rollout of two sent
"""


@pytest.mark.kafka(timeout=120)
def test_a_prompt_whose_process_was_killed_mid_group_is_handed_out_again_and_trains_once(
        kafka_bootstrap: str) -> None:
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="killed")
    trainer = f"trainer-{topics.input}"
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)
    with running_worker(config):
        done = subprocess.run([sys.executable, "-c", KILLED_MID_GROUP, kafka_bootstrap, topics.input,
                               topics.output, trainer], capture_output=True, text=True, timeout=60)
        assert done.returncode == -9, done.stderr
        killed = parse_attempt_key(done.stdout.strip())
        assert killed is not None and killed.attempt == 1
        reader = TrainDataReader(kafka_bootstrap, topics.output, trainer, groups_per_batch=2,
                                 start="earliest")
        main = PromptSource(kafka_bootstrap, ROWS, name="toy", trainer_group_id=trainer, topic=topics.input,
                            train_data_topic=topics.output, producer_id=f"rollout-0-{topics.input}", epochs=1)
        try:
            leases = [main.take(timeout=30) for _ in range(4)]  # the fourth waits for the lease to end
            assert (leases[-1].key.prompt, leases[-1].key.attempt) == (killed.prompt, 2)
            for lease in leases:
                main.publish(lease, group(lease.row))
            for _ in range(2):
                assert reader.next_batch(timeout=30) is not None
                reader.commit()
            wait_until(lambda: [(s.trained, s.reissued) for s in main.status()] == [(4, 1)], timeout=30,
                       what="four prompts trained, one of them re-issued")
        finally:
            main.close()
            reader.close()


FROZEN_MID_GROUP = """
import os, signal, sys
from rollout_stream.codec import Sample
from rollout_stream.prompts import PromptSource
bootstrap, topic, output, trainer = sys.argv[1:5]
rows = [{"prompt": f"q{i}"} for i in range(4)]
source = PromptSource(bootstrap, rows, name="toy", trainer_group_id=trainer, topic=topic,
                      train_data_topic=output, producer_id="frozen-" + topic, epochs=2)
lease = source.take(timeout=30)
source.gate.bind(str(lease.key), lease.request)
for index in range(2):
    source.producer.send(Sample(group_index=lease.group_index, run_id=lease.run_id, index=index,
                                rollout_id=index, reward=float(index), group_size=2, sibling_count=1,
                                sibling_index=0))
    source.producer.flush()
    if index == 0:
        print(lease.key, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen past its lease with half the group sent
source.close()
"""


@pytest.mark.kafka(timeout=120)
def test_a_process_frozen_mid_group_past_its_lease_does_not_train_a_second_copy(kafka_bootstrap: str) -> None:
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="frozen")
    trainer = f"trainer-{topics.input}"
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)
    with running_worker(config):
        frozen = subprocess.Popen([sys.executable, "-c", FROZEN_MID_GROUP, kafka_bootstrap, topics.input,
                                   topics.output, trainer], stdout=subprocess.PIPE, text=True)
        main = reader = None
        try:
            assert frozen.stdout is not None
            first = parse_attempt_key(frozen.stdout.readline().strip())
            assert first is not None
            reader = TrainDataReader(kafka_bootstrap, topics.output, trainer, groups_per_batch=2,
                                     start="earliest", fence=prompt_fence(Connection(kafka_bootstrap),
                                                                          topics.output))
            main = PromptSource(kafka_bootstrap, ROWS, name="toy", trainer_group_id=trainer,
                                topic=topics.input, train_data_topic=topics.output,
                                producer_id=f"rollout-0-{topics.input}", epochs=2)
            leases = [main.take(timeout=30) for _ in range(3)]
            # its lease ends 3 s of log time after its last renewal: then its prompt comes first
            wait_until(lambda: main.status()[0].reissued == 1, timeout=30, what="the frozen one re-issued")
            leases.append(main.take(timeout=30))
            again = leases[-1].key
            assert (again.epoch, again.prompt, again.attempt) == (0, first.prompt, 2)
            for lease in leases:
                main.publish(lease, group(lease.row))
            for _ in range(2):
                assert reader.next_batch(timeout=30) is not None
                reader.commit()
            frozen.send_signal(signal.SIGCONT)  # its first attempt completes and reaches train-data
            assert frozen.wait(timeout=30) == 0
            more = [main.take(timeout=30) for _ in range(2)]  # the next epoch, to fill one more batch
            for lease in more:
                main.publish(lease, group(lease.row))
            batch = reader.next_batch(timeout=30)
            assert batch is not None
            assert sorted(g.key for g in batch.groups) == sorted(str(x.key) for x in more)
            assert batch.skipped_superseded == 1  # the late first attempt, refused by the fence
            reader.commit()
            wait_until(lambda: [s.trained for s in main.status()] == [4, 2], timeout=30, what="trained")
            fold = main.gate.follower.fold
            assert isinstance(fold, PromptLog) and fold.duplicates == 0
        finally:
            if frozen.poll() is None:
                frozen.kill()
            if main is not None:
                main.close()
            if reader is not None:
                reader.close()


@pytest.mark.kafka(timeout=120)
def test_a_trainer_restarted_before_its_commit_trains_the_batch_again_and_it_counts_once(
        kafka_bootstrap: str) -> None:
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="restart")
    trainer = f"trainer-{topics.input}"
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)
    with running_worker(config):
        main = PromptSource(kafka_bootstrap, ROWS, name="toy", trainer_group_id=trainer, topic=topics.input,
                            train_data_topic=topics.output, producer_id=f"rollout-0-{topics.input}", epochs=1)
        try:
            for lease in [main.take(timeout=30) for _ in range(4)]:
                main.publish(lease, group(lease.row))
            first = TrainDataReader(kafka_bootstrap, topics.output, trainer, groups_per_batch=2)
            assert first.next_batch(timeout=30) is not None
            first.commit()
            assert first.next_batch(timeout=30) is not None  # trained, never committed: the process dies
            first.close()
            wait_until(lambda: [s.trained for s in main.status()] == [2], timeout=30, what="batch 0 settled")
            again = TrainDataReader(kafka_bootstrap, topics.output, trainer, groups_per_batch=2,
                                    fence=prompt_fence(Connection(kafka_bootstrap), topics.output))
            try:
                batch = again.next_batch(timeout=30)
                assert batch is not None and batch.index == 1 and batch.skipped_superseded == 0
                again.commit()
            finally:
                again.close()
            wait_until(lambda: [s.trained for s in main.status()] == [4], timeout=30, what="all trained")
            fold = main.gate.follower.fold
            assert isinstance(fold, PromptLog) and fold.duplicates == 0
        finally:
            main.close()


@pytest.mark.kafka(timeout=90)
def test_the_reader_s_fence_lets_one_attempt_of_a_prompt_train(kafka_bootstrap: str) -> None:
    """A process frozen past its lease that still sends: two attempts of one prompt reach train-data. Two
    ranks, each with its own fence, make the same call."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="fence")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)
    with running_worker(config):
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
            for run_id, row in (("toy@0.1", 0), ("toy@0.2", 0), ("toy@0.1", 1)):
                producer.send_many([Sample(group_index=row, index=i, rollout_id=i, reward=float(i))
                                    for i in range(2)], run_id=run_id)
        ranks = [TrainDataReader(kafka_bootstrap, topics.output, f"t-{topics.input}", groups_per_batch=2,
                                 rank=rank, world_size=2, start="earliest", publish_progress=False,
                                 fence=prompt_fence(Connection(kafka_bootstrap), topics.output))
                 for rank in range(2)]  # no log yet: nothing trained
        try:
            batches = [reader.next_batch(timeout=30) for reader in ranks]
            assert batches[0] is not None and batches[1] is not None
            trained = [[g.key for g in b.groups] for b in batches]
            assert trained[0] == trained[1]  # the same groups on both ranks, whichever attempt came first
            assert sorted(k.rsplit("/", 1)[1] for k in trained[0]) == ["0", "1"]  # one attempt per prompt
            assert batches[0].skipped_superseded == batches[1].skipped_superseded == 1
        finally:
            for reader in ranks:
                reader.close()


def check_the_cli(bootstrap: str, output_topic: str, row: int) -> None:
    """`prompts` shows the epoch settled; `prompts show` the prompt given back, attempt by attempt."""
    common = ["--bootstrap-servers", bootstrap, "--output-topic", output_topic, "--json"]
    result = CliRunner().invoke(app, ["prompts", *common])
    assert result.exit_code == 0, result.output
    (toy,) = json.loads(result.output)["sources"]
    assert (toy["name"], toy["epochs"][0]["trained"], toy["epochs"][0]["waiting"]) == ("toy", 4, 0)
    result = CliRunner().invoke(app, ["prompts", "show", f"toy@0/{row}", *common])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    # the epoch is settled: its attempts are no longer kept, the outcome is
    assert (shown["state"], shown["attempts"]) == ("trained", [])
    result = CliRunner().invoke(app, ["prompts", "show", "toy@0/99", *common[:-1]])
    assert result.exit_code == 1 and "not handed out" in result.output


@pytest.mark.kafka(timeout=150)
def test_a_prompt_whose_attempts_are_exhausted_is_dead_lettered_once_with_its_history(
        kafka_bootstrap: str) -> None:
    """One attempt allowed; its process killed -9 mid-group: the lease ends, the prompt is exhausted, and of
    the two live processes of the source exactly one writes its `prompt_attempts_exhausted` record (beside
    the stage's `incomplete_group` for the half group), which `dlq stats` and `dlq list` show."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="exhausted")
    trainer = f"trainer-{topics.input}"
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2, group_timeout_s=3.0)
    script = KILLED_MID_GROUP.replace("epochs=1)", "epochs=1, max_attempts=1)")
    with running_worker(config):
        done = subprocess.run([sys.executable, "-c", script, kafka_bootstrap, topics.input, topics.output,
                               trainer], capture_output=True, text=True, timeout=60)
        assert done.returncode == -9, done.stderr
        killed = parse_attempt_key(done.stdout.strip())
        assert killed is not None

        def source(name: str) -> PromptSource:
            return PromptSource(kafka_bootstrap, ROWS, name="toy", trainer_group_id=trainer,
                                topic=topics.input, train_data_topic=topics.output, epochs=1, max_attempts=1,
                                producer_id=f"{name}-{topics.input}", dead_letter_topic=topics.dead_letter)

        reader = TrainDataReader(kafka_bootstrap, topics.output, trainer, groups_per_batch=3,
                                 start="earliest")
        a, b = source("rollout-0"), source("rollout-1")
        try:
            held = [(a, a.take(timeout=30)), (b, b.take(timeout=30)), (a, a.take(timeout=30))]
            assert killed.prompt not in {x.key.prompt for _, x in held}
            for holder, lease in held:
                holder.publish(lease, group(lease.row))
            assert reader.next_batch(timeout=30) is not None
            reader.commit()
            wait_until(lambda: [(s.trained, s.exhausted) for s in a.status()] == [(3, 1)], timeout=30,
                       what="three prompts trained, the killed one exhausted")
            for s in (a, b):  # both would write it; one does
                with pytest.raises(SourceFinished):
                    s.take(timeout=10)
            wait_until(lambda: not a.exhausted.pending() and not b.exhausted.pending(), timeout=30,
                       what="the exhausted prompt's record written")
        finally:
            a.close()
            b.close()
            reader.close()
        dead = read_topic(kafka_bootstrap, topics.dead_letter, min_count=1, settle=2.0)
    exhausted = [r for r in dead if r.headers.get("x-dlq-reason") == "prompt_attempts_exhausted"]
    assert len(exhausted) == 1, [(r.key, r.headers.get("x-dlq-reason")) for r in dead]
    assert exhausted[0].key == f"toy@0/{killed.prompt}".encode()
    assert exhausted[0].headers["x-group-key"] == str(killed)
    history = json.loads(exhausted[0].value or b"")
    # its lease ended or the stage timed the half group out, whichever the log says first
    assert [x["ended"] for x in history["attempts"]] in (["lease"], ["incomplete"])
    # the stage's own word on the half group, if its timeout has passed: the attempt had ended already
    assert {r.headers.get("x-dlq-reason") for r in dead} <= {"prompt_attempts_exhausted", "incomplete_group"}
    common = ["--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", topics.dead_letter]
    result = CliRunner().invoke(app, ["dlq", "stats", *common], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "prompt_attempts_exhausted" in result.output, result.output
    result = CliRunner().invoke(app, ["dlq", "list", *common, "--reason", "prompt_attempts_exhausted",
                                      "--json"])
    assert result.exit_code == 0 and f"toy@0/{killed.prompt}" in result.output, result.output
    # a log that ends with a transaction's marker (no record at its last offset): a newcomer folds past it
    from rollout_stream.codec.admission import Resolved, encode_admission
    from rollout_stream.kafka import client_for
    from rollout_stream.names import admission_topic

    producer = client_for(Connection(kafka_bootstrap)).producer(
        client_id="marker", max_record_bytes=1 << 20, transactional_id=f"marker-{topics.input}")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_in_transaction(admission_topic(topics.output),
                                 encode_admission(Resolved(keys=[], reason="prompt_attempts_exhausted")),
                                 partition=0)
    producer.commit_transaction()
    producer.close()
    result = CliRunner().invoke(app, ["prompts", "--bootstrap-servers", kafka_bootstrap, "--output-topic",
                                      topics.output, "--json"])
    assert result.exit_code == 0, result.output
    (toy,) = json.loads(result.output)["sources"]
    assert (toy["epochs"][0]["trained"], toy["epochs"][0]["exhausted"]) == (3, 1)


CRASHING_ON_A_ROW = """
import json, sys
from rollout_stream.codec import Sample
from rollout_stream.prompts import PromptSource
bootstrap, topic, output, trainer, dead, rows = sys.argv[1:7]
with PromptSource(bootstrap, json.loads(rows), name="toy", trainer_group_id=trainer, topic=topic,
                  train_data_topic=output, epochs=1, max_attempts=2, dead_letter_topic=dead) as source:
    while True:
        lease = source.take(timeout=30)
        prompt = lease.row["prompt"]  # the poison row has none: KeyError, out of the with block
        source.publish(lease, [Sample(group_index=0, index=i, rollout_id=i, reward=float(i))
                               for i in range(2)])
"""


@pytest.mark.kafka(timeout=150)
def test_a_row_that_crashes_every_process_is_exhausted_and_the_run_trains_the_rest(
        kafka_bootstrap: str) -> None:
    """The first row of the epoch's order makes every rollout process raise: each crash ends its attempt as
    failed with the KeyError in the log, the second exhausts it and it is dead-lettered with both errors; the
    next process takes the other prompts, which train. No crash loop."""
    from rollout_stream.core.prompts import epoch_order

    topics = new_topics(kafka_bootstrap, partitions=2, prefix="poison")
    trainer = f"trainer-{topics.input}"
    poison = epoch_order(len(ROWS), 0, 0)[0]
    rows = [{"oops": "no prompt"} if i == poison else row for i, row in enumerate(ROWS)]
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)
    with running_worker(config):
        for _ in range(2):
            crashed = subprocess.run([sys.executable, "-c", CRASHING_ON_A_ROW, kafka_bootstrap, topics.input,
                                      topics.output, trainer, topics.dead_letter, json.dumps(rows)],
                                     capture_output=True, text=True, timeout=60)
            assert crashed.returncode == 1 and "KeyError: 'prompt'" in crashed.stderr, crashed.stderr
        reader = TrainDataReader(kafka_bootstrap, topics.output, trainer, groups_per_batch=3,
                                 start="earliest")
        main = PromptSource(kafka_bootstrap, rows, name="toy", trainer_group_id=trainer, topic=topics.input,
                            train_data_topic=topics.output, epochs=1, max_attempts=2,
                            producer_id=f"rollout-0-{topics.input}", dead_letter_topic=topics.dead_letter)
        try:
            leases = [main.take(timeout=30) for _ in range(3)]
            assert poison not in {x.key.prompt for x in leases}
            for lease in leases:
                main.publish(lease, group(lease.row))
            assert reader.next_batch(timeout=30) is not None
            reader.commit()
            wait_until(lambda: [(s.trained, s.exhausted, s.reissued_by) for s in main.status()]
                       == [(3, 1, {"failed": 1})], timeout=30, what="three trained, the poison row exhausted")
            with pytest.raises(SourceFinished):
                main.take(timeout=10)
            wait_until(lambda: not main.exhausted.pending(), timeout=30, what="its record written")
        finally:
            main.close()
            reader.close()
        dead = read_topic(kafka_bootstrap, topics.dead_letter, min_count=1, settle=1.0)
    [record] = [r for r in dead if r.headers.get("x-dlq-reason") == "prompt_attempts_exhausted"]
    history = json.loads(record.value or b"")
    assert [(x["ended"], x["error"]) for x in history["attempts"]] == [("failed", "KeyError: 'prompt'")] * 2


@pytest.mark.kafka(timeout=120)
@pytest.mark.any_client
def test_without_pacing_a_group_skipped_stale_is_re_issued_and_its_prompt_trains_later(
        kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    """Pacing off: four groups generated at weight version 0 reach a trainer already at version 5 with a
    staleness bound of 0. The committed batch skips them; each prompt is handed out again, trains in a later
    batch, and the log counts the re-issues by why (`skipped`)."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="stale")
    trainer = f"trainer-{topics.input}"
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)
    rows = [{"prompt": f"q{i}"} for i in range(6)]

    def versioned(version: int) -> list[Sample]:
        return [Sample(group_index=0, index=i, rollout_id=i, reward=float(i), weight_versions=[str(version)])
                for i in range(2)]

    with running_worker(config):
        main = PromptSource(kafka_bootstrap, rows, name="toy", trainer_group_id=trainer, topic=topics.input,
                            train_data_topic=topics.output, producer_id=f"rollout-0-{topics.input}", epochs=1)
        reader = TrainDataReader(kafka_bootstrap, topics.output, trainer, groups_per_batch=2,
                                 max_weight_staleness=0, start="earliest")
        try:
            reader.set_weight_version(5)
            old = [main.take(weight_version=0, timeout=30) for _ in range(4)]
            for lease in old:
                main.publish(lease, versioned(0))
            fresh = [main.take(weight_version=5, timeout=30) for _ in range(2)]
            for lease in fresh:
                main.publish(lease, versioned(5))
            caplog.set_level(logging.INFO, logger="rollout_stream.reader")
            first = reader.next_batch(timeout=30)
            assert first is not None and first.skipped_stale == 4
            [line] = [r for r in caplog.records if getattr(r, "event", None) == "batch.skipped_stale"]
            assert {k: line.fields[k] for k in ("groups", "oldest_version", "weight_version")} == {  # type: ignore[attr-defined]
                "groups": 4, "oldest_version": 0, "weight_version": 5}
            assert sorted(g.key for g in first.groups) == sorted(str(x.key) for x in fresh)
            reader.commit()
            again = [main.take(weight_version=5, timeout=30) for _ in range(4)]  # the skipped ones, again
            assert sorted((x.key.prompt, x.key.attempt) for x in again) == sorted(
                (x.key.prompt, 2) for x in old)
            for lease in again:
                main.publish(lease, versioned(5))
            trained = []
            for _ in range(2):
                batch = reader.next_batch(timeout=30)
                assert batch is not None and batch.skipped_stale == 0
                trained += [g.key for g in batch.groups]
                reader.commit()
            assert sorted(trained) == sorted(str(x.key) for x in again)
            wait_until(lambda: [(s.trained, s.reissued, s.reissued_by) for s in main.status()]
                       == [(6, 4, {"skipped": 4})], timeout=30, what="six trained, four re-issued (skipped)")
        finally:
            main.close()
            reader.close()
