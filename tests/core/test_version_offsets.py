"""`weight_version_offsets` (the response token at which each weight version started) in validation
(`invalid_sample` with a readable message), through the stage (chunked or not, fast path or full decode,
dead-lettered with its bytes, replayed), in the train sample, and in the miles layout (one key more). The
wire: tests/codec/test_version_spans_wire.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from rollout_stream.codec import (
    DeadLetterReason,
    Sample,
    TrainSample,
    decode_train_sample,
    encode_sample,
    encode_train_samples,
    group_key,
)
from rollout_stream.codec.chunks import CHUNK_HEADER, split
from rollout_stream.core.config import RewardConfig
from rollout_stream.core.miles import train_data
from rollout_stream.core.records import DeadLettered, InputRecord, Published
from rollout_stream.core.validate import SampleLimits, validate_sample
from rollout_stream.core.windows import REPLAY_ID_HEADER, WindowConfig, WindowStore


def _sample(**fields: Any) -> Sample:
    base: dict[str, Any] = {"group_index": 3, "run_id": "run", "rollout_id": 0, "reward": 1.0,
                            "group_size": 1, "tokens": [1] * 6, "response_length": 4,
                            "loss_mask": [1, 1, 0, 1], "weight_versions": ["3", "5"],
                            "weight_version_offsets": [0, 2]}
    return Sample(**(base | fields))


def _train(sample: Sample) -> TrainSample:
    return TrainSample(sample=sample, raw_reward=1.0, reward=0.0, group_key="run/3", group_rollout_count=1,
                       group_sample_count=1, group_mean=1.0, group_std=0.0, zero_variance=True,
                       advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                       reward_key=None, source_topic="rollouts", source_partition=0, source_offset=0)


def _problem(sample: Sample) -> str | None:
    return validate_sample(sample, key=group_key(sample), reward_key=None, limits=SampleLimits())


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("fields", [
    {},
    {"weight_version_offsets": None},  # absent: the whole response under the listed versions
    {"weight_versions": ["3", "4", "5"], "weight_version_offsets": [0, 0, 4]},  # empty spans, an empty tail
    {"weight_versions": ["3"], "weight_version_offsets": [0], "response_length": 0, "loss_mask": []},
    {"weight_versions": [], "weight_version_offsets": []},
    {"weight_version_offsets": np.array([0, 3], dtype="<u1")},
])
def test_offsets_that_fit_are_valid(fields: dict[str, Any]) -> None:
    assert _problem(_sample(**fields)) is None


@pytest.mark.parametrize(("fields", "message"), [
    ({"weight_version_offsets": [0]},
     "weight_version_offsets has 1 entries but weight_versions has 2 (one offset per version)"),
    ({"weight_versions": [], "weight_version_offsets": [0]},
     "weight_version_offsets has 1 entries but weight_versions has 0 (one offset per version)"),
    ({"weight_version_offsets": [1, 2]}, "weight_version_offsets must start at 0, got 1"),
    ({"weight_versions": ["3", "4", "5"], "weight_version_offsets": [0, 3, 2]},
     "weight_version_offsets decrease at version 2 (3 then 2)"),
    ({"weight_version_offsets": [0, 5]}, "weight_version_offsets[1] is 5, past the response of 4 tokens"),
    ({"weight_version_offsets": np.array([0, -1], dtype="<i8")},
     "weight_version_offsets decrease at version 1 (0 then -1)"),
    ({"weight_version_offsets": [0.0, 2.0]}, "weight_version_offsets must hold integers, got float64"),
])
def test_offsets_that_do_not_fit_are_an_invalid_sample(fields: dict[str, Any], message: str) -> None:
    assert _problem(_sample(**fields)) == message


# ---------------------------------------------------------------- through the stage


def _records(sample: Sample, chunk: int | None) -> list[InputRecord]:
    value = encode_sample(sample)
    if chunk is None:
        return [InputRecord("rollouts", 0, 0, 1_000, group_key(sample), value)]
    return [InputRecord("rollouts", 0, i, 1_000, group_key(sample), part, ((CHUNK_HEADER, header),))
            for i, (header, part) in enumerate(split(value, chunk))]


@pytest.mark.parametrize("chunk", [None, 40])
def test_the_stage_publishes_the_offsets_unchanged_and_dead_letters_bad_ones_with_their_bytes(chunk) -> None:
    config = WindowConfig(reward=RewardConfig(), group_timeout_ms=10_000)
    good, bad = _sample(), _sample(weight_version_offsets=[0, 9])
    (out,) = _take_all(config, _records(good, chunk))
    assert isinstance(out, Published)
    (member,) = out.members
    assert member.record.value == encode_sample(good)
    (value,) = encode_train_samples(_train(good), [member.record.value], [1.0], [0.0], [0])
    assert decode_train_sample(value).sample.weight_version_offsets == [0, 2]

    (dead,) = _take_all(config, _records(bad, chunk))
    assert isinstance(dead, DeadLettered) and dead.reason == DeadLetterReason.INVALID_SAMPLE
    assert dead.message == "weight_version_offsets[1] is 9, past the response of 4 tokens"
    assert b"".join(r.value or b"" for r in dead.records) == encode_sample(bad)


def test_a_dead_lettered_spanned_sample_replayed_publishes_its_spans_unchanged() -> None:
    """A group times out with one member (`incomplete_group`), its other member comes late (`late_member`);
    `dlq replay` sends both dead letters' bytes back under one replay id, and the group publishes, spans
    and all, byte for byte."""
    config = WindowConfig(reward=RewardConfig(), group_timeout_ms=10_000)
    first = _sample(group_size=2)
    late = _sample(group_size=2, rollout_id=1, reward=0.0, weight_versions=["4", "6", "7"],
                   weight_version_offsets=[0, 1, 3])
    store = WindowStore(config)
    assert store.take(_records(first, None)[0], 1_000) == []
    (timed_out,) = store.expire(20_000, {0})
    (came_late,) = store.take(InputRecord("rollouts", 0, 1, 25_000, group_key(late), encode_sample(late)),
                              25_000)
    assert [d.reason for d in (timed_out, came_late)] == [DeadLetterReason.INCOMPLETE_GROUP,
                                                           DeadLetterReason.LATE_MEMBER]
    replay = ((REPLAY_ID_HEADER, b"r1"),)
    values = [r.value for d in (timed_out, came_late) for r in d.records]
    records = [InputRecord("rollouts", 0, 5 + i, 30_000, group_key(first), v, replay)
               for i, v in enumerate(values)]
    (out,) = [o for r in records for o in store.take(r, 30_000)]
    assert isinstance(out, Published)
    assert sorted(m.record.value for m in out.members) == sorted([encode_sample(first), encode_sample(late)])


def _take_all(config: WindowConfig, records: list[InputRecord]) -> list[Any]:
    store = WindowStore(config)
    return [o for r in records for o in store.take(r, 2_000)]


# ---------------------------------------------------------------- miles


def test_the_miles_layout_carries_the_offsets_as_one_key_more() -> None:
    """miles' keys are unchanged; the spans ride in `weight_version_offsets`, which miles' code ignores."""
    with_offsets = train_data([_train(_sample())])
    without = train_data([_train(_sample(weight_version_offsets=None))])
    offsets = with_offsets.pop("weight_version_offsets")
    assert offsets == [_sample().weight_version_offsets.tolist()]
    assert with_offsets.keys() == without.keys() and with_offsets == without
    assert with_offsets["weight_versions"] == [["3", "5"]]


def test_from_miles_takes_the_offsets_when_a_sample_carries_them() -> None:
    fields = {"group_index": 1, "tokens": [1, 2, 3], "response_length": 2, "reward": 1.0,
              "weight_versions": ["1", "2"]}
    assert Sample.from_miles(fields).weight_version_offsets is None
    assert Sample.from_miles(fields | {"weight_version_offsets": [0, 1]}).weight_version_offsets == [0, 1]
