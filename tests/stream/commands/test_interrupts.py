"""Ctrl-C says what happened: the CLI run as a real process and sent SIGINT.

While a command starts (modules loading), during `synth` (what was sent, and the expectation for exactly
that, checked against a real worker), and during `dlq replay` (where its cursor stopped; the next run
resumes there).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from rollout_stream.clients import Connection
from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.core.records import DeadLettered, InputRecord
from rollout_stream.kafka.kafka_python import raw_producer
from rollout_stream.ops.dlq import headers as H
from rollout_stream.ops.dlq.cursor import cursor_name
from rollout_stream.ops.dlq.selection import Selection
from rollout_stream.ops.synth import (
    FaultRates,
    SendProgress,
    SynthPlan,
    expect_records,
    interruption_summary,
    plan_group,
    plan_groups,
    send_groups,
)
from rollout_stream.worker.outputs import dead_letter_records
from tests.stream.helpers import read_topic, running_worker, wait_until

EXE = Path(sys.executable).with_name("rollout-stream")
STARTING = "rollout-stream: interrupted while starting; nothing was done"


def _default_sigint() -> None:
    # A child of a shell job without job control inherits an ignored SIGINT; these tests need Python's own.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "COLUMNS")}
    return subprocess.Popen(
        [str(EXE), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=_default_sigint,
    )


def interrupt(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return out, err


def wait_for_mapping(proc: subprocess.Popen[str], fragment: str, timeout: float = 30) -> None:
    """Until the process has loaded a shared library whose path contains `fragment` (it is importing)."""
    deadline = time.monotonic() + timeout
    maps = Path(f"/proc/{proc.pid}/maps")
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if fragment in maps.read_text():
                return
        except OSError:
            pass
        time.sleep(0.002)
    raise AssertionError(f"{fragment} never loaded")


# ---- start-up ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("synth", "--groups", "1"),
        ("dlq", "stats"),
        ("tail",),
        ("run",),
        ("lag",),
    ],
)
def test_ctrl_c_while_a_command_starts_is_one_line_and_exit_130(args):
    # Port 1: were the signal late, the command would fail to connect instead of starting anything.
    proc = spawn(*args, "--bootstrap-servers", "127.0.0.1:1")
    wait_for_mapping(proc, "_multiarray_umath")  # numpy: loaded half-way through the CLI's imports
    out, err = interrupt(proc)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert err.strip() == STARTING and out == ""


def test_ctrl_c_while_typer_builds_the_command_line(monkeypatch, capsys):
    import rollout_stream.cli

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(rollout_stream.cli, "app", interrupted)
    with pytest.raises(SystemExit) as exc:
        rollout_stream.cli.main()
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip() == STARTING


def test_importing_the_cli_leaves_sigint_as_it_was():
    code = (
        "import signal; before = signal.getsignal(signal.SIGINT); import rollout_stream.cli; "
        "assert signal.getsignal(signal.SIGINT) is before is signal.default_int_handler; print('ok')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, preexec_fn=_default_sigint
    )
    assert result.stdout.strip() == "ok", result.stderr


# ---- synth: pure parts ------------------------------------------------------------------------------

KINDS = [None, *FaultRates.__slots__]


@pytest.mark.parametrize("fault", KINDS)
@pytest.mark.parametrize("group_size", [1, 2, 4])
@pytest.mark.parametrize("max_siblings", [1, 3])
def test_the_expectation_of_every_planned_group_is_the_window_state_machines_verdict(
    fault, group_size, max_siblings
):
    """plan_group's hand-made expectation agrees with rollout_stream.core.windows fed the same records (which
    is what an interrupted synth uses for a group it cut short)."""
    import random

    faults = FaultRates(**{fault: 1.0}) if fault else FaultRates()
    plan = SynthPlan(group_size=group_size, max_siblings=max_siblings, tokens=8, faults=faults, run_id="x")
    for gi in range(12):
        records, expected = plan_group(plan, gi, random.Random(gi))
        assert expect_records(plan, records) == expected, (fault, gi)


def test_a_group_cut_short_is_incomplete_after_the_group_timeout():
    plan = SynthPlan(group_size=4, max_siblings=1, tokens=8, run_id="cut")
    records, _ = next(plan_groups(plan, 1))
    part = expect_records(plan, records[:3])
    assert (part.published_samples, part.records) == (0, 3)
    assert part.dead_letters == {R.INCOMPLETE_GROUP: 3} and part.due_after_group_timeout() == {
        "incomplete_group": 3
    }
    progress = SendProgress(plan)
    progress.begin(records)
    for r in records[:3]:
        progress.sent(r)
    assert interruption_summary(progress) == (
        "synth: interrupted after 3 record(s): 0 whole group(s) and 3 of the 4 records of group cut/0 "
        "(expect 3 incomplete_group after the worker's --group-timeout); the JSON on stdout is the "
        "expectation for what was sent"
    )
    assert (
        interruption_summary(SendProgress(plan))
        == "synth: interrupted before sending anything; nothing was sent"
    )


def test_sigint_stops_the_send_loop_between_records():
    """The handler only marks the request while a record is handed over: that record is counted."""
    # Python's own Ctrl-C handler, whatever an earlier in-process command (CliRunner) left installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        plan = SynthPlan(group_size=3, tokens=8, run_id="loop")
        progress = SendProgress(plan)
        sent: list[bytes] = []

        def send(key: bytes, value: bytes) -> None:
            sent.append(value)
            if len(sent) == 5:
                signal.raise_signal(signal.SIGINT)  # Ctrl-C while the fifth record is being sent

        with pytest.raises(KeyboardInterrupt):
            send_groups(send, plan, 10, progress)
        assert len(sent) == progress.records == 5
        assert progress.groups == 1 and len(progress.current) == 2 and progress.current_size == 3
        assert [r.value for r in progress.current] == sent[3:]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    finally:
        signal.signal(signal.SIGINT, previous)


# ---- synth on the broker ----------------------------------------------------------------------------


def topic_end(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return sum(consumer.end_offsets(tps).values())
    finally:
        consumer.close()


@pytest.mark.kafka(timeout=120)
def test_ctrl_c_during_synth_prints_what_was_sent_and_the_worker_meets_that_expectation(
    kafka_bootstrap, topic_factory
):
    names = TopicNames(
        topic_factory(1, prefix="int-in"),
        topic_factory(1, prefix="int-out"),
        topic_factory(1, prefix="int-dlq"),
    )
    proc = spawn(
        "synth",
        "--bootstrap-servers",
        kafka_bootstrap,
        "--input-topic",
        names.input,
        "--groups",
        "100000",
        "--rate",
        "60",
        "--group-size",
        "4",
        "--max-siblings",
        "2",
        "--incomplete-rate",
        "0.15",
        "--duplicate-rate",
        "0.15",
        "--shared-reward-rate",
        "0.1",
        "--run-id",
        "cut",
    )
    wait_until(lambda: topic_end(kafka_bootstrap, names.input) >= 30, 60, "synth to send 30 records")
    out, err = interrupt(proc)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    doc = json.loads(out)
    assert doc["interrupted"] is True and doc["groups_planned"] == 100000 and doc["run_id"] == "cut"
    assert re.search(rf"synth: interrupted after {doc['records']} record\(s\): \d+ whole group\(s\)", err), (
        err
    )
    assert "the JSON on stdout is the expectation for what was sent" in err
    # What it says it sent is what the topic holds, to the record, the group cut short included.
    sent = read_topic(kafka_bootstrap, names.input, min_count=doc["records"])
    assert len(sent) == doc["records"] >= 30
    by_group = Counter(r.key.decode() for r in sent)
    assert len(by_group) == doc["groups"]
    if doc["partial_group"] is not None:
        part = doc["partial_group"]
        assert by_group[part["group"]] == part["records_sent"] < part["records_planned"]
        assert f"of the {part['records_planned']} records of group {part['group']}" in err
    # ... and a worker makes of it exactly what the JSON says, incomplete groups after its timeout.
    assert doc["due_after_group_timeout"] == {
        k: v for k, v in doc["expected_dead_letters"].items() if k == "incomplete_group"
    }
    config = WorkerConfig(
        bootstrap_servers=kafka_bootstrap,
        topics=names,
        group_id=f"g-{names.input}",
        group_timeout_s=1.0,
        commit_interval_s=0.2,
        max_dead_letter_ratio=1.0,
    )
    with running_worker(config) as worker:

        def accounted() -> bool:
            st = worker.stats
            return (
                st.samples_published == doc["expected_published_samples"]
                and st.groups_published == doc["expected_published_groups"]
                and {str(k): v for k, v in st.dead_lettered.items() if v} == doc["expected_dead_letters"]
                and st.duplicates == doc["expected_duplicates"]
                and worker.store.open_count() == 0
            )

        wait_until(accounted, 60, f"the worker to produce {doc}")


@pytest.mark.kafka(timeout=60)
def test_ctrl_c_while_synth_waits_for_its_rate_stops_at_once(kafka_bootstrap, topic_factory):
    topic = topic_factory(1, prefix="int-slow")
    # The first record goes at once, the next one 100 s later: Ctrl-C comes during that wait.
    proc = spawn(
        "synth",
        "--bootstrap-servers",
        kafka_bootstrap,
        "--input-topic",
        topic,
        "--groups",
        "5",
        "--group-size",
        "3",
        "--rate",
        "0.01",
        "--run-id",
        "slow",
    )
    wait_until(lambda: topic_end(kafka_bootstrap, topic) >= 1, 60, "the first record")
    started = time.monotonic()
    out, err = interrupt(proc)
    assert proc.returncode == 130 and time.monotonic() - started < 10, (out, err)
    doc = json.loads(out)
    assert doc["records"] == 1 and doc["groups"] == 1
    assert doc["partial_group"] == {"group": "slow/0", "records_sent": 1, "records_planned": 3}
    assert doc["expected_dead_letters"] == doc["due_after_group_timeout"] == {"incomplete_group": 1}
    assert err.strip() == (
        "synth: interrupted after 1 record(s): 0 whole group(s) and 1 of the 3 records of group slow/0 "
        "(expect 1 incomplete_group after the worker's --group-timeout); the JSON on stdout is the "
        "expectation for what was sent"
    )
    assert topic_end(kafka_bootstrap, topic) == 1


# ---- dlq replay -------------------------------------------------------------------------------------


def dead_letters(topic: str, input_topic: str, n: int) -> list:
    out = []
    for i in range(n):
        sample = Sample(
            group_index=i,
            index=0,
            rollout_id=0,
            reward=1.0,
            group_size=2,
            run_id="rp",
            tokens=[1, 2, 3, 4],
            response_length=2,
            loss_mask=[1, 0],
            rollout_log_probs=[-0.5, -1.5],
        )
        src = InputRecord(input_topic, 0, i, 1_700_000_000_000 + i, group_key(sample), encode_sample(sample))
        out += dead_letter_records(DeadLettered(R.INCOMPLETE_GROUP, "test", f"rp/{i}", (src,), 0), topic)
    return out


def committed(bootstrap: str, group: str, topic: str) -> int | None:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return consumer.committed(TopicPartition(topic, 0))
    finally:
        consumer.close()


@pytest.mark.kafka(timeout=120)
def test_ctrl_c_during_dlq_replay_says_where_it_stopped_and_the_next_run_resumes(
    kafka_bootstrap, topic_factory
):
    input_topic, dlq = topic_factory(1, prefix="rpi-in"), topic_factory(1, prefix="rpi-dlq")
    producer = raw_producer(Connection(kafka_bootstrap))
    try:
        for r in dead_letters(dlq, input_topic, 200):
            producer.send(r.topic, key=r.key, value=r.value, headers=r.headers)
        producer.flush()
    finally:
        producer.close()
    args = ("dlq", "replay", "--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", dlq)
    cursor = cursor_name(Selection.build(now_ms=0), dlq, None)  # no filters: the same cursor as the command's
    proc = spawn(*args, "--rate", "40")  # 5 s for all: a transaction closes every second
    wait_until(
        lambda: (committed(kafka_bootstrap, cursor, dlq) or 0) >= 20, 60, "a committed replay transaction"
    )
    out, err = interrupt(proc)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err, err
    match = re.search(
        r"cursor (rollout-stream-replay-\w+) stands at partition 0 offset (\d+) \(the records "
        r"before it were replayed, once\); the same command resumes from there under replay id "
        r"(\w+)",
        err,
    )
    assert match and err.startswith("dlq replay: interrupted; the open transaction was aborted"), err
    assert match.group(1) == cursor
    stopped, replay_id = int(match.group(2)), match.group(3)
    assert 20 <= stopped < 200 and committed(kafka_bootstrap, cursor, dlq) == stopped
    replayed = read_topic(kafka_bootstrap, input_topic, min_count=stopped)
    assert len(replayed) == stopped  # exactly the records before the cursor; the aborted ones are not there
    assert {r.headers[H.REPLAY_ID] for r in replayed} == {replay_id}
    # The same command picks up there: every dead-letter record replayed once, under the same replay id.
    rest = subprocess.run(
        [str(EXE), *args, "--rate", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=90,
        env={k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"},
    )
    assert rest.returncode == 0, rest.stderr
    doc = json.loads(rest.stdout)
    assert doc["resumed"] and doc["replay_id"] == replay_id and doc["replayed"] == 200 - stopped
    everything = read_topic(kafka_bootstrap, input_topic, min_count=200)
    assert len(everything) == 200 and len({r.value for r in everything}) == 200


@pytest.mark.kafka(timeout=60)
def test_ctrl_c_during_a_dry_run_says_nothing_was_written(kafka_bootstrap, topic_factory, monkeypatch):
    from typer.testing import CliRunner

    import rollout_stream.commands.dlq as dlq_command
    from rollout_stream.cli import app

    dlq = topic_factory(1, prefix="rpd-dlq")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as SIGINT raises it, wherever the replay is

    monkeypatch.setattr(dlq_command, "run_replay", interrupted)
    result = CliRunner().invoke(
        app,
        [
            "dlq",
            "replay",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--dead-letter-topic",
            dlq,
            "--dry-run",
            "--json",
        ],
    )
    assert result.exit_code == 130
    assert result.stderr.strip() == "dlq replay: interrupted; dry run: nothing was written"
    assert json.loads(result.stdout) == {
        "interrupted": True,
        "dry_run": True,
        "cursor": cursor_name(Selection.build(now_ms=0), dlq, None),
    }
