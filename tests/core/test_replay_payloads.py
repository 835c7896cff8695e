"""Replay payloads on their way to a miles trainer: the sampling mask (CSR ids/offsets over the response),
routing and indexer replay in the producer's dtype, and rollout log-probs that must be finite where the loss
uses them. What the stage refuses is `invalid_sample` (decided by `rollout_stream.core.validate`), on both
record paths (`take` of the bytes, with the C scan where built, and `accept` of a decoded sample)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import (
    Sample,
    TrainSample,
    decode_sample,
    decode_train_sample,
    encode_sample,
    encode_train_sample,
)
from rollout_stream.core import RewardConfig
from rollout_stream.core.miles import split_by_dp, train_data, trainer_shard
from rollout_stream.core.records import DeadLettered, InputRecord, Published
from rollout_stream.core.validate import SampleLimits, validate_sample
from rollout_stream.core.windows import WindowConfig, WindowStore


def _sample(rl: int = 3, **kw: object) -> Sample:
    fields: dict[str, object] = {"group_index": 0, "index": 0, "rollout_id": 0, "reward": 1.0,
                                 "group_size": 1, "tokens": list(range(rl + 2)), "response_length": rl}
    fields.update(kw)
    return Sample(**fields)  # type: ignore[arg-type]


def _csr(supports: list[list[int]]) -> dict[str, object]:
    offsets = [0]
    for support in supports:
        offsets.append(offsets[-1] + len(support))
    return {"rollout_sampling_mask_ids": np.array([i for s in supports for i in s], dtype=np.int32),
            "rollout_sampling_mask_offsets": np.array(offsets, dtype=np.int32)}


def _problem(sample: Sample) -> str | None:
    return validate_sample(sample, key=b"0", reward_key=None, limits=SampleLimits())


def _taken(sample: Sample) -> list[object]:
    """What a window store decides for the sample's record bytes (fast paths included)."""
    store = WindowStore(WindowConfig(reward=RewardConfig(), limits=SampleLimits(), group_timeout_ms=10_000))
    return store.take(InputRecord("rollouts", 0, 0, 1_000, b"0", encode_sample(sample)), 2_000)


# ---- sampling masks --------------------------------------------------------------------------------
def test_a_valid_sampling_mask_passes_and_an_empty_support_is_allowed() -> None:
    assert _problem(_sample(**_csr([[5, 6], [], [7]]))) is None
    assert _problem(_sample(rl=0, **_csr([]))) is None
    (out,) = _taken(_sample(**_csr([[5, 6], [9], [7]])))
    assert isinstance(out, Published)


@pytest.mark.parametrize(("ids", "offsets", "fragment"), [
    ([5, 6, 7], None, "without its other half"),
    (None, [0, 1, 2, 3], "without its other half"),
    ([5, 6, 7], [0, 1, 3], "needs 4"),  # one row short of the response
    ([5, 6, 7], [0, 1, 2, 3, 3], "needs 4"),  # a row past the response
    ([5, 6, 7], [1, 1, 2, 3], "start at 0"),
    ([5, 6, 7], [0, 1, 2, 2], "ends at 2"),
    ([5, 6, 7], [0, 2, 1, 3], "decrease at response token 1"),
    ([5.0, 6.0], [0, 1, 1, 2], "must hold integers"),
])
def test_a_broken_sampling_mask_is_an_invalid_sample(ids: list[float] | None, offsets: list[int] | None,
                                                     fragment: str) -> None:
    sample = _sample(rollout_sampling_mask_ids=ids, rollout_sampling_mask_offsets=offsets)
    problem = _problem(sample)
    assert problem is not None and fragment in problem
    (out,) = _taken(sample)
    assert isinstance(out, DeadLettered) and out.reason is R.INVALID_SAMPLE and fragment in out.message


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**31 - 1), max_size=4), max_size=6))
def test_any_csr_of_the_response_is_valid_and_survives_the_wire(supports: list[list[int]]) -> None:
    sample = _sample(rl=len(supports), **_csr(supports))
    assert _problem(sample) is None
    back = decode_sample(encode_sample(sample))
    ids, offsets = back.rollout_sampling_mask_ids, back.rollout_sampling_mask_offsets
    assert ids is not None and offsets is not None
    assert [ids.tolist()[offsets[t]:offsets[t + 1]] for t in range(len(supports))] == supports


