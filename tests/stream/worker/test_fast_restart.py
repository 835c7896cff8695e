"""Static membership (docs/spec.md §4.5 "fast recovery"): a worker killed with SIGKILL and restarted with the
same instance id gets its partitions back at once, not after the 45 s session timeout of its dead self."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from rollout_stream.ops.synth import FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from tests.stream.helpers import new_topics, read_topic, spawn_worker

RESTORED_WITHIN_S = 5.0


def wait_for(log: Path, pattern: str, timeout: float, after: int = 0) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        found = re.search(pattern, text[after:])
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"no {pattern!r} in {log.name} within {timeout}s:\n{log.read_text()[-3000:]}")


def send_groups(bootstrap: str, topic: str, start: int, count: int) -> int:
    plan = SynthPlan(
        group_size=2, max_siblings=1, tokens=4, faults=FaultRates(), seed=start, run_id="restart"
    )
    records = 0
    with RolloutProducer(bootstrap, topic=topic) as producer:
        for recs, _ in plan_groups(plan, count, start_index=start):
            for r in recs:
                producer.send_raw(r.key, r.value)
                records += 1
    return records


@pytest.mark.kafka(timeout=150)
def test_a_killed_worker_restarted_with_its_instance_id_is_back_within_seconds(kafka_bootstrap, kafka_client,
                                                                                tmp_path):
    topics = new_topics(kafka_bootstrap, partitions=3, prefix="restart")
    group = f"restart-{topics.input}"
    args = ("--instance-id", "w-restart", "--session-timeout", "45", "--commit-interval", "0.1")
    log1, log2 = tmp_path / "first.log", tmp_path / "second.log"
    first = spawn_worker(kafka_bootstrap, topics, group, *args, log_path=log1)
    try:
        wait_for(log1, r"event=partitions\.assigned .*partitions=0,1,2", 60)
        sent = send_groups(kafka_bootstrap, topics.input, 0, 30)
        assert len(read_topic(kafka_bootstrap, topics.output, min_count=sent, timeout=60)) == sent
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        killed = time.monotonic()
        second = spawn_worker(kafka_bootstrap, topics, group, *args, log_path=log2)
        try:
            wait_for(log2, r"event=worker\.started", 60)
            started = time.monotonic()
            for p in range(3):
                wait_for(log2, rf"event=partition\.restored partition={p} ", 60)
            restored = time.monotonic()
            print(f"{kafka_client}: restored {restored - started:.1f}s after worker.started, "
                  f"{restored - killed:.1f}s after the kill")
            assert restored - started < RESTORED_WITHIN_S, (
                f"{kafka_client}: partitions back {restored - started:.1f}s after start "
                "(session timeout 45 s)")
            more = send_groups(kafka_bootstrap, topics.input, 30, 10)
            out = read_topic(kafka_bootstrap, topics.output, min_count=sent + more, timeout=60)
            assert len(out) == sent + more
        finally:
            second.terminate()
            second.wait(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()


# Against the 45 s session timeout: without --leave-group-on-stop the other took over 43.2 s after the stop
LEFT_WITHIN_S = 10.0


@pytest.mark.kafka(timeout=180)
def test_a_worker_stopped_for_good_leaves_the_group_and_the_other_takes_its_partitions_within_seconds(
    kafka_bootstrap, kafka_client, tmp_path
):
    topics = new_topics(kafka_bootstrap, partitions=3, prefix="leave")
    group = f"leave-{topics.input}"
    common = ("--session-timeout", "45", "--commit-interval", "0.1")
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    a = spawn_worker(kafka_bootstrap, topics, group, "--instance-id", "w-a", *common, log_path=log_a)
    b = None
    try:
        wait_for(log_a, r"event=partitions\.assigned .*partitions=0,1,2", 60)
        b = spawn_worker(kafka_bootstrap, topics, group, "--instance-id", "w-b", "--leave-group-on-stop",
                         *common, log_path=log_b)
        wait_for(log_b, r"event=partitions\.assigned .*partitions=\d", 60)  # the group is split between them
        sent = send_groups(kafka_bootstrap, topics.input, 0, 30)
        assert len(read_topic(kafka_bootstrap, topics.output, min_count=sent, timeout=60)) == sent

        after = len(log_a.read_text())
        b.send_signal(signal.SIGTERM)
        assert b.wait(timeout=60) == 0
        stopped = time.monotonic()
        left = wait_for(log_b, r"event=group\.left .*removed=(\w+)", 5)
        assert left.group(1) == "True", log_b.read_text()[-2000:]
        wait_for(log_a, r"event=partitions\.assigned .*partitions=0,1,2", 40, after=after)
        took = time.monotonic() - stopped
        print(f"{kafka_client}: all partitions back on the other worker {took:.1f}s after the stop")
        assert took < LEFT_WITHIN_S, f"{kafka_client}: the other worker took over after {took:.1f}s"

        more = send_groups(kafka_bootstrap, topics.input, 30, 10)  # the one left publishes everything, once
        out = read_topic(kafka_bootstrap, topics.output, min_count=sent + more, timeout=60)
        assert len(out) == sent + more
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
