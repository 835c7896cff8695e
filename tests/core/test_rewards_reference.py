"""Every case of the reference vectors (miles_vectors.json), with exact float equality."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout_stream.codec import Sample
from rollout_stream.core import (
    RewardConfig,
    SharedRewardError,
    SharedRewardViolation,
    normalize_group,
    post_process_rewards,
)
from rollout_stream.core.rewards import prompt_groups

VECTORS_PATH = Path(__file__).resolve().parent.parent / "data" / "miles_vectors.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text())


def _case_inputs(case: dict[str, Any]) -> tuple[list[Sample], RewardConfig, list[int] | None]:
    samples = [Sample(**fields) for fields in case["samples"]]
    return samples, RewardConfig(**case["config"]), case["prompt_group_sizes"]


def test_vectors_present() -> None:
    assert len(VECTORS) >= 18
    assert len({case["name"] for case in VECTORS}) == len(VECTORS)


@pytest.mark.parametrize("case", VECTORS, ids=[case["name"] for case in VECTORS])
def test_batch_api_matches_vector(case: dict[str, Any]) -> None:
    samples, cfg, sizes = _case_inputs(case)
    expected = case["expected"]
    if "error" in expected:
        with pytest.raises(SharedRewardError) as info:
            post_process_rewards(samples, cfg, sizes)
        assert str(info.value) == expected["error"]
        assert isinstance(info.value, ValueError)
        return
    raw, rewards = post_process_rewards(samples, cfg, sizes)
    assert raw == expected["raw"]
    assert rewards == expected["rewards"]  # exact: float32 values as Python floats
    assert all(type(value) is float for value in rewards) or not cfg.normalizes


@pytest.mark.parametrize("case", VECTORS, ids=[case["name"] for case in VECTORS])
def test_per_group_api_matches_vector(case: dict[str, Any]) -> None:
    """The stream's per-group function gives the same values (or the same message) group by group."""
    samples, cfg, sizes = _case_inputs(case)
    expected = case["expected"]
    results = [
        (rows, normalize_group([samples[row] for row in rows], cfg, rows=rows))
        for rows in prompt_groups(samples, cfg, sizes)
    ]
    violations = [result for _, result in results if isinstance(result, SharedRewardViolation)]
    if "error" in expected:
        assert violations[0].message == expected["error"]
        assert str(violations[0].to_error()) == expected["error"]
        return
    assert not violations
    raw: list[Any] = [None] * len(samples)
    rewards: list[Any] = [None] * len(samples)
    for rows, result in results:
        for position, row in enumerate(rows):
            raw[row] = result.raw[position]
            rewards[row] = result.rewards[position]
    assert raw == expected["raw"]
    assert rewards == expected["rewards"]
