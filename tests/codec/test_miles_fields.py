"""The fields miles trainers read (teacher_log_probs, opd_reverse_kl, routed experts, indexer top-k,
train_metadata), old records without them, and `Sample.from_miles`."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rollout_stream.codec import (
    DecodeError,
    Sample,
    ShapedArray,
    TrainSample,
    decode_sample,
    decode_train_sample,
    encode_sample,
    encode_train_sample,
)
from rollout_stream.core.collate import collate

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "wire_records_before_miles_fields.json"
NEW_FIELDS = ("teacher_log_probs", "opd_reverse_kl", "rollout_routed_experts", "rollout_indexer_topk",
              "train_metadata")


def old_records() -> dict[str, tuple[str, bytes]]:
    doc = json.loads(FIXTURE.read_text())
    return {r["name"]: (r["kind"], bytes.fromhex(r["hex"])) for r in doc["records"]}


# ---------------------------------------------------------------- records written before the fields existed


@pytest.mark.parametrize("name", sorted(old_records()))
def test_records_from_before_the_miles_fields_still_decode(name: str) -> None:
    kind, data = old_records()[name]
    record = decode_sample(data) if kind == "sample" else decode_train_sample(data)
    sample = record if isinstance(record, Sample) else record.sample
    for field_name in NEW_FIELDS:
        assert getattr(sample, field_name) is None
    # Re-encoded by this version, the record reads back the same.
    again = decode_sample(encode_sample(sample))
    assert again == sample


def test_an_old_record_keeps_its_values() -> None:
    _, data = old_records()["full_sample"]
    sample = decode_sample(data)
    assert (sample.group_index, sample.index, sample.rollout_id) == (3, 17, "r-17")
    assert sample.status == "truncated"
    assert sample.tokens == list(range(12)) and sample.tokens.dtype == np.int32
    assert sample.rollout_log_probs == np.array([-0.1, -0.2, -0.3, -0.4], dtype=np.float32)
    assert sample.metadata == {"turn": 2, "tool": None, "raw_reward": 0.5, "round_number": 4}
    assert decode_sample(old_records()["minimal_sample"][1]).reward == {"acc": 0.25, "fmt": 1.0}


def test_an_old_train_sample_still_collates() -> None:
    _, data = old_records()["train_sample_embedding_raw"]
    batch = collate([decode_train_sample(data)])
    assert batch.tokens.shape == (1, 12) and float(batch.loss_mask.sum()) == 3.0
    # Its miles layout: tests/core/test_miles.py::test_an_old_record_still_builds_miles_train_data


# ---------------------------------------------------------------- the new fields on the wire


def test_new_fields_round_trip_exactly() -> None:
    experts = np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4)
    sample = Sample(
        group_index=0, tokens=[1, 2, 3], response_length=2, reward=1.0,
        teacher_log_probs=np.array([-0.5, -1.25], dtype=np.float32),
        opd_reverse_kl=[0.1, 0.2],
        rollout_routed_experts=experts,
        rollout_indexer_topk=ShapedArray.of(np.zeros((2, 1, 3), dtype=np.int64)),
        train_metadata={"loss": "sft", "weight": 0.5},
    )
    back = decode_sample(encode_sample(sample))
    assert back == sample
    assert back.teacher_log_probs.dtype == np.float32
    assert back.opd_reverse_kl.dtype == np.float64
    assert [struct.pack("<d", v) for v in back.opd_reverse_kl] == [struct.pack("<d", v) for v in (0.1, 0.2)]
    assert back.rollout_routed_experts.numpy().dtype == np.int32
    assert np.array_equal(back.rollout_routed_experts.numpy(), experts)
    assert back.rollout_indexer_topk.numpy().shape == (2, 1, 3)
    assert back.train_metadata == {"loss": "sft", "weight": 0.5}


def test_shaped_arrays_from_lists_and_their_checks() -> None:
    nested = ShapedArray.of([[1, 2, 3], [4, 5, 6]])
    assert nested.shape == (2, 3) and nested.dtype == np.int32
    assert ShapedArray.of([]).shape == (0,)
    with pytest.raises(ValueError, match=r"shape \[2, 2\] holds 4 items, not 3"):
        ShapedArray(values=[1, 2, 3], shape=(2, 2))


def test_a_shape_that_does_not_fit_its_values_is_a_decode_error() -> None:
    good = encode_sample(Sample(group_index=0, rollout_routed_experts=np.zeros((2, 2), dtype=np.int32)))
    bad = good.replace(b"\xa5shape\x92\x02\x02", b"\xa5shape\x92\x02\x03")
    assert bad != good
    with pytest.raises(DecodeError, match="rollout_routed_experts"):
        decode_sample(bad)
    negative = good.replace(b"\xa5shape\x92\x02\x02", b"\xa5shape\x92\xff\xfc")
    with pytest.raises(DecodeError, match=r"rollout_routed_experts.shape"):
        decode_sample(negative)


def test_train_sample_carries_the_new_fields_through_its_embedded_bytes() -> None:
    raw = encode_sample(Sample(group_index=0, tokens=[1, 2], response_length=1, reward=0.0,
                               teacher_log_probs=[-0.75], train_metadata={"k": 1}))
    ts = TrainSample(
        sample=decode_sample(raw), raw_reward=0.0, reward=0.0, group_key="0", group_rollout_count=1,
        group_sample_count=1, group_mean=0.0, group_std=0.0, zero_variance=True, advantage_estimator="grpo",
        rewards_normalization=True, grpo_std_normalization=True, reward_key=None, source_topic="t",
        source_partition=0, source_offset=0,
    )
    back = decode_train_sample(encode_train_sample(ts, raw_sample=raw))
    assert back.sample.teacher_log_probs == [-0.75] and back.sample.train_metadata == {"k": 1}


# ---------------------------------------------------------------- Sample.from_miles


class Status(Enum):  # miles.utils.types.Sample.Status
    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass
class MilesLike:
    """The attributes of a miles `Sample` that matter here, with miles' defaults."""

    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
    prompt: Any = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: Any = None
    multimodal_train_inputs: Any = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: Any = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: Any = None
    rollout_indexer_topk: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    opd_reverse_kl: list[float] | None = None
    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    train_metadata: dict | None = None
    adapter: Any = None
    routing_key: str | None = None
    non_generation_time: float = 0.0


