"""TrainDataReader: group assembly, global order and resume as pure properties, then on the real broker."""

from __future__ import annotations

import random
import threading
from collections import Counter, defaultdict
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka import TopicPartition
from typer.testing import CliRunner

from rollout_stream.cli import app
from rollout_stream.clients import Connection
from rollout_stream.codec import Sample, TrainSample, encode_train_sample
from rollout_stream.config import WorkerConfig
from rollout_stream.core.assembly import GroupMerger, Mark, ReadMarks
from rollout_stream.kafka.kafka_python import raw_admin, raw_consumer, raw_producer
from rollout_stream.names import rank_group_id
from rollout_stream.ops.synth import Expected, FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from rollout_stream.reader import Batch, ReaderStats, TrainDataReader
from rollout_stream.reader.assembler import GroupAssembler
from tests.stream.helpers import new_topics, read_topic, running_worker, train_samples


# ---- data ----------------------------------------------------------------------------------------
def train_sample(g: int, rid: int, *, sib: int = 0, nsib: int = 1, rollouts: int = 2, samples: int = 2,
                 versions: Sequence[str] = ("1",), tokens: int = 12, reward: float = 0.0,
                 run: str = "r") -> TrainSample:
    s = Sample(group_index=g, index=rid, rollout_id=rid, tokens=np.arange(tokens, dtype="<i4") + g,
               response_length=3, reward=reward, loss_mask=np.ones(3, dtype="u1"),
               rollout_log_probs=np.full(3, -0.5, dtype="<f4"), weight_versions=list(versions),
               group_size=rollouts, sibling_count=nsib, sibling_index=sib, run_id=run)
    return TrainSample(
        sample=s, raw_reward=reward, reward=reward - 0.5, group_key=f"{run}/{g}",
        group_rollout_count=rollouts, group_sample_count=samples, group_mean=0.5, group_std=0.5,
        zero_variance=False,
        advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True, reward_key=None,
        source_topic="rollouts", source_partition=g % 7, source_offset=g * 1000 + (rid % 100) * 10 + sib,
    )


def make_group(g: int, rng: random.Random, *, versions: Sequence[str] = ("1",), run: str = "r",
               max_siblings: int = 3) -> list[TrainSample]:
    """A published group: 1..4 rollouts of 1..max_siblings samples each (siblings share a reward)."""
    rollouts = rng.randint(1, 4)
    shape = [(r, rng.randint(1, max_siblings)) for r in range(rollouts)]
    total = sum(n for _, n in shape)
    return [train_sample(g, g * 100 + r, sib=sib, nsib=nsib, rollouts=rollouts, samples=total,
                         versions=versions, tokens=rng.randint(4, 40), reward=float(r % 2), run=run)
            for r, nsib in shape for sib in range(nsib)]


def sid(s: TrainSample) -> tuple[str, int, int]:
    return (s.group_key, s.source_partition, s.source_offset)


def interleave(groups: Sequence[Sequence[object]], rng: random.Random, width: int = 3) -> list:
    """Every group's items in order, up to `width` groups in flight at once (several writers)."""
    cursors = [list(g) for g in groups if g]
    out: list = []
    while cursors:
        i = rng.randrange(min(width, len(cursors)))
        out.append(cursors[i].pop(0))
        if not cursors[i]:
            cursors.pop(i)
    return out


def publish(bootstrap: str, topic: str, records: Sequence[TrainSample | tuple[bytes, bytes]]) -> None:
    """Send train samples keyed by group (or raw (key, value) pairs) in this order."""
    producer = raw_producer(Connection(bootstrap), linger_ms=0)
    try:
        for rec in records:
            if isinstance(rec, TrainSample):
                producer.send(topic, key=rec.group_key.encode(), value=encode_train_sample(rec))
            else:
                producer.send(topic, key=rec[0], value=rec[1])
        producer.flush()
    finally:
        producer.close()


# ---- pure: assembly, merge and resume over simulated partitions ---------------------------------
Records = dict[int, list[tuple[int, int, bytes]]]  # partition → [(offset, timestamp, value)]


