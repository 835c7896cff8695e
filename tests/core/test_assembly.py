"""rollout_stream.core.assembly without Kafka: whole groups, one global order, batches, shards, commit marks
and resume."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.codec import Array, Sample, TrainSample
from rollout_stream.core.assembly import (
    AssembledGroup,
    GroupMerger,
    Mark,
    ReadMarks,
    SampleAssembler,
    assembled_group,
    batch_length,
    choose_resume,
    commit_metadata,
    fetch_paused,
    group_info,
    group_verdict,
    lineage,
    loss_tokens,
    plan_batch,
)


# ---- data ----------------------------------------------------------------------------------------
def train_sample(g: int, rollout: int, *, sib: int = 0, nsib: int = 1, rollouts: int = 1, samples: int = 1,
                 versions: Sequence[str] = ("1",), tokens: int = 8, response: int = 3,
                 loss_mask: Sequence[int] | None = None, remove: bool = False) -> TrainSample:
    s = Sample(group_index=g, index=rollout, rollout_id=rollout, tokens=np.arange(tokens, dtype="<i4"),
               response_length=response, reward=float(rollout % 2),
               loss_mask=np.asarray(loss_mask if loss_mask is not None else [1] * response, dtype="u1"),
               rollout_log_probs=np.full(response, -0.5, dtype="<f4"), weight_versions=list(versions),
               group_size=rollouts, sibling_count=nsib, sibling_index=sib, run_id="r", remove_sample=remove)
    return TrainSample(
        sample=s, raw_reward=float(rollout % 2), reward=0.0, group_key=f"r/{g}", group_rollout_count=rollouts,
        group_sample_count=samples, group_mean=0.5, group_std=0.5, zero_variance=False,
        advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True, reward_key=None,
        source_topic="rollouts", source_partition=g % 3, source_offset=g * 1000 + rollout * 10 + sib,
    )


def make_group(g: int, shape: Sequence[int], *, versions: Sequence[str] = ("1",),
               tokens: Sequence[int] | None = None) -> list[TrainSample]:
    """A published group: rollout r has shape[r] sibling samples."""
    total = sum(shape)
    out = []
    for r, nsib in enumerate(shape):
        for sib in range(nsib):
            n = tokens[len(out) % len(tokens)] if tokens else 8
            out.append(train_sample(g, r, sib=sib, nsib=nsib, rollouts=len(shape), samples=total,
                                    versions=versions, tokens=n))
    return out


shapes = st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=4), min_size=1, max_size=6)


def as_group(samples: Sequence[TrainSample], partition: int = 0, *, offset: int = 0,
             timestamp_ms: int = 0) -> AssembledGroup:
    return assembled_group(samples[0].group_key, partition, samples,
                           range(offset, offset + len(samples)), timestamp_ms, 0)


def ids(samples: Sequence[TrainSample]) -> set:
    return {lineage(s) for s in samples}


# ---- assembly ------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(shapes, st.integers(1, 3), st.data())
def test_any_interleaving_and_duplication_of_complete_groups_assembles_exactly_those_groups(
        group_shapes, partitions, data):
    groups = [make_group(g, shape) for g, shape in enumerate(group_shapes)]
    where = [data.draw(st.integers(0, partitions - 1)) for _ in groups]  # a group lives in one partition
    records = [(g, s) for g, grp in enumerate(groups) for s in grp
               for _ in range(1 + data.draw(st.integers(0, 2)))]  # every record at least once
    records = data.draw(st.permutations(records))
    assembler, marks = SampleAssembler(), ReadMarks()
    offsets = {p: 0 for p in range(partitions)}
    done: list[AssembledGroup] = []
    for ts, (g, s) in enumerate(records):
        p = where[g]
        added = assembler.add(p, offsets[p], ts, s, 100)
        marks.read(p, offsets[p], hold=added.hold)
        marks.release(p, added.release)
        offsets[p] += 1 + data.draw(st.integers(0, 1))  # gaps: transaction markers
        assert not added.abandoned
        if added.group is not None:
            assert added.group.timestamp_ms == ts and added.group.partition == p
            assert list(added.group.offsets) == sorted(added.group.offsets)
            marks.release(p, added.group.offsets)
            done.append(added.group)
    assert sorted(g.key for g in done) == sorted(grp[0].group_key for grp in groups)  # each exactly once
    for g in done:
        original = next(grp for grp in groups if grp[0].group_key == g.key)
        assert len(g.samples) == len(original) and ids(g.samples) == ids(original)  # siblings together
        assert g.problem is None and g.oldest_version == 1 and g.nbytes == 100 * len(original)
    # Whatever is still held belongs to leftover copies, never to a group that was yielded.
    for p, mark in marks.snapshot().items():
        assert mark.offset <= offsets[p]


def test_a_cut_short_publication_then_the_full_one_completes_once_and_a_full_copy_is_dropped():
    group = make_group(7, [2, 1])
    assembler, out = SampleAssembler(), []
    stream = group[:2] + group + group  # crash after two records, republication, then the whole group again
    for offset, s in enumerate(stream):
        out.append(assembler.add(0, offset, offset, s, 10))
    assert [a.duplicate for a in out] == [None, None, "record", "record", None, None, None, "group"]
    assert [a.hold for a in out] == [True, True, False, False, True, True, True, True]
    (completed,) = [a.group for a in out if a.group is not None]
    assert completed.offsets == (0, 1, 4) and completed.timestamp_ms == 4
    assert out[-1].release == (5, 6, 7)  # the dropped copy's records are released for commit


def test_a_copy_is_assembled_again_once_forgotten():
    assembler = SampleAssembler(remember_per_partition=1)
    a, b = make_group(1, [1]), make_group(2, [1])
    assert assembler.add(0, 0, 0, a[0], 1).group is not None
    assert assembler.add(0, 1, 0, a[0], 1).duplicate == "group"
    assert assembler.add(0, 2, 0, b[0], 1).group is not None  # pushes group 1 out of memory
    assert assembler.add(0, 3, 0, a[0], 1).group is not None
    assert assembler.add(1, 0, 0, b[0], 1).group is not None  # memory is per partition


def test_too_many_incomplete_groups_abandon_the_oldest_and_release_its_records():
    assembler = SampleAssembler(max_pending_per_partition=2)
    first = [assembler.add(0, g, 0, make_group(g, [2])[0], 1) for g in range(2)]
    assert all(a.hold and not a.abandoned for a in first)
    added = assembler.add(0, 5, 0, make_group(9, [2])[0], 1)
    (old,) = added.abandoned
    assert (old.key, old.have, old.expected, old.first_offset) == ("r/0", 1, 2, 0)
    assert added.release == (0,) and added.hold
    assert assembler.add(1, 0, 0, make_group(3, [2])[0], 1).abandoned == ()  # bounded per partition
    with pytest.raises(ValueError):
        SampleAssembler(max_pending_per_partition=0)


def test_a_complete_group_is_judged_once():
    bad = make_group(1, [2])
    bad[1].sample.response_length = 99  # longer than its tokens
    assert "response_length 99" in (as_group(bad).problem or "")
    versions = make_group(2, [1, 1], versions=("4", "7"))
    versions[1].sample.weight_versions = ["3"]
    assert as_group(versions).oldest_version == 3
    odd = as_group(make_group(3, [1], versions=("v7",)))
    assert odd.problem is None and odd.oldest_version is None
    assert "not an integer" in (odd.version_problem or "")


# ---- global order --------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=6), min_size=1, max_size=4), st.randoms())
def test_the_merge_is_sorted_by_timestamp_then_partition_whatever_the_delivery_chunks(steps, rnd):
    # Per partition, groups with non-decreasing timestamps (later records carry later timestamps).
    per: dict[int, list[AssembledGroup]] = {}
    for p, deltas in enumerate(steps):
        ts, per[p] = 0, []
        for i, d in enumerate(deltas):
            ts += d
            per[p].append(as_group(make_group(p * 100 + i, [1]), p, offset=i, timestamp_ms=ts))
    merger, cursors, out = GroupMerger(sorted(per), idle_ms=0), dict.fromkeys(per, 0), []
    while True:
        live = [p for p in per if cursors[p] < len(per[p])]
        if live:
            p = rnd.choice(live)
            n = rnd.randint(1, 3)
            for g in per[p][cursors[p]: cursors[p] + n]:
                merger.push(g)
            cursors[p] += n
        while (g := merger.pop(10**15, lambda q: cursors[q] >= len(per[q]))) is not None:
            out.append(g)
        if not live:
            break
    assert out == merged_at_once(per)  # whatever the push/pop interleaving


def merged_at_once(per: dict[int, list[AssembledGroup]]) -> list[AssembledGroup]:
    """The k-way merge of whole partitions: repeatedly the head with the smallest merge key."""
    queues, out = {p: list(gs) for p, gs in per.items()}, []
    while any(queues.values()):
        p = min((q[0].merge_key, p) for p, q in queues.items() if q)[1]
        out.append(queues[p].pop(0))
    return out


def test_groups_completed_in_one_millisecond_keep_their_rollouts_order_across_partitions():
    # One poll's groups, sent by the stage within a millisecond in the order their last rollouts arrived:
    # group 3 (rollouts partition 0) completed before group 6 (also partition 0), but went to train-data
    # partition 1 and group 6 to partition 0. The merge keeps the rollouts order, not the partition order.
    early = as_group(make_group(3, [1]), 1, timestamp_ms=7000)
    late = as_group(make_group(6, [1]), 0, timestamp_ms=7000)
    assert early.samples[0].source_partition == late.samples[0].source_partition == 0
    assert early.samples[0].source_offset < late.samples[0].source_offset
    merger = GroupMerger([0, 1], idle_ms=0)  # partitions read to their end pass at once
    merger.push(late)
    merger.push(early)
    assert [merger.pop(8000, lambda p: True), merger.pop(8000, lambda p: True)] == [early, late]
    # An earlier timestamp still decides first, whatever the lineage.
    first = as_group(make_group(9, [1]), 0, timestamp_ms=6999)
    merger.push(first)
    merger.push(as_group(make_group(0, [1]), 1, timestamp_ms=7000))
    assert merger.pop(8000, lambda p: True) is first


def test_the_merge_waits_for_an_empty_partition_unless_it_is_read_and_the_group_is_old():
    merger = GroupMerger([0, 1], idle_ms=1000)
    group = as_group(make_group(0, [1]), 0, timestamp_ms=5000)
    merger.push(group)
    assert merger.backlog(0) == 1 and merger.backlog(1) == 0
    assert merger.due_ms() == 6000  # when the idle rule could let it pass: the reader looks again then
    assert merger.pop(5500, lambda p: True) is None  # partition 1 is read, but the group is too recent
    assert merger.pop(7000, lambda p: False) is None  # old enough, but partition 1 may hold an earlier one
    assert merger.pop(7000, lambda p: True) is group
    assert merger.pop(7000, lambda p: True) is None
    assert merger.due_ms() is None  # nothing waits
    merger.push(group)
    merger.push(as_group(make_group(1, [1]), 1, timestamp_ms=5001))
    assert merger.due_ms() is None  # no partition is empty: the merge does not wait on time
    never = GroupMerger([0, 1], idle_ms=None)
    never.push(group)
    assert never.pop(10**12, lambda p: True) is None and never.due_ms() is None


def test_fetching_pauses_at_the_limit_and_resumes_below_half():
    assert [fetch_paused(n, 8, False) for n in (0, 4, 7, 8, 20)] == [False, False, False, True, True]
    assert [fetch_paused(n, 8, True) for n in (8, 5, 4, 3, 0)] == [True, True, True, False, False]


# ---- batches -------------------------------------------------------------------------------------
def test_a_group_is_invalid_stale_or_trains():
    fresh = as_group(make_group(1, [1], versions=("8",)))
    old = as_group(make_group(2, [1], versions=("7",)))
    unversioned = as_group(make_group(3, [1], versions=()))
    odd = as_group(make_group(4, [1], versions=("v1",)))
    broken = make_group(5, [1])
    broken[0].sample.response_length = 99
    assert [group_verdict(g, 10, 2) for g in (fresh, old, unversioned, odd, as_group(broken))] == \
        [None, "stale", None, "invalid", "invalid"]
    assert [group_verdict(g, None, 2) for g in (old, odd)] == [None, None]  # no version set yet
    assert [group_verdict(g, 10, None) for g in (old, odd)] == [None, None]  # no bound
    assert group_verdict(as_group(broken), None, None) == "invalid"  # cannot be collated, ever


def test_a_batch_ends_at_the_shortest_prefix_holding_enough_groups_that_train():
    assert batch_length([None, "stale", None, "invalid", None], 2) == 3
    assert batch_length(["stale", "stale", None], 1) == 3
    assert batch_length([None, "stale"], 2) is None
    assert batch_length([], 1) is None
    with pytest.raises(ValueError):
        batch_length([None], 0)


def test_a_plan_counts_what_it_skips_and_the_loss_tokens_of_the_whole_batch():
    groups = [as_group(make_group(g, [1, 2]), offset=10 * g) for g in range(4)]
    groups[1].samples[0].sample.loss_mask = Array(np.array([1, 0, 1], dtype="u1"))
    groups[0].samples[1].sample.remove_sample = True
    plan = plan_batch(groups, [None, None, "stale", "invalid"], groups_per_batch=2, rank=0, world_size=1)
    assert plan.taken == 2 and plan.groups == tuple(groups[:2]) and plan.skipped_stale == 0
    assert plan.global_samples == 6 and plan.global_loss_tokens == 3 * 6 - 1 - 3
    plan = plan_batch(groups + [groups[0]], [None, "stale", "invalid", "stale", None], groups_per_batch=2,
                      rank=0, world_size=1)
    assert plan.taken == 5 and plan.skipped_stale == 2 and plan.invalid == (groups[2],)
    assert plan.skipped_invalid == 1
    with pytest.raises(ValueError):
        plan_batch(groups, [None, "stale", "stale", "stale"], groups_per_batch=2, rank=0, world_size=1)


def test_loss_tokens_follow_the_collated_mask():
    assert loss_tokens(train_sample(0, 0, response=4)) == 4
    assert loss_tokens(train_sample(0, 0, response=4, loss_mask=[0, 1, 0, 1])) == 2
    assert loss_tokens(train_sample(0, 0, response=4, remove=True)) == 0
    s = train_sample(0, 0, response=4)
    s.sample.loss_mask = None
    assert loss_tokens(s) == 4


@settings(max_examples=200, deadline=None)
@given(shapes, st.integers(1, 5), st.booleans(), st.data())
def test_sharding_a_batch_over_ranks_is_a_repeatable_partition_that_keeps_siblings_together(
        group_shapes, world, balance, data):
    groups = [as_group(make_group(g, shape, tokens=data.draw(st.lists(st.integers(4, 40), min_size=1,
                                                                     max_size=4))))
              for g, shape in enumerate(group_shapes)]
    verdicts = [data.draw(st.sampled_from([None, None, "stale", "invalid"])) for _ in groups]
    per_batch = verdicts.count(None)
    if per_batch == 0:
        verdicts[0], per_batch = None, 1
    plans = [plan_batch(groups, verdicts, groups_per_batch=per_batch, rank=r, world_size=world,
                        balance_tokens=balance) for r in range(world)]
    good = [g for g, v in zip(groups, verdicts, strict=True) if v is None]
    assert all((p.taken, p.groups, p.invalid, p.skipped_stale) == (plans[0].taken, tuple(good),
                                                                   plans[0].invalid, plans[0].skipped_stale)
               for p in plans)
    everything = [lineage(s) for g in good for s in g.samples]
    shares = [[lineage(s) for s in p.samples] for p in plans]
    assert sorted(x for share in shares for x in share) == sorted(everything)  # union = all, no overlap
    assert all(p.global_samples == len(everything) for p in plans)
    for share in shares:  # each rank keeps the global order
        assert share == [x for x in everything if x in set(share)]
    owner = {}
    for rank, p in enumerate(plans):
        for s in p.samples:
            assert owner.setdefault((s.group_key, s.sample.rollout_id), rank) == rank  # siblings together
    again = [plan_batch(groups, verdicts, groups_per_batch=per_batch, rank=r, world_size=world,
                        balance_tokens=balance) for r in range(world)]
    assert again == plans


def test_group_info_describes_a_group_for_every_rank():
    group = assembled_group("r/4", 2, make_group(4, [2, 1], versions=("5",)), [30, 10, 20], 777, 9)
    info = group_info(group)
    assert (info.key, info.partition, info.first_offset, info.last_offset, info.timestamp_ms) == \
        ("r/4", 2, 10, 30, 777)
    assert (info.samples, info.rollouts, info.oldest_weight_version) == (3, 2, 5)


# ---- commit marks and resume ---------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**12), st.lists(st.integers(0, 500), max_size=60), st.integers(0, 50),
       st.integers(0, 10**6))
def test_commit_metadata_round_trips_a_mark(offset, rel_keep, extra, batch):
    keep = frozenset(offset + k for k in rel_keep)
    end = offset + (max(rel_keep) + 1 if rel_keep else 0) + extra
    mark = Mark(offset, end, keep)
    meta, truncated = commit_metadata(mark, batch, limit=10**6)
    assert not truncated and Mark.parse(offset, meta) == (batch, mark)
    for o in range(offset, end + 2):
        assert mark.skips(o) == (o < end and o not in keep)


def test_commit_metadata_drops_the_kept_offsets_when_they_do_not_fit():
    mark = Mark(100, 10_000, frozenset(range(100, 10_000, 2)))
    meta, truncated = commit_metadata(mark, 3)
    assert truncated and Mark.parse(100, meta) == (3, Mark(100, 100))  # everything from 100 is read again
    small = commit_metadata(Mark(5, 9, frozenset({5, 7})), 1)
    assert small == ("rollout-stream-reader/1 batch=1 end=9 keep=0,2", False)


def test_read_marks_commit_the_lowest_held_offset_and_resume_keeps_what_was_still_held():
    marks = ReadMarks()
    marks.start(0, 10)
    for o in range(10, 15):
        marks.read(0, o, hold=o in (11, 13))
    assert marks.snapshot() == {0: Mark(11, 15, frozenset({11, 13}))}
    marks.release(0, [11])
    assert marks.snapshot() == {0: Mark(13, 15, frozenset({13}))}
    marks.release(0, [13])
    assert marks.snapshot() == {0: Mark(15, 15)}
    resumed = ReadMarks()
    resumed.start(0, 11, Mark(11, 15, frozenset({11, 13})))
    assert resumed.snapshot() == {0: Mark(11, 15, frozenset({11, 13}))}
    resumed.read(0, 13, hold=True)  # 11 is gone from the log (retention): nothing left to wait for
    assert resumed.snapshot() == {0: Mark(13, 15, frozenset({13}))}


def test_every_rank_resumes_from_the_commit_with_the_lowest_batch_index():
    def meta(batch: int) -> str:
        return f"rollout-stream-reader/1 batch={batch} end=0 keep="
    rank0 = {0: (40, meta(5)), 1: (30, meta(5))}
    rank1 = {0: (20, meta(4)), 1: (25, meta(4))}
    resume = choose_resume([rank0, rank1])
    assert (resume.batch, resume.rank, resume.marks) == (4, 1, {0: Mark(20, 20), 1: Mark(25, 25)})
    assert choose_resume([rank1, rank1]).rank == 0  # ties: the lowest rank
    assert choose_resume([rank0, {}]).rank == 0  # a rank that never committed does not count
    foreign = choose_resume([rank0, {0: (7, None), 1: (None, None)}])  # an operator's offset reset
    assert (foreign.batch, foreign.rank, foreign.marks) == (None, 1, {0: Mark(7, 7)})
    assert choose_resume([{0: (-1, "")}, {}]) == choose_resume([]) == choose_resume([{}])
    assert choose_resume([]).rank is None and choose_resume([]).marks == {}


# ---- purity --------------------------------------------------------------------------------------
def test_the_module_imports_neither_kafka_nor_stream():
    code = ("import sys, rollout_stream.core.assembly; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kafka', 'stream')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]", out.stdout

