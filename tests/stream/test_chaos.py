"""Chaos: >= 1,000 groups with every kind of bad input while workers are SIGKILLed, restarted, joined and
left. Afterwards a read_committed reader sees every expected outcome exactly once, values equal to core."""

from __future__ import annotations

import random
import signal
import threading
import time

import pytest

from stream.producer import RolloutProducer
from stream.tools.synth import Expected, FaultRates, SynthPlan, plan_groups
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

    def produce() -> None:
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as p:
            for i, records in enumerate(batches):
                for r in records:
                    p.send_raw(r.key, r.value)
                if i % 25 == 24:
                    p.flush()
                    time.sleep(0.4)  # spread the input over the kills (~16 s in all)

    args = ("--group-timeout", "4", "--commit-interval", "0.2", "--session-timeout", "6")
    logs: list = []

    def start(instance: str):
        logs.append(tmp_path / f"{instance}-{len(logs)}.log")
        return spawn_worker(
            kafka_bootstrap, topics, group_id, *args, "--instance-id", instance, log_path=logs[-1]
        )

    def wait_working(log_file, timeout: float = 30.0) -> None:
        """Until this instance has restored its partitions and is processing."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log_file.exists() and "event=partition.restored" in log_file.read_text():
                return
            time.sleep(0.1)
        raise AssertionError(f"worker never got to work: {log_file.read_text()[-2000:]}")

    producer = threading.Thread(target=produce)
    worker = start("w1")
    producer.start()
    kills = 0
    try:
        for _ in range(3):  # SIGKILL at random moments while it works; restart under the same instance id
            wait_working(logs[-1])
            time.sleep(rng.uniform(0.5, 2.5))
            worker.send_signal(signal.SIGKILL)
            worker.wait(10)
            kills += 1
            worker = start("w1")
        wait_working(logs[-1])
        second = start("w2")  # a second worker joins mid-stream...
        wait_working(logs[-1])
        time.sleep(rng.uniform(1, 3))
        second.send_signal(signal.SIGTERM)  # ...and leaves
        assert second.wait(40) == 0
        producer.join(60)

        total = expected.published_samples
        dead = sum(expected.dead_letters.values())
        train = train_samples(
            read_topic(kafka_bootstrap, topics.output, min_count=total, timeout=90, settle=3)
        )
        dlq = read_topic(kafka_bootstrap, topics.dead_letter, min_count=dead, timeout=30, settle=2)
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
