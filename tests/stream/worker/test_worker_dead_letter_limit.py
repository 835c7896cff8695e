"""The dead-letter limit on the real broker: input that is mostly refused stops the worker (exit 3, one
line) after it committed what came before, instead of draining the input into the dead-letter topic; a
restart with the limit off resumes exactly where it stopped. And the limit's flags, checked at start."""

from __future__ import annotations

import signal
import threading

import pytest
from kafka import KafkaConsumer, TopicPartition
from typer.testing import CliRunner

from rollout_stream.cli import app
from rollout_stream.clients import Connection
from rollout_stream.codec import Sample
from rollout_stream.config import ConfigError, WorkerConfig
from rollout_stream.producer import RolloutProducer
from rollout_stream.worker import DeadLetterLimitExceeded, Worker
from tests.stream.helpers import new_topics, read_topic, spawn_worker, train_samples, wait_until

# any client: the dead-letter limit is the worker's rule
pytestmark = pytest.mark.any_client


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--max-dead-letter-ratio", "1.5"], {},
         "--max-dead-letter-ratio must be between 0 and 1 (1: never stop), got 1.5"),
        ([], {"ROLLOUT_STREAM_MAX_DEAD_LETTER_RATIO": "-0.1"},
         "--max-dead-letter-ratio must be between 0 and 1 (1: never stop), got -0.1"),
        (["--dead-letter-window", "0"], {},
         "--dead-letter-window must be between 1 and 1000000 records, got 0"),
        ([], {"ROLLOUT_STREAM_DEAD_LETTER_WINDOW": "2000000"},
         "--dead-letter-window must be between 1 and 1000000 records, got 2000000"),
    ],
)
def test_a_limit_out_of_range_is_refused_at_start_naming_its_flag(args, env, message):
    result = CliRunner().invoke(app, ["run", "--bootstrap-servers", "127.0.0.1:1", *args],
                                env={"COLUMNS": "200", "KAFKA_BOOTSTRAP_SERVERS": None, **env})
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"error: {message}"]


def test_the_defaults_and_the_limit_they_make():
    config = WorkerConfig()
    assert (config.max_dead_letter_ratio, config.dead_letter_window) == (0.4, 10_000)
    assert config.dead_letter_limit.enabled
    assert not WorkerConfig(max_dead_letter_ratio=1.0).dead_letter_limit.enabled
    with pytest.raises(ConfigError):
        WorkerConfig(max_dead_letter_ratio=float("nan"))


def sample(gi: int, rid: int, *, size: int | None, run: str) -> Sample:
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=float(rid), group_size=size, run_id=run,
                  tokens=[1, 2, 3, rid], response_length=2, loss_mask=[1, 1], rollout_log_probs=[-0.5, -0.25])


def committed_offset(bootstrap: str, group_id: str, topic: str) -> int | None:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False)
    try:
        return consumer.committed(TopicPartition(topic, 0))
    finally:
        consumer.close()


def dead_letter_offsets(reads) -> list[tuple[str, int]]:
    return sorted((r.headers["x-dlq-reason"], int(r.headers["x-original-offset"])) for r in reads)