def miles_like(**overrides: Any) -> MilesLike:
    fields: dict[str, Any] = dict(
        group_index=4, index=9, rollout_id=21, prompt="What is 2+2?", tokens=[11, 12, 13, 14],
        response="4", response_length=2, label="4", reward=1.0, loss_mask=[1, 0],
        weight_versions=["7"], rollout_log_probs=[-0.1, -0.2], remove_sample=False,
        teacher_log_probs=[-0.3, -0.4], opd_reverse_kl=[0.01, 0.02],
        rollout_routed_experts=np.arange(3 * 2 * 2, dtype=np.int32).reshape(3, 2, 2),
        status=Status.TRUNCATED, metadata={"raw_reward": 0.5}, train_metadata={"loss": "pg"},
        routing_key="ignored", non_generation_time=1.5,
    )
    fields.update(overrides)
    return MilesLike(**fields)


def test_from_miles_reads_an_object() -> None:
    obj = miles_like()
    sample = Sample.from_miles(obj, group_size=8, sibling_count=2, sibling_index=1, run_id="run")
    assert (sample.group_index, sample.index, sample.rollout_id) == (4, 9, 21)
    assert (sample.prompt, sample.response, sample.label) == ("What is 2+2?", "4", "4")
    assert sample.tokens == [11, 12, 13, 14] and sample.response_length == 2
    assert sample.reward == 1.0 and sample.status == "truncated" and sample.remove_sample is False
    assert sample.loss_mask == [1, 0] and sample.weight_versions == ["7"]
    assert sample.rollout_log_probs.tolist() == [-0.1, -0.2] and sample.rollout_log_probs.dtype == np.float64
    assert sample.teacher_log_probs.tolist() == [-0.3, -0.4]
    assert sample.opd_reverse_kl.tolist() == [0.01, 0.02]
    assert np.array_equal(sample.rollout_routed_experts.numpy(), obj.rollout_routed_experts)
    assert sample.rollout_indexer_topk is None
    assert sample.metadata == {"raw_reward": 0.5} and sample.train_metadata == {"loss": "pg"}
    assert (sample.group_size, sample.sibling_count, sample.sibling_index, sample.run_id) == (8, 2, 1, "run")
    assert decode_sample(encode_sample(sample)) == sample
    # The miles sample is left as it was (metadata copied, not shared).
    sample.metadata["x"] = 1
    assert obj.metadata == {"raw_reward": 0.5}