# ---- non-finite rollout log-probs --------------------------------------------------------------------
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("dtype", ["<f4", "<f8"])
def test_a_non_finite_log_prob_on_a_trainable_token_is_an_invalid_sample(bad: float, dtype: str) -> None:
    sample = _sample(rollout_log_probs=np.array([-0.5, bad, -0.1], dtype=dtype), loss_mask=[1, 1, 0])
    problem = _problem(sample)
    assert problem is not None and "rollout_log_probs[1]" in problem
    (out,) = _taken(sample)
    assert isinstance(out, DeadLettered) and out.reason is R.INVALID_SAMPLE


@pytest.mark.parametrize("kw", [
    {"loss_mask": [1, 0, 1]},  # the loss never looks at it
    {"loss_mask": [1, 1, 1], "remove_sample": True},  # nothing of it is trained
])
def test_a_non_finite_log_prob_the_loss_ignores_is_left_alone(kw: dict[str, object]) -> None:
    sample = _sample(rollout_log_probs=np.array([-0.5, math.nan, -0.1], dtype="<f4"), **kw)
    assert _problem(sample) is None
    (out,) = _taken(sample)
    assert isinstance(out, Published)


def test_a_missing_loss_mask_makes_every_token_trainable() -> None:
    assert _problem(_sample(rollout_log_probs=[-0.5, -math.inf, -0.1])) is not None


# ---- dtypes end to end, and the miles layout ---------------------------------------------------------
def _published(sample: Sample, offset: int) -> TrainSample:
    """The train record the stage writes for a one-sample group, decoded as a reader does."""
    train = TrainSample(sample=sample, raw_reward=1.0, reward=0.0, group_key="0", group_rollout_count=1,
                        group_sample_count=1, group_mean=1.0, group_std=0.0, zero_variance=True,
                        advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                        reward_key=None, source_topic="rollouts", source_partition=0, source_offset=offset)
    return decode_train_sample(encode_train_sample(train))


@pytest.mark.parametrize("dtype", ["<u1", "<u2", "<i4"])
def test_routing_and_indexer_replay_keep_the_producers_dtype_into_the_miles_layout(dtype: str) -> None:
    rng = np.random.default_rng(7)
    experts = rng.integers(0, np.iinfo(dtype).max if dtype != "<i4" else 384, (4, 3, 2)).astype(dtype)
    topk = rng.integers(0, 200, (4, 2, 5)).astype(dtype)
    rows = [_published(_sample(rollout_id=i, index=i, rollout_routed_experts=experts,
                               rollout_indexer_topk=topk, **_csr([[1, 2], [3], [4, 5, 6]])), i)
            for i in range(4)]
    for arrays in (False, True):
        data = train_data(rows, arrays=arrays)
        for got in (*data["rollout_routed_experts"], *data["rollout_indexer_topk"]):
            assert got.dtype == np.dtype(dtype)
        assert np.array_equal(data["rollout_routed_experts"][0], experts)
        assert np.array_equal(data["rollout_indexer_topk"][3], topk)
        # miles' RolloutSamplingMask: int32 ids, int64 offsets
        assert all(a.dtype == np.int32 for a in data["rollout_sampling_mask_ids"])
        assert all(a.dtype == np.int64 for a in data["rollout_sampling_mask_offsets"])
        assert data["rollout_sampling_mask_ids"][2].tolist() == [1, 2, 3, 4, 5, 6]
        assert data["rollout_sampling_mask_offsets"][2].tolist() == [0, 2, 3, 6]
        shard = trainer_shard(split_by_dp(data, 2)[1])
        assert [a.tolist() for a in shard["rollout_sampling_mask_offsets"]] == [[0, 2, 3, 6]] * 2


def test_a_batch_whose_later_row_has_no_sampling_mask_is_refused_as_miles_refuses_it() -> None:
    rows = [_published(_sample(**_csr([[1], [2], [3]])), 0), _published(_sample(index=1, rollout_id=1), 1)]
    with pytest.raises(ValueError, match="row 1: no sampling mask"):
        train_data(rows)


def test_from_miles_carries_the_sampling_mask() -> None:
    miles = {"group_index": 0, "tokens": [1, 2, 3], "response_length": 2, "reward": 1.0,
             "rollout_sampling_mask_ids": [4, 5, 6], "rollout_sampling_mask_offsets": [0, 1, 3]}
    sample = Sample.from_miles(miles, group_size=1)
    assert sample.rollout_sampling_mask_ids == [4, 5, 6]
    assert sample.rollout_sampling_mask_offsets is not None
    assert sample.rollout_sampling_mask_offsets.dtype == np.int32