def simulated_topic(rng: random.Random, *, partitions: int = 3, groups: int = 10,
                    full_copies: bool = False) -> Records:
    """Groups spread over partitions, interleaved, with at-least-once damage: partial republications,
    duplicated records, garbage; offsets with gaps (transaction markers), non-decreasing timestamps."""
    per: dict[int, list[list[bytes]]] = defaultdict(list)
    for g in range(groups):
        values = [encode_train_sample(s) for s in make_group(g, rng)]
        copy: list[bytes] = []
        if len(values) > 1 and rng.random() < 0.2:
            copy += values[: rng.randint(1, len(values) - 1)]  # a publication cut short, then a full one
        copy += values
        if len(copy) > 1 and rng.random() < 0.2:
            i = rng.randrange(len(copy) - 1)
            copy.insert(i + 1, copy[i])  # one record twice, before the group completes
        if full_copies and rng.random() < 0.2:
            copy += values  # the whole group published again
        per[rng.randrange(partitions)].append(copy)
    out: Records = {}
    for p in range(partitions):
        items = interleave(per[p], rng)
        if rng.random() < 0.3:
            items.insert(rng.randrange(len(items) + 1), b"\xc1garbage")
        offset, ts, recs = rng.randint(0, 5), rng.randint(0, 50), []
        for value in items:
            recs.append((offset, ts, value))
            offset += rng.choice([1, 1, 1, 2, 3])
            ts += rng.choice([0, 0, 1, 7])
        out[p] = recs
    return out


def run_pure(records: Records, rng: random.Random, *, resume: dict[int, Mark] | None = None,
             stop_after: int | None = None) -> list[tuple[tuple[str, tuple[int, ...]], dict[int, Mark]]]:
    """What a reader emits when the partitions arrive in random poll chunks: [(group, snapshot after it)]."""
    resume = resume or {}
    marks, stats = ReadMarks(), ReaderStats()
    cursors: dict[int, int] = {}
    for p, recs in records.items():
        start = resume[p].offset if p in resume else (recs[0][0] if recs else 0)
        marks.start(p, start, resume.get(p))
        cursors[p] = next((i for i, r in enumerate(recs) if r[0] >= start), len(recs))
    assembler = GroupAssembler(marks, stats)
    merger = GroupMerger(sorted(records), idle_ms=0)
    out = []
    while True:
        live = [p for p in records if cursors[p] < len(records[p])]
        if live:
            p = rng.choice(live)
            n = rng.randint(1, 4)
            for offset, ts, value in records[p][cursors[p]: cursors[p] + n]:
                if p in resume and resume[p].skips(offset):
                    marks.read(p, offset, hold=False)
                    continue
                group = assembler.accept(p, offset, ts, value)
                if group is not None:
                    merger.push(group)
            cursors[p] += n
        # "Caught up" here means fully delivered: nothing can come later, so passing it is always safe.
        while (group := merger.pop(10**15, lambda q: cursors[q] >= len(records[q]))) is not None:
            marks.release(group.partition, group.offsets)
            out.append(((group.key, group.offsets), marks.snapshot()))
            if stop_after is not None and len(out) >= stop_after:
                return out
        if not live:
            return out


def through_metadata(snapshot: dict[int, Mark], batch: int = 7) -> dict[int, Mark]:
    marks = {}
    for p, m in snapshot.items():
        b, marks[p] = Mark.parse(m.offset, m.metadata(batch))
        assert b == batch and marks[p] == m
    return marks


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_global_order_is_a_function_of_the_records_not_of_fetch_timing(seed):
    rng = random.Random(seed)
    records = simulated_topic(rng, full_copies=True)
    first = [g for g, _ in run_pure(records, random.Random(seed + 1))]
    second = [g for g, _ in run_pure(records, random.Random(seed + 2))]
    assert first == second
    keys = [k for k, _ in first]
    assert len(keys) == len(set(keys)) == 10  # every group once: partial and full copies never yield twice


@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 10), st.integers(0, 10))
def test_restarting_from_any_snapshot_continues_the_sequence_exactly(seed, first_stop, second_stop):
    # Without complete second copies of a group: which of those are dropped depends on the reader's
    # memory of earlier groups, which a restart empties (docs/reader.md, "Duplicates").
    rng = random.Random(seed)
    records = simulated_topic(rng)
    full = [g for g, _ in run_pure(records, random.Random(seed + 1))]
    k = min(first_stop, len(full))
    if k:
        snapshot = run_pure(records, random.Random(seed + 2), stop_after=k)[-1][1]
        resumed = run_pure(records, random.Random(seed + 3), resume=through_metadata(snapshot))
        assert [g for g, _ in resumed] == full[k:]
        j = min(second_stop, len(resumed))
        if j:  # restart again, possibly before the kept records of the first restart were read again
            again = run_pure(records, random.Random(seed + 4), resume=through_metadata(resumed[j - 1][1]))
            assert [g for g, _ in again] == full[k + j:]


