"""Hand-derived reference cases (tests/data/miles_cases.json) for core/miles.py: train_data, split_by_dp,
trainer_shard. Rows go through the wire first, as a reader would get them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rollout_stream.codec import Sample, TrainSample, decode_train_sample, encode_train_sample
from rollout_stream.core.miles import split_by_dp, train_data, trainer_shard

CASES = json.loads((Path(__file__).resolve().parents[1] / "data" / "miles_cases.json").read_text())["cases"]


def materialize(value: Any) -> Any:
    """JSON stand-ins to Python values: {"ndarray": dtype, "values": ...} and {"range": [a, b, c]}."""
    if isinstance(value, dict):
        if set(value) == {"ndarray", "values"}:
            return np.array(value["values"], dtype=value["ndarray"])
        if set(value) == {"range"}:
            return range(*value["range"])
        return {key: materialize(item) for key, item in value.items()}
    if isinstance(value, list):
        return [materialize(item) for item in value]
    return value


def assert_same(ours: Any, expected: Any, path: str = "$") -> None:
    """Equal values of equal types (ints stay ints, floats compared by bits, key order included)."""
    if isinstance(expected, np.ndarray):
        assert isinstance(ours, np.ndarray) and ours.dtype == expected.dtype, path
        assert ours.shape == expected.shape and np.array_equal(ours, expected), path
        return
    assert type(ours) is type(expected), f"{path}: {type(ours).__name__} != {type(expected).__name__}"
    if isinstance(expected, float):
        assert struct.pack("<d", ours) == struct.pack("<d", expected), f"{path}: {ours!r} != {expected!r}"
    elif isinstance(expected, dict):
        assert list(ours) == list(expected), f"{path}: keys {list(ours)} != {list(expected)}"
        for key in expected:
            assert_same(ours[key], expected[key], f"{path}.{key}")
    elif isinstance(expected, list):
        assert len(ours) == len(expected), f"{path}: {len(ours)} != {len(expected)} items"
        for i, (a, b) in enumerate(zip(ours, expected, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert ours == expected, f"{path}: {ours!r} != {expected!r}"


def published(row: dict[str, Any], offset: int) -> TrainSample:
    ts = TrainSample(
        sample=Sample(**materialize(row["sample"])), raw_reward=row["raw_reward"], reward=row["reward"],
        group_key="g", group_rollout_count=1, group_sample_count=1, group_mean=0.0, group_std=0.0,
        zero_variance=False, advantage_estimator="grpo", rewards_normalization=True,
        grpo_std_normalization=True, reward_key=None, source_topic="rollouts", source_partition=0,
        source_offset=offset,
    )
    return decode_train_sample(encode_train_sample(ts))


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_miles_case(case: dict[str, Any]) -> None:
    samples = [published(row, offset) for offset, row in enumerate(case["rows"])]
    data = train_data(samples, prompt_group_sizes=case.get("prompt_group_sizes"))
    if "train_data" in case:
        assert_same(data, materialize(case["train_data"]))
    for split in case["splits"]:
        shards = split_by_dp(data, split["dp_size"], balance_data=split["balance_data"])
        finished = [trainer_shard(shard) for shard in shards]
        where = f"dp_size={split['dp_size']} balance_data={split['balance_data']}"
        if "shards" in split:
            assert_same(shards, materialize(split["shards"]), where)
        if "partitions" in split:
            assert_same([shard["partition"] for shard in shards], materialize(split["partitions"]), where)
        if "trainer_shards" in split:
            assert_same(finished, materialize(split["trainer_shards"]), where)
        if "trainer_total_lengths" in split:
            assert_same([shard["total_lengths"] for shard in finished], split["trainer_total_lengths"], where)
