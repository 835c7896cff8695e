"""Broker faults (docs/spec.md §4.5): the worker survives its broker stopping and starting again (same port,
same data): it backs off instead of spinning, says so in its log, and afterwards every outcome is there
exactly once."""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from rollout_stream.broker.errors import PortInUse
from rollout_stream.broker.local import LocalBroker
from rollout_stream.broker.process import free_port
from rollout_stream.ops.synth import Expected, FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from tests.stream.helpers import new_topics, read_topic, spawn_worker, train_samples, wait_until

pytestmark = [pytest.mark.kafka(timeout=180), pytest.mark.every_client]

OUTAGE_S = 6.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_count(path: Path, pattern: str) -> int:
    return len(re.findall(pattern, path.read_text())) if path.exists() else 0


@pytest.fixture
def own_broker(tmp_path):
    """A broker of this test's own (the session broker is never stopped)."""
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
        broker.stop(timeout=20)


def produce(bootstrap: str, topic: str, groups) -> None:
    with RolloutProducer(bootstrap, topic=topic) as p:
        for records in groups:
            for r in records:
                p.send_raw(r.key, r.value)


def test_worker_survives_a_broker_stop_and_start_without_loss_or_duplicates(own_broker, tmp_path):
    bootstrap = f"127.0.0.1:{own_broker.port}"
    topics = new_topics(bootstrap, partitions=3, prefix="outage")
    faults = FaultRates(malformed=0.05, invalid=0.05, shared_reward=0.05, conflicting_duplicate=0.05,
                        late=0.05, duplicate=0.05)
    plan = SynthPlan(group_size=4, max_siblings=2, tokens=8, faults=faults, seed=3, run_id="outage")
    expected = Expected()
    groups = []
    for records, exp in plan_groups(plan, 200):
        expected.add(exp)
        groups.append(records)
    before, after = groups[:100], groups[100:]
    published_before = sum(exp.published_groups for _, exp in plan_groups(plan, 100))

    log = tmp_path / "worker.log"
    worker = spawn_worker(bootstrap, topics, f"outage-{topics.input}", "--instance-id", "w1",
                          "--group-timeout", "120", "--commit-interval", "0.2", "--progress-interval", "1",
                          log_path=log)
    busy, outage_log = float("nan"), []
    try:
        wait_until(lambda: log_count(log, r"event=partition\.restored") == 3, 40, "the worker to start")
        produce(bootstrap, topics.input, before)
        wait_until(lambda: f"groups_published={published_before} " in log.read_text(), 30, "the first half")
        time.sleep(1.0)  # let a commit land after the last output

        lines_before = len(log.read_text().splitlines())
        assert own_broker.stop(timeout=20) in ("terminated", "killed")
        cpu0, t0 = cpu_seconds(worker.pid), time.monotonic()
        time.sleep(OUTAGE_S)
        cpu1, t1 = cpu_seconds(worker.pid), time.monotonic()
        assert worker.poll() is None, f"the worker exited during the outage:\n{log.read_text()[-3000:]}"
        busy = (cpu1 - cpu0) / (t1 - t0)
        outage_log = log.read_text().splitlines()[lines_before:]

        own_broker.start(timeout=90)
        produce(bootstrap, topics.input, after)
        wait_until(lambda: f"groups_published={expected.published_groups} " in log.read_text(), 60,
                   "every group after the restart")
        total, dead = expected.published_samples, sum(expected.dead_letters.values())
        train = train_samples(read_topic(bootstrap, topics.output, min_count=total, timeout=60, settle=3))
        dlq = read_topic(bootstrap, topics.dead_letter, min_count=dead, timeout=30, settle=2)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        rc = worker.wait(60)
        print(f"worker CPU during the {OUTAGE_S:g} s outage: {busy:.1%} of one core")
        print("worker log during the outage:\n" + "\n".join(outage_log))
    assert rc == 0, log.read_text()[-3000:]
    assert busy < 0.5, f"busy loop while the broker was down: {busy:.0%} of a core"
    assert any("event=broker.unreachable" in line for line in outage_log), "\n".join(outage_log)
    assert "event=broker.reconnected" in log.read_text()
    # No transactional call waited on a coordinator that had gone (the seam's bound replaces such a producer,
    # 15 s later): on librdkafka a re-bootstrap used to forget the coordinator's broker (librdkafka#5511).
    assert "TransactionHung" not in log.read_text(), log.read_text()[-3000:]

    sources = Counter((t.source_partition, t.source_offset) for t in train)
    assert max(sources.values()) == 1, "a train sample was published twice"
    assert len(train) == total
    dsources = Counter((r.headers["x-original-partition"], r.headers["x-original-offset"]) for r in dlq)
    assert max(dsources.values()) == 1, "a record was dead-lettered twice"
    assert Counter(r.headers["x-dlq-reason"] for r in dlq) == Counter(
        {str(k): v for k, v in expected.dead_letters.items()})