def test_mark_metadata_round_trip_and_foreign_commits():
    m = Mark(100, 180, frozenset({100, 101, 102, 150, 170, 171}))
    meta = m.metadata(12)
    assert meta == "rollout-stream-reader/1 batch=12 end=180 keep=0-2,50,70-71"
    assert Mark.parse(100, meta) == (12, m)
    assert Mark.parse(42, "") == (None, Mark(42, 42))  # e.g. an operator's offset reset
    assert not m.skips(101) and m.skips(103) and not m.skips(180)


def test_merger_waits_for_an_empty_partition_unless_it_is_read_and_the_group_is_old():
    rng = random.Random(0)
    marks, stats = ReadMarks(), ReaderStats()
    for p in (0, 1):
        marks.start(p, 0)
    assembler, merger = GroupAssembler(marks, stats), GroupMerger([0, 1], idle_ms=1000)
    for i, s in enumerate(make_group(0, rng)):
        group = assembler.accept(0, i, 5000, encode_train_sample(s))
    assert group is not None
    merger.push(group)
    assert merger.pop(5500, lambda p: True) is None  # partition 1 is read, but the group is too recent
    assert merger.pop(7000, lambda p: False) is None  # old enough, but partition 1 may hold an earlier one
    assert merger.pop(7000, lambda p: True) is group
    assert GroupMerger([0, 1], idle_ms=None).pop(10**12, lambda p: True) is None


# ---- the real broker ------------------------------------------------------------------------------
def take(reader: TrainDataReader, n: int, timeout: float = 30.0) -> list[Batch]:
    out = []
    for _ in range(n):
        batch = reader.next_batch(timeout)
        assert batch is not None, f"batch {len(out)} of {n} did not arrive within {timeout}s"
        out.append(batch)
    return out


def reader(bootstrap: str, topic: str, group_id: str, **kw) -> TrainDataReader:
    kw.setdefault("groups_per_batch", 3)
    kw.setdefault("partition_idle_ms", 300)
    return TrainDataReader(bootstrap, topic, group_id, **kw)


def assert_whole_groups(batches: Sequence[Batch]) -> None:
    for b in batches:
        by_group = Counter(s.group_key for s in b.samples)
        assert set(by_group) == {g.key for g in b.groups}
        for g in b.groups:
            assert by_group[g.key] == g.samples, f"batch {b.index} holds part of group {g.key}"
        assert len(set(map(sid, b.samples))) == len(b.samples)


def test_batches_hold_whole_groups_despite_interleaving_republication_and_garbage(
        kafka_bootstrap, topic_factory, unique_group_id):
    rng = random.Random(1)
    topic = topic_factory(3)
    groups = [make_group(g, rng) for g in range(12)]
    assert len(groups[0]) > 2
    records: list = interleave(groups, rng, width=4)
    records[1:1] = groups[0][:2]  # a cut-short publication of group 0's first samples, before the full one
    records.append((b"r/3", b"\xc1garbage"))  # undecodable
    records += groups[3]  # group 3 published again, whole
    publish(kafka_bootstrap, topic, records)
    with reader(kafka_bootstrap, topic, unique_group_id, groups_per_batch=3) as r:
        batches = take(r, 4)
        assert r.next_batch(1.0) is None  # nothing else: no group yielded twice, no fragment
        stats = r.stats
    assert_whole_groups(batches)
    yielded = [g.key for b in batches for g in b.groups]
    assert sorted(yielded) == sorted(f"r/{g}" for g in range(12))
    assert [sorted(map(sid, grp)) for grp in groups] == [
        sorted(sid(s) for b in batches for s in b.samples if s.group_key == f"r/{g}") for g in range(12)]
    assert stats.duplicate_groups == 1 and stats.decode_errors == 1
    assert stats.duplicate_records == 2
    b = batches[0]
    assert b.tokens.shape[0] == b.loss_mask.shape[0] == b.rewards.shape[0] == len(b.samples)
    assert b.rewards.tolist() == [s.reward for s in b.samples]
    assert b.raw_rewards.tolist() == [s.raw_reward for s in b.samples]
    assert b.response_lengths.tolist() == [3] * len(b.samples)


