"""Zombie fencing (docs/spec.md §4.5, KIP-447): a worker frozen (SIGSTOP) with an open transaction loses its
partitions to a second worker; when it thaws it must not commit anything for them. A read_committed reader
then sees every outcome exactly once."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest

from rollout_stream.ops.synth import Expected, FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from tests.stream.helpers import assert_exactly_once, new_topics, read_topic, spawn_worker, train_samples

pytestmark = pytest.mark.kafka(timeout=150)

PARTITIONS = 3


def wait_log(path: Path, pattern: str, timeout: float, count: int = 1) -> list[re.Match]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        found = list(re.finditer(pattern, text))
        if len(found) >= count:
            return found
        time.sleep(0.1)
    tail = path.read_text()[-3000:]
    raise AssertionError(f"{path.name}: no {count} x {pattern!r} within {timeout}s:\n{tail}")


def last_published(path: Path, *, uncommitted: bool = False) -> int:
    """Groups published as of the last progress line: committed, or with `uncommitted` also those in the
    open transaction."""
    found = re.findall(r"event=progress groups_published=(\d+) groups_uncommitted=(\d+)", path.read_text())
    if not found:
        return 0
    committed, pending = map(int, found[-1])
    return committed + pending if uncommitted else committed


def test_a_frozen_worker_cannot_commit_after_its_partitions_moved(kafka_bootstrap, tmp_path):
    topics = new_topics(kafka_bootstrap, partitions=PARTITIONS, prefix="fence")
    group_id = f"fence-{topics.input}"
    # Faults that resolve without waiting for a timeout, so each group's outcome is known in advance.
    faults = FaultRates(malformed=0.05, invalid=0.05, shared_reward=0.05, conflicting_duplicate=0.05,
                        late=0.05, duplicate=0.05)
    plan = SynthPlan(group_size=4, max_siblings=2, tokens=8, faults=faults, seed=7, run_id="fence")
    expected = Expected()
    groups = []
    for records, exp in plan_groups(plan, 150):
        expected.add(exp)
        groups.append(records)
    # `split`: half of each group before the freeze, half after.
    first, split, last = groups[:60], groups[60:80], groups[80:]
    published_first = sum(exp.published_groups for _, exp in plan_groups(plan, 60))

    common = ("--session-timeout", "6", "--group-timeout", "120", "--progress-interval", "1")
    log_a, log_b = tmp_path / "a.log", tmp_path / "b.log"
    # A commits rarely: when it is frozen, its transaction holds published groups that are not committed.
    a = spawn_worker(kafka_bootstrap, topics, group_id, *common, "--instance-id", "zombie-a",
                     "--commit-interval", "30", "--commit-max-records", "100000", log_path=log_a)
    b = None
    a_after, frozen_s = "", 0.0
    try:
        wait_log(log_a, r"event=partition\.restored", 30, count=PARTITIONS)
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as p:
            for records in first:
                for r in records:
                    p.send_raw(r.key, r.value)
            for records in split:
                for r in records[: len(records) // 2]:
                    p.send_raw(r.key, r.value)
        deadline = time.monotonic() + 20
        while last_published(log_a, uncommitted=True) < published_first and time.monotonic() < deadline:
            time.sleep(0.2)
        assert last_published(log_a, uncommitted=True) >= published_first, log_a.read_text()[-2000:]
        a.send_signal(signal.SIGSTOP)  # frozen with an open transaction and open windows
        frozen_at = time.monotonic()

        b = spawn_worker(kafka_bootstrap, topics, group_id, *common, "--instance-id", "successor-b",
                         "--commit-interval", "0.2", log_path=log_b)
        # A's session (6 s) expires: B gets every partition and rebuilds their windows from the last commit.
        wait_log(log_b, r"event=partitions\.assigned topic=\S+ partitions=0,1,2", 40)
        wait_log(log_b, r"event=partition\.restored", 30, count=PARTITIONS)
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as p:
            for records in split:
                for r in records[len(records) // 2:]:
                    p.send_raw(r.key, r.value)
            for records in last:
                for r in records:
                    p.send_raw(r.key, r.value)
        deadline = time.monotonic() + 30
        while last_published(log_b) < expected.published_groups and time.monotonic() < deadline:
            time.sleep(0.2)
        assert last_published(log_b) == expected.published_groups, log_b.read_text()[-3000:]
        frozen_s = time.monotonic() - frozen_at

        a_before = log_a.read_text()
        a.send_signal(signal.SIGCONT)  # the zombie wakes up with its stale transaction and windows
        # It must find out that it lost its partitions, abort, and rejoin (then it shares them with B).
        wait_log(log_a, r"event=(partitions\.lost|commit\.aborted|commit\.on_revoke_aborted)", 30)
        wait_log(log_a, r"event=partitions\.assigned", 30, count=2)
        time.sleep(3)  # both work on: any stale commit would land now
        a_after = log_a.read_text()[len(a_before):]

        total, dead = expected.published_samples, sum(expected.dead_letters.values())
        train = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=total, timeout=60,
                                         settle=3))
        dlq = read_topic(kafka_bootstrap, topics.dead_letter, min_count=dead, timeout=30, settle=2)
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        rcs = [proc.wait(40) for proc in (a, b) if proc is not None]
        print(f"worker A after SIGCONT (frozen {frozen_s:.1f} s):\n{a_after}")
    assert rcs == [0, 0]
    # A's stale transaction never committed: every source coordinate appears exactly once.
    assert_exactly_once(train, dlq, expected)
    assert re.search(r"event=(partitions\.lost|commit\.aborted|transaction\.aborted)", a_after), a_after
