"""Staleness by group, rollout and token (core/staleness.py): per-token versions from version spans, the three
modes on hand-made groups, and hypothesis properties on random groups against the reference trainer's
whole-group normalization (tests/core/reference_impl.py)."""

from __future__ import annotations

import struct
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_stream.codec import Sample, TrainSample
from rollout_stream.core import GroupRewards, RewardConfig, normalize_group
from rollout_stream.core.collate import is_stale
from rollout_stream.core.staleness import (
    STALENESS_MODES,
    span_loss_tokens,
    spans_loss_mask,
    staleness_decision,
    token_version_rows,
    token_versions,
    trainable_tokens,
    trained,
    without_stale_tokens,
)
from tests.core.test_rewards_properties import reference


def _train(sample: Sample, reward: float = 0.0) -> TrainSample:
    return TrainSample(sample=sample, raw_reward=reward, reward=reward, group_key="0", group_rollout_count=1,
                       group_sample_count=1, group_mean=0.0, group_std=0.0, zero_variance=False,
                       advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                       reward_key=None, source_topic="t", source_partition=0, source_offset=0)


def _sample(versions: list[str], offsets: list[int] | None = None, length: int = 4, **fields: Any) -> Sample:
    return Sample(group_index=0, tokens=[1] * (length + 2), response_length=length, weight_versions=versions,
                  weight_version_offsets=offsets, **fields)


# ---------------------------------------------------------------- per-token versions


@pytest.mark.parametrize(("versions", "offsets", "length", "expected"), [
    (["7"], None, 3, [7, 7, 7]),
    (["5", "3"], None, 3, [3, 3, 3]),  # no offsets: the whole response under the oldest listed version
    (["3", "5"], [0, 2], 4, [3, 3, 5, 5]),
    (["3", "4", "5"], [0, 0, 3], 4, [4, 4, 4, 5]),  # version 3 generated no token
    (["3", "4"], [0, 4], 4, [3, 3, 3, 3]),  # the empty tail: version 4 started after the last token
    (["3"], [0], 0, []),
    (["+3", " 4 "], [0, 1], 2, [3, 4]),  # parsed as collate.oldest_weight_version parses them
])
def test_token_versions_expand_the_spans(versions: list[str], offsets: list[int] | None, length: int,
                                         expected: list[int]) -> None:
    got = token_versions(_sample(versions, offsets, length))
    assert got is not None and got.dtype == np.int64 and got.tolist() == expected


def test_a_sample_without_versions_has_no_token_versions() -> None:
    assert token_versions(_sample([], None)) is None
    assert token_versions(_sample([], [])) is None


@pytest.mark.parametrize(("versions", "offsets", "message"), [
    (["a"], None, "weight version 'a' is not an integer"),
    (["3", "4"], [0], "one offset per version"),
    (["3", "4"], [0, 5], r"weight_version_offsets\[1\] is 5, past the response of 4 tokens"),
    (["3", "4", "5"], [0, 3, 2], r"decrease at version 2 \(3 then 2\)"),
    (["3"], [1], "must start at 0, got 1"),
    (["1", "99999999999999999999"], None, "do not fit int64"),
])
def test_token_versions_refuse_what_does_not_fit(versions: list[str], offsets: list[int] | None,
                                                 message: str) -> None:
    with pytest.raises(ValueError, match=message):
        token_versions(_sample(versions, offsets))


# ---------------------------------------------------------------- the modes on one group


def _slow_one() -> list[TrainSample]:
    """Eight rollouts: rollout 0 was generated at version 1 and then at 5 (from token 2), the rest at 5."""
    group = [_train(_sample(["1", "5"], [0, 2], rollout_id=0, loss_mask=[1, 1, 1, 1]), reward=1.0)]
    group += [_train(_sample(["5"], rollout_id=r, loss_mask=[1, 1, 0, 1]), reward=float(r))
              for r in range(1, 8)]
    return group


def test_group_mode_skips_the_whole_group_for_one_slow_rollout() -> None:
    decision = staleness_decision(_slow_one(), "group", 6, 2)
    assert decision.skipped and decision.excluded_rollouts == 8 and decision.excluded_samples == 8
    assert decision.excluded_tokens == 4 + 7 * 3


