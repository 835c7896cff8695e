"""rollout_stream.core.collate: padded tensors, data-parallel sharding and the staleness rule (tables and
properties)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.codec import Sample, TrainSample, decode_train_sample, encode_train_sample
from rollout_stream.core.collate import (
    collate,
    collation_problem,
    is_stale,
    is_stale_version,
    oldest_weight_version,
    rollout_units,
    shard_groups,
    shard_ranks,
)


def ts(tokens=(1, 2, 3, 4), response=2, *, mask=None, log_probs=None, remove=False, reward=0.5, raw=1.0,
       group="g", rid: object = 0, index=None, sib=0, versions=()) -> TrainSample:
    sample = Sample(group_index=0, index=index, rollout_id=rid, tokens=np.asarray(tokens, dtype="<i4"),
                    response_length=response,
                    loss_mask=None if mask is None else np.asarray(mask, dtype="u1"),
                    rollout_log_probs=None if log_probs is None else np.asarray(log_probs, dtype="<f4"),
                    remove_sample=remove, sibling_index=sib, weight_versions=list(versions), reward=raw)
    return TrainSample(sample=sample, raw_reward=raw, reward=reward, group_key=group, group_rollout_count=1,
                       group_sample_count=1, group_mean=0.0, group_std=0.0, zero_variance=False,
                       advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                       reward_key=None, source_topic="in", source_partition=0, source_offset=0)


# ---- collation -----------------------------------------------------------------------------------
def test_collate_pads_right_and_aligns_response_arrays():
    a = ts([5, 6, 7, 8, 9], 3, mask=[1, 0, 1], log_probs=[-0.5, -1.0, -1.5], reward=0.1, raw=2.0)
    b = ts([1, 2], 1, mask=[1], log_probs=[-2.0], reward=-0.3, raw=0.0)
    c = ts([3, 3, 3], 2, log_probs=None, remove=True)  # no log-probs; removed: trains nothing
    d = ts([4, 4, 4, 4], 2, mask=None, log_probs=[-0.1, -0.2])  # no mask: every response token counts
    out = collate([a, b, c, d], pad_token_id=-1)
    assert out.tokens.dtype == torch.int64 and out.tokens.tolist() == [
        [5, 6, 7, 8, 9], [1, 2, -1, -1, -1], [3, 3, 3, -1, -1], [4, 4, 4, 4, -1]]
    assert out.attention_mask.tolist() == (out.tokens != -1).tolist()
    assert out.total_lengths.tolist() == [5, 2, 3, 4] and out.response_lengths.tolist() == [3, 1, 2, 2]
    assert out.loss_mask.dtype == torch.float32
    assert out.loss_mask.tolist() == [[1, 0, 1], [1, 0, 0], [0, 0, 0], [1, 1, 0]]
    assert out.rollout_log_probs.tolist() == [[-0.5, -1.0, -1.5], [-2.0, 0, 0], [0, 0, 0],
                                              [pytest.approx(-0.1), pytest.approx(-0.2), 0]]
    assert out.has_rollout_log_probs.tolist() == [True, True, False, True]
    assert out.response_index.tolist() == [[2, 3, 4], [1, 0, 0], [1, 2, 0], [2, 3, 0]]
    assert out.tokens.gather(1, out.response_index).tolist()[0] == [7, 8, 9]
    assert out.rewards.dtype == torch.float32 and out.rewards.tolist() == [
        torch.tensor(v, dtype=torch.float32).item() for v in (0.1, -0.3, 0.5, 0.5)]
    assert out.raw_rewards.tolist() == [2.0, 0.0, 1.0, 1.0]
    assert len(out) == 4


def test_collate_of_nothing_and_of_decoded_read_only_arrays():
    empty = collate([])
    assert empty.tokens.shape == (0, 0) and empty.loss_mask.shape == (0, 0) and empty.rewards.shape == (0,)
    decoded = decode_train_sample(encode_train_sample(ts([9, 8, 7], 2, mask=[0, 1], log_probs=[-1, -2])))
    assert not decoded.sample.tokens.numpy().flags.writeable  # zero-copy view into the record
    out = collate([decoded])
    out.tokens[0, 0] = 0  # the tensors are the batch's own memory, writable
    assert out.tokens.tolist() == [[0, 8, 7]] and out.loss_mask.tolist() == [[0, 1]]


@pytest.mark.parametrize(("sample", "problem"), [
    (ts([1, 2], 3), "response_length 3 is outside 0..2 (the sample has 2 tokens)"),
    (ts([1, 2, 3], 2, mask=[1]), "loss_mask has 1 entries but response_length is 2"),
    (ts([1, 2, 3], 2, log_probs=[-1.0]), "rollout_log_probs has 1 entries but response_length is 2"),
    (ts([1, 2, 3], 2, mask=[1, 1], log_probs=[-1.0, -1.0]), None),
    (ts([], 0), None),
])
def test_collation_problems(sample, problem):
    assert collation_problem(sample) == problem
    if problem is not None:
        with pytest.raises(ValueError, match="rollout 0: "):
            collate([ts(), sample])


def test_float_tokens_and_integer_log_probs_are_refused():
    bad = ts()
    bad.sample.tokens = bad.sample.tokens.__class__(np.asarray([1.0, 2.0, 3.0]))
    assert collation_problem(bad) == "tokens have dtype float64, not an integer type"
    bad = ts([1, 2, 3], 1)
    bad.sample.rollout_log_probs = bad.sample.tokens.__class__(np.asarray([1], dtype="<i4"))
    assert collation_problem(bad) == "rollout_log_probs have dtype int32, not a float type"


lengths = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.booleans(), st.booleans(),
                             st.booleans()), max_size=8)


@settings(max_examples=150, deadline=None)
@given(lengths, st.integers(-5, 5))
def test_collate_equals_a_per_element_reference(rows, pad):
    rng = np.random.default_rng(len(rows))
    samples = []
    for total, resp, has_mask, has_lp, removed in rows:
        resp = min(resp, total)
        samples.append(ts(rng.integers(0, 1000, total), resp, remove=removed,
                          mask=rng.integers(0, 2, resp) if has_mask else None,
                          log_probs=rng.normal(size=resp) if has_lp else None))
    out = collate(samples, pad_token_id=pad)
    width = max((len(s.sample.tokens) for s in samples), default=0)
    rwidth = max((s.sample.response_length for s in samples), default=0)
    for i, s in enumerate(samples):
        toks = s.sample.tokens.tolist()
        resp = s.sample.response_length
        assert out.tokens[i].tolist() == toks + [pad] * (width - len(toks))
        mask = [0] * resp if s.sample.remove_sample else (
            [1] * resp if s.sample.loss_mask is None else s.sample.loss_mask.tolist())
        assert out.loss_mask[i].tolist() == mask + [0] * (rwidth - resp)
        lp = s.sample.rollout_log_probs.tolist() if s.sample.rollout_log_probs is not None else [0.0] * resp
        assert out.rollout_log_probs[i].tolist() == lp + [0.0] * (rwidth - resp)
        for j in range(resp):
            assert out.tokens[i, out.response_index[i, j]].item() == toks[len(toks) - resp + j]


# ---- staleness -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("versions", "current", "bound", "stale"), [
    ([["10"], ["10"]], 10, 0, False),
    ([["9"], ["10"]], 10, 0, True),  # one old sample makes the whole group stale
    ([["8", "10"], ["10"]], 10, 2, False),  # oldest 8 = 10 - 2: still allowed
    ([["7", "10"], ["10"]], 10, 2, True),  # a sample's oldest entry counts, not its newest
    ([[], []], 10, 0, False),  # no versions: cannot be stale
    ([["3"]], None, 0, False),  # no current version set
    ([["3"]], 10, None, False),  # no bound
    ([[" 7 "], ["+9"]], 9, 1, True),
])
def test_staleness_rule(versions, current, bound, stale):
    group = [ts(versions=v) for v in versions]
    assert is_stale(group, current, bound) is stale


def test_oldest_weight_version_and_bad_versions():
    assert oldest_weight_version([ts(versions=["12", "4"]), ts(versions=["5"])]) == 4
    assert oldest_weight_version([ts()]) is None
    for bad in ("v3", "1_0", "", "2.5"):
        with pytest.raises(ValueError, match="is not an integer"):
            is_stale([ts(versions=[bad])], 10, 1)
    assert not is_stale([ts(versions=["v3"])], 10, None)  # the rule is off: versions are not read
    with pytest.raises(ValueError, match="max_staleness"):
        is_stale_version(1, 10, -1)


# ---- sharding --------------------------------------------------------------------------------------
def grp(name: str, shape: list[tuple[object, int]], tokens: int = 4) -> list[TrainSample]:
    """A group: (rollout id, sibling count) per rollout; rollout id None means neither id nor index."""
    return [ts(list(range(tokens)), 1, group=name, rid=rid, sib=s) for rid, n in shape for s in range(n)]


def test_rollout_units_keep_siblings_together_and_ids_are_per_group():
    groups = [grp("a", [(1, 2), (2, 1)]), grp("b", [(1, 3), (None, 1), (None, 1)])]
    assert rollout_units(groups) == [[0, 1], [2], [3, 4, 5], [6], [7]]
    by_index = [ts(group="c", rid=None, index=7), ts(group="c", rid=None, index=7, sib=1),
                ts(group="c", rid="7")]
    assert rollout_units([by_index]) == [[0, 1], [2]]  # index stands in for rollout_id; "7" is not 7


def test_strided_and_token_balanced_assignment():
    groups = [grp("a", [(1, 2), (2, 1)]), grp("b", [(1, 3), (2, 1)])]
    assert shard_ranks(groups, 2) == [0, 0, 1, 0, 0, 0, 1]  # rollouts 0,1,2,3 → ranks 0,1,0,1
    assert [s.group_key for s in shard_groups(groups, 1, 2)] == ["a", "b"]
    big = [grp("a", [(1, 1)], tokens=100), grp("b", [(1, 1), (2, 1), (3, 1)], tokens=40)]
    # Largest first: 100 → rank 0; each 40 to the least loaded rank: 1 (0), 1 (40), 1 (80 < 100).
    assert shard_ranks(big, 2, balance_tokens=True) == [0, 1, 1, 1]
    assert shard_ranks(big + [grp("c", [(1, 1)], tokens=30)], 2, balance_tokens=True) == [0, 1, 1, 1, 0]
    assert shard_ranks(groups, 1) == [0] * 7
    with pytest.raises(ValueError):
        shard_groups(groups, 2, 2)
    with pytest.raises(ValueError):
        shard_ranks(groups, 0)


shapes = st.lists(st.lists(st.tuples(st.one_of(st.none(), st.integers(0, 3), st.sampled_from(["x", "y"])),
                                     st.integers(1, 3), st.integers(1, 60)), min_size=1, max_size=5),
                  max_size=6)


@settings(max_examples=200, deadline=None)
@given(shapes, st.integers(1, 5), st.booleans())
def test_sharding_properties(shape, world, balance):
    groups = [[ts(list(range(tokens)), 1, group=f"g{g}", rid=rid, sib=s)
               for rid, n, tokens in rollouts for s in range(n)] for g, rollouts in enumerate(shape)]
    shards = [shard_groups(groups, r, world, balance_tokens=balance) for r in range(world)]
    everything = [id(s) for g in groups for s in g]
    got = Counter(id(s) for shard in shards for s in shard)
    assert sorted(got) == sorted(everything) and set(got.values()) <= {1}  # union is everything, no overlap
    rank_of = {id(s): r for r, shard in enumerate(shards) for s in shard}
    for unit in rollout_units(groups):
        flat = [s for g in groups for s in g]
        assert len({rank_of[id(flat[row])] for row in unit}) == 1  # siblings on one rank
    for shard in shards:  # each rank keeps the global order
        assert [everything.index(id(s)) for s in shard] == sorted(everything.index(id(s)) for s in shard)
    # Deterministic: a decoded copy (what another rank holds) gets the same assignment.
    copies = [[decode_train_sample(encode_train_sample(s)) for s in g] for g in groups]
    ranks = shard_ranks(groups, world, balance_tokens=balance)
    assert shard_ranks(copies, world, balance_tokens=balance) == ranks
    if balance and groups:
        flat = [s for g in groups for s in g]
        sizes = [sum(len(flat[r].sample.tokens) for r in unit) for unit in rollout_units(groups)]
        loads = [sum(len(s.sample.tokens) for s in shard) for shard in shards]
        assert max(loads) - min(loads) <= max(sizes)  # the greedy's bound