def test_from_miles_reads_a_dict_like_sample_to_dict() -> None:
    as_dict = {**miles_like().__dict__, "status": "completed", "spec_info": {"spec_verify_ct": 0},
               "prefix_cache_info": {"cached_tokens": 0}, "unknown_future_field": 1}
    sample = Sample.from_miles(as_dict)
    assert sample.status == "completed" and sample.rollout_id == 21 and sample.tokens == [11, 12, 13, 14]
    assert (sample.group_size, sample.sibling_count, sample.sibling_index) == (None, 1, 0)
    assert sample.run_id is None


def test_from_miles_with_only_a_few_keys_takes_miles_defaults() -> None:
    sample = Sample.from_miles({"group_index": 0, "tokens": [1, 2], "response_length": 1, "reward": 0.0})
    assert sample.status == "pending"  # miles' default status
    assert sample.loss_mask is None and sample.rollout_log_probs is None and sample.train_metadata is None
    assert sample.metadata == {} and sample.weight_versions == [] and sample.prompt == ""


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (Status.TRUNCATED, "truncated"),
        ("aborted", "aborted"),
        ("FAILED", "failed"),
        (Status.PENDING, "pending"),
    ],
)
def test_from_miles_status_enum_value_or_name(status: Any, expected: str) -> None:
    assert Sample.from_miles(miles_like(status=status)).status == expected


@pytest.mark.parametrize("status", ["done", None, 3])
def test_from_miles_refuses_unknown_statuses(status: Any) -> None:
    with pytest.raises(ValueError, match="status must be a miles Sample.Status"):
        Sample.from_miles(miles_like(status=status))


@pytest.mark.parametrize(
    ("reward", "expected"),
    [
        (0.25, 0.25),
        (3, 3),
        (np.float32(0.1), float(np.float32(0.1))),
        ({"acc": 1.0, "fmt": np.int64(2)}, {"acc": 1.0, "fmt": 2}),
        (None, None),
    ],
)
def test_from_miles_rewards(reward: Any, expected: Any) -> None:
    sample = Sample.from_miles(miles_like(reward=reward))
    assert sample.reward == expected
    assert decode_sample(encode_sample(sample)).reward == expected


def test_from_miles_keeps_float_rewards_bit_for_bit() -> None:
    value = float(np.float32(0.1))
    back = decode_sample(encode_sample(Sample.from_miles(miles_like(reward={"acc": value}))))
    assert struct.pack("<d", back.reward["acc"]) == struct.pack("<d", value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"reward": True}, "reward must be a number"),
        ({"reward": "1.0"}, "reward must be a number"),
        ({"reward": {"acc": 1.0, "pred": "4"}}, r"reward\['pred'\] must be a number"),
        ({"reward": {1: 1.0}}, "reward keys must be strings"),
        ({"multimodal_train_inputs": {"pixel_values": [1]}}, "multimodal_train_inputs is set"),
        ({"adapter": object()}, "adapter is set"),
        ({"weight_versions": [3]}, "weight_versions must be strings"),
        ({"metadata": [1]}, "metadata must be a mapping"),
        ({"train_metadata": "pg"}, "train_metadata must be a mapping"),
    ],
)
def test_from_miles_refuses_what_the_wire_cannot_carry(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sample.from_miles(miles_like(**overrides))


def test_from_miles_chat_prompts_travel_as_json() -> None:
    messages = [{"role": "user", "content": "2+2? é"}]
    sample = Sample.from_miles(miles_like(prompt=messages, multimodal_inputs={"images": ["x.png"]}))
    assert json.loads(sample.prompt) == messages and "é" in sample.prompt