def test_rollout_mode_drops_only_the_slow_rollout() -> None:
    group = _slow_one()
    decision = staleness_decision(group, "rollout", 6, 2)
    assert decision.rows == tuple(range(1, 8)) and decision.loss_masks == (None,) * 7
    assert (decision.excluded_rollouts, decision.excluded_samples, decision.excluded_tokens) == (1, 1, 4)
    assert [t.reward for t in trained(group, decision)] == [float(r) for r in range(1, 8)]


def test_token_mode_masks_only_the_slow_tokens() -> None:
    group = _slow_one()
    decision = staleness_decision(group, "token", 6, 2)
    assert decision.rows == tuple(range(8))
    first = decision.loss_masks[0]
    assert first is not None and first.tolist() == [0, 0, 1, 1] and decision.loss_masks[1:] == (None,) * 7
    assert (decision.excluded_rollouts, decision.excluded_samples, decision.excluded_tokens) == (0, 0, 2)
    rows = trained(group, decision)
    assert rows[0].sample.loss_mask == [0, 0, 1, 1] and rows[0].reward == 1.0
    assert group[0].sample.loss_mask == [1, 1, 1, 1]  # the group's own samples are left alone


def test_token_mode_drops_a_rollout_left_without_trainable_tokens() -> None:
    group = _slow_one()
    group[0] = _train(_sample(["1", "5"], [0, 2], rollout_id=0, loss_mask=[1, 1, 0, 0]))
    decision = staleness_decision(group, "token", 6, 2)
    assert decision.rows == tuple(range(1, 8))
    assert (decision.excluded_rollouts, decision.excluded_samples, decision.excluded_tokens) == (1, 1, 2)


def test_a_fresh_rollout_without_trainable_tokens_stays_in_token_mode() -> None:
    group = [_train(_sample(["5"], rollout_id=0, remove_sample=True)), *_slow_one()[1:]]
    for mode in STALENESS_MODES:
        assert staleness_decision(group, mode, 6, 2).rows == tuple(range(8))


def test_siblings_leave_and_stay_together() -> None:
    group = [_train(_sample(["5"], rollout_id="a", sibling_count=2)),
             _train(_sample(["1"], rollout_id="a", sibling_count=2, sibling_index=1)),
             _train(_sample(["5"], rollout_id="b"))]
    assert staleness_decision(group, "rollout", 6, 2).rows == (2,)
    decision = staleness_decision(group, "token", 6, 2)
    assert decision.rows == (0, 1, 2)  # the fresh sibling still trains: its rollout stays whole
    assert decision.loss_masks[1] is not None and not decision.loss_masks[1].any()


def test_a_group_with_nothing_fresh_is_skipped_in_every_mode() -> None:
    group = [_train(_sample(["1"], rollout_id=r)) for r in range(3)]
    for mode in STALENESS_MODES:
        decision = staleness_decision(group, mode, 6, 2)
        assert decision.skipped and decision.excluded_rollouts == 3, mode


@pytest.mark.parametrize(("version", "bound"), [(None, 2), (6, None)])
def test_no_bound_or_no_version_trains_everything(version: int | None, bound: int | None) -> None:
    for mode in STALENESS_MODES:
        assert staleness_decision(_slow_one(), mode, version, bound).rows == tuple(range(8))


