"""Bounded memory (docs/spec.md §4.5): at the open-group cap the worker pauses fetching, loses nothing and
still publishes every group; a single group larger than the byte cap is dead-lettered whole as
group_too_large."""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.config import WorkerConfig
from rollout_stream.core import RewardConfig, post_process_rewards
from rollout_stream.ops.synth import SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from tests.stream.helpers import new_topics, read_topic, running_worker, train_samples, wait_until

pytestmark = pytest.mark.kafka(timeout=90)


class _Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list[tuple[str, dict]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(
            (getattr(record, "event", record.getMessage()), dict(getattr(record, "fields", {})))
        )

    def named(self, name: str) -> list[dict]:
        return [f for e, f in self.events if e == name]


@contextmanager
def worker_events() -> Iterator[_Events]:
    """The worker's structured events, whatever logging configuration an earlier test left behind."""
    logger = logging.getLogger("rollout_stream.worker")
    handler, level = _Events(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_at_the_open_group_cap_it_pauses_drops_nothing_and_publishes_every_group(kafka_bootstrap):
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="bp")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          max_open_groups=5, group_timeout_s=60.0, commit_interval_s=0.2)
    groups = 60
    plan = SynthPlan(group_size=4, max_siblings=2, tokens=16, seed=5, run_id="bp")
    planned = [records for records, _ in plan_groups(plan, groups)]
    total = sum(len(r) for r in planned)
    with worker_events() as events, running_worker(config) as worker:
        wait_until(lambda: worker.ready, 30, "partitions assigned")
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as p:
            # First the first member of every group: 60 groups open at once, twelve times the cap...
            for records in planned:
                p.send_raw(records[0].key, records[0].value)
            p.flush()
            wait_until(lambda: events.named("backpressure.paused"), 20, "the worker to pause")
            read_when_paused = worker.stats.records_in
            time.sleep(0.5)  # paused: nothing is read, nothing is timed out
            # How many a poll hands over before the pause depends on the client's fetch timing.
            assert config.max_open_groups < read_when_paused <= groups
            assert worker.stats.records_in == read_when_paused and worker.stats.groups_published == 0
            # ...then the rest, member by member across the groups, in several waves.
            rest = [(i, r) for records in planned for i, r in enumerate(records) if i > 0]
            rest.sort(key=lambda x: x[0])
            for n, (_, r) in enumerate(rest):
                p.send_raw(r.key, r.value)
                if n % 40 == 39:
                    p.flush()
                    time.sleep(0.2)
        wait_until(lambda: worker.stats.records_in == total and worker.store.open_count() == 0, 30,
                   "every record read and every group closed")
        wait_until(lambda: worker.stats.commits > 0 and not worker.ledger.due(), 10, "the last commit")
    paused = events.named("backpressure.paused")
    assert paused[0]["open_windows"] > config.max_open_groups
    assert events.named("backpressure.overrun"), "a stalled pause must end by reading on"
    assert sum(worker.stats.dead_lettered.values()) == 0, worker.stats.dead_lettered
    assert worker.stats.groups_published == groups

    train = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=total, timeout=30))
    assert len(train) == total
    assert max(Counter((t.source_partition, t.source_offset) for t in train).values()) == 1
    by_group = defaultdict(list)
    for t in train:
        by_group[t.group_key].append(t)
    assert len(by_group) == groups
    for key, members in by_group.items():
        raw, values = post_process_rewards([m.sample for m in members], RewardConfig(),
                                           prompt_group_sizes=[len(members)])
        assert [m.reward for m in members] == values and [m.raw_reward for m in members] == raw, key
    assert read_topic(kafka_bootstrap, topics.dead_letter, timeout=3, settle=0.5) == []


def _sample(gi: int, rid: int, reward: float, ntokens: int) -> Sample:
    resp = ntokens // 2
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=4, run_id="big",
                  tokens=np.arange(ntokens, dtype="<i4") % 32000, response_length=resp,
                  loss_mask=np.ones(resp, dtype="u1"), rollout_log_probs=np.full(resp, -0.5, dtype="<f4"))


def test_a_group_larger_than_the_byte_cap_is_dead_lettered_whole_and_the_worker_goes_on(kafka_bootstrap):
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="toolarge")
    cap = 1 << 20  # --max-open-mib 1 (and records up to 1 MiB)
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          max_record_bytes=cap, max_open_bytes=cap, group_timeout_s=60.0,
                          commit_interval_s=0.2)
    big = [_sample(0, r, float(r), 100_000) for r in range(4)]  # ~0.5 MB each: 2 MB for the group
    small = [_sample(1, r, float(r), 8) for r in range(4)]
    interleaved = [x for pair in zip(big, small, strict=True) for x in pair]
    with worker_events() as events, running_worker(config) as worker:
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as p:
            futures = [p.send_raw(group_key(s), encode_sample(s)) for s in interleaved]
            p.flush()
        offsets = [f.get(10).offset for f in futures]
        wait_until(lambda: worker.stats.records_in == 8 and worker.stats.groups_published == 1, 30,
                   "every record read")
        wait_until(lambda: not worker.ledger.due() and worker.stats.commits > 0, 10, "the last commit")
        assert not worker.stopping
    assert worker.stats.dead_lettered == Counter({"group_too_large": 4})
    assert events.named("dead_letter")[0]["reason"] == "group_too_large"
    dlq = read_topic(kafka_bootstrap, topics.dead_letter, min_count=4, timeout=30)
    assert sorted(int(r.headers["x-original-offset"]) for r in dlq) == offsets[0::2]
    assert {r.headers["x-dlq-reason"] for r in dlq} == {"group_too_large"}
    assert [r.value for r in sorted(dlq, key=lambda r: int(r.headers["x-original-offset"]))] == \
        [encode_sample(s) for s in big]
    train = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=4, timeout=30))
    assert sorted(t.source_offset for t in train) == offsets[1::2]