@pytest.mark.kafka(timeout=180)
def test_mostly_bad_input_stops_the_cli_with_one_line_after_committing_what_came_before(kafka_bootstrap,
                                                                                      tmp_path):
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="dlqlimit")
    group_id = f"g-{topics.input}"
    with RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
        for gi in range(10):  # offsets 0-19: ten good groups of two
            for rid in range(2):
                producer.send(sample(gi, rid, size=2, run="lim"))
        for i in range(30):  # offsets 20-49: a producer deploy that writes garbage
            producer.send_raw(b"lim/bad", b"\xc1 not msgpack %d" % i)
        for gi in range(100, 105):  # offsets 50-59: good again
            for rid in range(2):
                producer.send(sample(gi, rid, size=2, run="lim"))
        producer.flush()

    # A window of 20 holds the 20 published samples; the 11th decode error (offset 30) makes 11 of the last
    # 20 dead-lettered, more than half. The bound comes from the environment, the window from the flag.
    log = tmp_path / "worker.log"
    worker = spawn_worker(kafka_bootstrap, topics, group_id, "--dead-letter-window", "20", log_path=log,
                          env={"ROLLOUT_STREAM_MAX_DEAD_LETTER_RATIO": "0.5"})
    try:
        rc = worker.wait(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
    lines = log.read_text().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert rc == 3, "\n".join(lines[-20:])
    assert errors == [lines[-1]], "\n".join(lines[-20:])  # one error line, and the last thing said
    assert errors[0].startswith(
        "error: dead-letter limit: 11 of the last 20 resolved input records were dead-lettered (55.0%: "
        f"decode_error 11), more than the limit of 50%; stopped rather than drain {topics.input!r} into "
        f"{topics.dead_letter!r}, with everything before this point committed."), errors[0]
    assert "--max-dead-letter-ratio 1 never stops" in errors[0]
    assert any(" event=dead_letter.limit_exceeded " in line and "dead_lettered=11" in line for line in lines)

    # Accounted: offsets 0-30 are committed, each published or dead-lettered once; 31 onwards are untouched.
    assert committed_offset(kafka_bootstrap, group_id, topics.input) == 31
    assert len(train_samples(read_topic(kafka_bootstrap, topics.output, min_count=20))) == 20
    assert dead_letter_offsets(read_topic(kafka_bootstrap, topics.dead_letter, min_count=11)) == [
        ("decode_error", offset) for offset in range(20, 31)]

    # Once the cause is understood: the same group resumes at offset 31 and nothing is done twice.
    worker = spawn_worker(kafka_bootstrap, topics, group_id, "--max-dead-letter-ratio", "1", log_path=log)
    try:
        wait_until(lambda: committed_offset(kafka_bootstrap, group_id, topics.input) == 60, 90,
                   "the rest of the input committed")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
    assert len(train_samples(read_topic(kafka_bootstrap, topics.output, min_count=30))) == 30
    assert dead_letter_offsets(read_topic(kafka_bootstrap, topics.dead_letter, min_count=30)) == [
        ("decode_error", offset) for offset in range(20, 50)]


@pytest.mark.kafka(timeout=180)
def test_a_wrong_group_size_stops_the_worker_at_the_window_that_proves_it(kafka_bootstrap):
    """Groups of four rollouts that leave group_size unset, read with --group-size 2: every group publishes
    two samples and dead-letters two as late members. Half is more than 40 %: stop after 20 records."""
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="dlqsize")
    with RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
        for gi in range(8):  # offsets 0-31
            for rid in range(4):
                producer.send(sample(gi, rid, size=None, run="size"))
        producer.flush()
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          group_size=2, commit_interval_s=0.2,
                          max_dead_letter_ratio=0.4, dead_letter_window=20)
    worker = Worker(config, Connection(kafka_bootstrap))
    raised: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # examined in the test thread
            raised.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=90)
    if thread.is_alive():
        worker.request_stop()
        thread.join(timeout=30)
        pytest.fail("the worker did not stop by itself within 90 s")

    assert len(raised) == 1 and isinstance(raised[0], DeadLetterLimitExceeded), raised
    verdict = raised[0].verdict
    assert (verdict.dead_lettered, verdict.resolved, verdict.by_reason) == (10, 20, (("late_member", 10),))
    assert worker.stats.records_in == 20  # the records after the 20th were never taken
    assert worker.stats.samples_published == 10
    assert committed_offset(kafka_bootstrap, config.group_id, topics.input) == 20
    published = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=10))
    assert sorted((t.sample.group_index, t.sample.index) for t in published) == [
        (gi, rid) for gi in range(5) for rid in range(2)]
    assert dead_letter_offsets(read_topic(kafka_bootstrap, topics.dead_letter, min_count=10)) == [
        ("late_member", 4 * gi + rid) for gi in range(5) for rid in (2, 3)]