def test_what_cannot_be_decided_is_an_error() -> None:
    with pytest.raises(ValueError, match="staleness must be one of group, rollout, token"):
        staleness_decision(_slow_one(), "sample", 6, 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        staleness_decision(_slow_one(), "token", 6, -1)
    with pytest.raises(ValueError, match="not an integer"):
        staleness_decision([_train(_sample(["x"]))], "rollout", 6, 2)


# ---------------------------------------------------------------- properties on random groups

CONFIG = RewardConfig(advantage_estimator="grpo")


@st.composite
def samples_of_a_rollout(draw: st.DrawFn, rollout: int, versions: st.SearchStrategy[int]) -> list[Sample]:
    siblings = draw(st.integers(1, 2))
    reward = draw(st.floats(-4.0, 4.0, allow_nan=False, width=32))
    out = []
    for sibling in range(siblings):
        length = draw(st.integers(0, 6))
        listed = draw(st.lists(versions, max_size=3))
        spans = draw(st.booleans()) and bool(listed)
        cuts = sorted(draw(st.lists(st.integers(0, length), min_size=len(listed) - 1,
                                    max_size=len(listed) - 1))) if spans else []
        mask = draw(st.one_of(st.none(), st.lists(st.sampled_from([0, 1]), min_size=length, max_size=length)))
        out.append(Sample(
            group_index=0, rollout_id=rollout, index=rollout, reward=reward, tokens=[1] * (length + 1),
            response_length=length, loss_mask=mask, remove_sample=draw(st.integers(0, 9)) == 0,
            weight_versions=[str(v) for v in listed], weight_version_offsets=[0, *cuts] if spans else None,
            sibling_count=siblings, sibling_index=sibling,
        ))
    return out


@st.composite
def groups(draw: st.DrawFn) -> list[TrainSample]:
    """A prompt group of rollouts generated at random versions (spans in random places), its rewards
    normalized by the stage over the whole group."""
    versions = st.integers(0, 8)
    samples = [s for r in range(draw(st.integers(1, 6))) for s in draw(samples_of_a_rollout(r, versions))]
    rewards = normalize_group(samples, CONFIG)
    assert isinstance(rewards, GroupRewards)
    return [
        TrainSample(sample=s, raw_reward=raw, reward=reward, group_key="0",
                    group_rollout_count=rewards.rollout_count, group_sample_count=len(samples),
                    group_mean=rewards.mean, group_std=rewards.std, zero_variance=rewards.zero_variance,
                    advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                    reward_key=None, source_topic="t", source_partition=0, source_offset=row)
        for row, (s, raw, reward) in enumerate(zip(samples, rewards.raw, rewards.rewards, strict=True))]


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)


def _oldest(group: list[TrainSample], rollout: object) -> int | None:
    versions = [int(v) for t in group if t.sample.rollout_id == rollout for v in t.sample.weight_versions]
    return min(versions, default=None)


PROPERTIES = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTIES
@given(groups(), st.integers(0, 10), st.integers(0, 4))
def test_rollout_mode_never_trains_a_stale_rollout_and_keeps_every_fresh_one(group, version, bound):
    floor = version - bound
    decision = staleness_decision(group, "rollout", version, bound)
    kept = set(decision.rows)
    fresh = [(oldest := _oldest(group, t.sample.rollout_id)) is None or oldest >= floor for t in group]
    assert decision.skipped == (not any(fresh))  # a group with no fresh rollout is skipped, as today
    for row, t in enumerate(group):
        if row in kept:  # no token past the bound trains
            versions = token_versions(t.sample)
            assert versions is None or not (trainable_tokens(t.sample) & (versions < floor)).any()
        if not decision.skipped:
            assert (row in kept) == fresh[row]  # every fresh rollout stays, every stale one leaves
    assert all(mask is None for mask in decision.loss_masks)


@PROPERTIES
@given(groups(), st.integers(0, 10), st.integers(0, 4))
def test_token_mode_never_trains_a_stale_token_and_keeps_every_fresh_one(group, version, bound):
    floor = version - bound
    decision = staleness_decision(group, "token", version, bound)
    after = {row: t for row, t in zip(decision.rows, trained(group, decision), strict=True)}
    excluded = 0
    for row, t in enumerate(group):
        before = trainable_tokens(t.sample)
        versions = token_versions(t.sample)
        fresh = before if versions is None else before & (versions >= floor)
        if row not in after:
            assert not fresh.any(), "a row with a fresh trainable token left"
            excluded += int(before.sum())
            continue
        now = trainable_tokens(after[row].sample)
        assert (now == fresh).all()  # every fresh trainable token stays, no stale one trains
        mask = t.sample.loss_mask
        if mask is not None and not t.sample.remove_sample:  # what stays keeps its value (weights included)
            assert (after[row].sample.loss_mask.numpy()[fresh] == mask.numpy()[fresh]).all()
        excluded += int(before.sum()) - int(now.sum())
    assert decision.excluded_tokens == excluded