@pytest.mark.any_client  # the staleness rule in core
def test_stale_groups_are_skipped_whole_and_counted(kafka_bootstrap, topic_factory, unique_group_id):
    rng = random.Random(2)
    topic = topic_factory(1)  # one partition: the global order is the publication order
    oldest = [10, 3, 9, 7, 8, 12, 2, 11, 8, 10, 5]  # per group; one sample of each carries it, the others v+1
    groups = []
    for g, v in enumerate(oldest):
        grp = make_group(g, rng, versions=[str(v + 1)])
        grp[-1].sample.weight_versions = [str(v + 2), str(v)]
        groups.append(grp)
    groups.append(make_group(11, rng, versions=["v7"]))  # not an integer: cannot be judged, so invalid
    groups.append(make_group(12, rng, versions=[]))  # no version: never stale
    publish(kafka_bootstrap, topic, [s for g in groups for s in g])
    fresh = [f"r/{g}" for g, v in enumerate(oldest) if v >= 10 - 2] + ["r/12"]
    with reader(kafka_bootstrap, topic, unique_group_id, groups_per_batch=2, max_weight_staleness=2) as r:
        r.set_weight_version(10)
        batches = take(r, len(fresh) // 2)
        assert r.next_batch(1.0) is None
        stats = r.stats
    assert_whole_groups(batches)
    assert [g.key for b in batches for g in b.groups] == fresh
    assert [b.skipped_stale for b in batches] == [1, 1, 1, 1]  # 3 | 7 | 2 | 5, each before a batch ends
    assert sum(b.skipped_invalid for b in batches) == 1
    assert stats.skipped_stale_groups == 4 and stats.skipped_invalid_groups == 1
    versions = [g.oldest_weight_version for b in batches for g in b.groups]
    assert all(v is None or v >= 8 for v in versions)


def read_ranks(bootstrap: str, topic: str, group_id: str, world: int, n: int, **kw) -> list[list[Batch]]:
    results: list[list[Batch]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            with reader(bootstrap, topic, group_id, rank=rank, world_size=world, **kw) as r:
                results[rank] = take(r, n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


@pytest.mark.any_client  # sharding in core over one merged sequence
@pytest.mark.parametrize(("world", "balance"), [(2, False), (4, True)])
def test_ranks_shard_the_same_global_sequence(kafka_bootstrap, topic_factory, unique_group_id, world,
                                              balance):
    rng = random.Random(world)
    topic = topic_factory(3)
    groups = [make_group(g, rng) for g in range(16)]
    publish(kafka_bootstrap, topic, interleave(groups, rng))
    everything = {sid(s) for g in groups for s in g}
    runs = []
    for attempt in range(2):  # two independent runs (own consumer groups) must agree exactly
        runs.append(read_ranks(kafka_bootstrap, topic, f"{unique_group_id}-{attempt}", world, 4,
                               groups_per_batch=4, balance_tokens=balance))
    for ranks in runs:
        seen: Counter[tuple[str, int, int]] = Counter()
        for i in range(4):
            batches = [ranks[r][i] for r in range(world)]
            assert len({b.index for b in batches}) == 1
            assert all(b.groups == batches[0].groups for b in batches)  # every rank sees the same groups
            rollout_rank: dict[tuple[str, object], int] = {}
            for b in batches:
                for s in b.samples:
                    seen[sid(s)] += 1
                    key = (s.group_key, s.sample.rollout_id)
                    assert rollout_rank.setdefault(key, b.rank) == b.rank, "siblings split over ranks"
            whole = {sid(s) for b in batches for s in b.samples}
            assert sum(b.global_samples for b in batches) == world * len(whole)
        assert set(seen) == everything and set(seen.values()) == {1}  # union is everything, no overlap
    assert [[[sid(s) for s in b.samples] for b in rank] for rank in runs[0]] == \
        [[[sid(s) for s in b.samples] for b in rank] for rank in runs[1]]


def test_resume_after_restart_neither_skips_nor_repeats_committed_batches(kafka_bootstrap, topic_factory,
                                                                          unique_group_id):
    rng = random.Random(3)
    topic = topic_factory(3)
    groups = [make_group(g, rng) for g in range(24)]
    publish(kafka_bootstrap, topic, interleave(groups, rng, width=6))
    with reader(kafka_bootstrap, topic, f"{unique_group_id}-reference") as r:
        reference = [[g.key for g in b.groups] for b in take(r, 8)]
    with reader(kafka_bootstrap, topic, unique_group_id) as r:
        first = take(r, 3)
        assert r.commit() and not r.commit()  # nothing new the second time
        uncommitted = take(r, 1)
    assert [b.index for b in first + uncommitted] == [0, 1, 2, 3]
    with reader(kafka_bootstrap, topic, unique_group_id) as r:
        rest = take(r, 5)
        assert r.next_batch(1.0) is None
        r.commit()
    assert [b.index for b in rest] == [3, 4, 5, 6, 7]
    assert [[g.key for g in b.groups] for b in first + rest] == reference
    assert [g.key for g in uncommitted[0].groups] == reference[3]  # not committed, so read again
    with reader(kafka_bootstrap, topic, unique_group_id) as r:  # everything committed: nothing left
        assert r.next_batch(1.5) is None


@pytest.mark.any_client  # the batch numbering rule; resuming per client is tested above
def test_ranks_realign_on_the_lowest_committed_batch(kafka_bootstrap, topic_factory, unique_group_id):
    rng = random.Random(4)
    topic = topic_factory(2)
    groups = [make_group(g, rng) for g in range(12)]
    publish(kafka_bootstrap, topic, [s for g in groups for s in g])
    with reader(kafka_bootstrap, topic, unique_group_id, rank=0, world_size=2) as r:
        take(r, 2)
        r.commit()
    # Rank 1 committed the same batch (its group gets rank 0's commit, metadata included) ...
    conn = Connection(kafka_bootstrap)
    admin = raw_admin(conn)
    try:
        tps = [TopicPartition(topic, p) for p in (0, 1)]
        rank0 = rank_group_id(unique_group_id, 0)
        batch1 = admin.list_group_offsets({rank0: tps})[rank0]
    finally:
        admin.close()
    assert all("batch=1 " in om.metadata for om in batch1.values())
    committer = raw_consumer(conn, group_id=rank_group_id(unique_group_id, 1))
    try:
        committer.commit(dict(batch1))
    finally:
        committer.close()
    # ... then rank 0 committed batch 2 and rank 1 crashed before it could.
    with reader(kafka_bootstrap, topic, unique_group_id, rank=0, world_size=2) as r:
        (b,) = take(r, 1)
        assert b.index == 2 and r.commit()
    resumed = read_ranks(kafka_bootstrap, topic, unique_group_id, 2, 2)
    assert [b.index for b in resumed[0]] == [b.index for b in resumed[1]] == [2, 3]
    assert resumed[0][0].groups == resumed[1][0].groups == b.groups  # rank 0 repeats batch 2 with rank 1


@pytest.mark.any_client  # rendering
def test_tail_shows_one_block_per_group_with_rewards_and_siblings(kafka_bootstrap, topic_factory):
    topic = topic_factory(1)
    group = [train_sample(5, 500, rollouts=2, samples=3, reward=1.0),
             train_sample(5, 501, sib=0, nsib=2, rollouts=2, samples=3, reward=0.25),
             train_sample(5, 501, sib=1, nsib=2, rollouts=2, samples=3, reward=0.25)]
    publish(kafka_bootstrap, topic, group + [train_sample(6, 600, rollouts=1, samples=1)])
    result = CliRunner().invoke(app, ["tail", "--bootstrap-servers", kafka_bootstrap, "--output-topic", topic,
                                      "--from-beginning", "--groups", "1", "--partition-idle-ms", "200"],
                                env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "group r/5" in out and "group r/6" not in out
    assert "2 rollouts, 3 samples" in out
    assert "1 → +0.5000" in out and "0.25 → -0.2500" in out  # raw → processed, once per rollout
    assert out.count("0.25 → ") == 1 and "└ 0/2" in out and "└ 1/2" in out  # by sibling_index
    assert "1 group(s) shown" in out


def test_reads_whole_groups_while_the_worker_publishes_them(kafka_bootstrap, unique_group_id):
    topics = new_topics(kafka_bootstrap, partitions=3, prefix="reader")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"w-{topics.input}",
                          group_timeout_s=5.0, commit_interval_s=0.2)
    faults = FaultRates(malformed=0.1, shared_reward=0.1, duplicate=0.2, late=0.1)
    plan = SynthPlan(group_size=3, max_siblings=3, faults=faults, seed=9, run_id="e2e")
    expected = Expected()
    with running_worker(config), \
            reader(kafka_bootstrap, topics.output, unique_group_id, groups_per_batch=1) as r, \
            RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
        for records, exp in plan_groups(plan, 16):
            for rec in records:
                producer.send_raw(rec.key, rec.value)
            expected.add(exp)
        producer.flush()
        batches = take(r, expected.published_groups)
    assert_whole_groups(batches)
    published: dict[str, set] = defaultdict(set)
    for t in train_samples(read_topic(kafka_bootstrap, topics.output, min_count=expected.published_samples)):
        published[t.group_key].add(sid(t))
    assert {b.groups[0].key: {sid(s) for s in b.samples} for b in batches} == published