@PROPERTIES
@given(groups(), st.integers(0, 10), st.integers(0, 4), st.sampled_from(STALENESS_MODES))
def test_what_trains_keeps_the_reference_whole_group_advantages_bit_for_bit(group, version, bound, mode):
    samples = [t.sample for t in group]
    _, expected = reference.post_process_rewards(CONFIG, samples)
    decision = staleness_decision(group, mode, version, bound)
    for row, t in zip(decision.rows, trained(group, decision), strict=True):
        assert _bits(t.reward) == _bits(expected[row])
        assert t.group_rollout_count == group[row].group_rollout_count  # the whole group's statistics


@PROPERTIES
@given(groups(), st.integers(0, 10), st.integers(0, 4))
def test_group_mode_is_todays_rule_and_the_modes_agree_when_nothing_is_stale(group, version, bound):
    decision = staleness_decision(group, "group", version, bound)
    assert decision.skipped == is_stale(group, version, bound)
    if not decision.skipped:
        assert decision.rows == tuple(range(len(group)))
        for mode in STALENESS_MODES:
            assert staleness_decision(group, mode, version, bound) == decision
    skipped = {mode: staleness_decision(group, mode, version, bound).skipped for mode in STALENESS_MODES}
    assert skipped["rollout"] <= skipped["group"] and skipped["token"] <= skipped["group"]


# ---------------------------------------------------------------- what a group head says is enough


def _as_head_tells(t: TrainSample) -> TrainSample:
    """The sample as a reader folding group heads sees it (stream/reader/heads.py): no payload, the loss mask
    rebuilt from the loss tokens of each version span (or from the count of loss tokens, without spans)."""
    s = t.sample
    spans = span_loss_tokens(s)
    if spans is not None:
        assert s.weight_version_offsets is not None
        mask = spans_loss_mask(s.weight_version_offsets.tolist(), spans, s.response_length)
    else:
        mask = np.zeros(s.response_length, dtype=np.uint8)
        mask[:int(trainable_tokens(s).sum())] = 1
    outline = Sample(rollout_id=s.rollout_id, index=s.index, response_length=s.response_length,
                     loss_mask=mask, weight_versions=s.weight_versions,
                     weight_version_offsets=s.weight_version_offsets)
    return msgspec.structs.replace(t, sample=outline)


@PROPERTIES
@given(groups(), st.integers(0, 10), st.integers(0, 4), st.sampled_from(STALENESS_MODES))
def test_a_group_head_decides_as_the_payload_would(group, version, bound, mode):
    real = staleness_decision(group, mode, version, bound)
    told = staleness_decision([_as_head_tells(t) for t in group], mode, version, bound)
    assert told.rows == real.rows
    assert (told.excluded_rollouts, told.excluded_samples, told.excluded_tokens) == \
        (real.excluded_rollouts, real.excluded_samples, real.excluded_tokens)
    floor = version - bound
    if mode != "token":
        return
    for row, t in zip(real.rows, trained(group, real), strict=True):  # a fetched row, masked on its own
        alone = without_stale_tokens(group[row], floor).sample
        assert (trainable_tokens(alone) == trainable_tokens(t.sample)).all()


def test_span_loss_tokens_count_each_span() -> None:
    sample = _sample(["3", "4", "5"], [0, 0, 3], length=5, loss_mask=[1, 0, 1, 1, 1])
    assert span_loss_tokens(sample) == [0, 2, 2]
    assert spans_loss_mask([0, 0, 3], [0, 2, 2], 5).tolist() == [1, 1, 0, 1, 1]
    assert span_loss_tokens(_sample(["3"])) is None
    assert span_loss_tokens(_sample(["3"], [0], remove_sample=True)) == [0]


def test_token_version_rows_align_with_the_loss_mask() -> None:
    rows = token_version_rows([_train(_sample(["3", "5"], [0, 1], length=2)), _train(_sample([], length=3)),
                               _train(_sample(["x"], length=1)), _train(_sample(["7"], length=1))])
    assert rows.dtype == np.int64
    assert rows.tolist() == [[3, 5, -1], [-1, -1, -1], [-1, -1, -1], [7, -1, -1]]
    assert token_version_rows([]).shape == (0, 0)
