"""Invariants a decoded rollout sample must hold before it may join a window (SPEC §4.4 invalid_sample)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from codec import Sample, group_key_of

__all__ = ["SampleLimits", "validate_sample", "effective_group_size", "rollout_key"]


@dataclass(frozen=True, slots=True)
class SampleLimits:
    """Bounds that turn absurd sizes into dead-letters instead of unbounded windows."""

    default_group_size: int | None = None
    max_group_size: int = 4096
    max_sibling_count: int = 1024


def effective_group_size(sample: Sample, limits: SampleLimits) -> int | None:
    return sample.group_size if sample.group_size is not None else limits.default_group_size


def rollout_key(sample: Sample) -> object | None:
    """SPEC §2.4: rollout_id, else index; None means the row is a rollout of its own."""
    if sample.rollout_id is not None:
        return sample.rollout_id
    return sample.index


def _reward_problem(sample: Sample, reward_key: str | None) -> str | None:
    reward = sample.reward
    if reward is None:
        return "reward is missing"
    if reward_key is None:
        if isinstance(reward, dict):
            return "reward is a mapping but no --reward-key is configured"
        value = reward
    else:
        if not isinstance(reward, dict):
            return f"reward_key {reward_key!r} is set but reward is a {type(reward).__name__}, not a mapping"
        if reward_key not in reward:
            return f"reward has no key {reward_key!r} (keys: {sorted(reward)!r})"
        value = reward[reward_key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"selected reward is a {type(value).__name__}, not a number"
    if not math.isfinite(value):
        return f"selected reward is {value!r}; rewards must be finite"
    return None


def validate_sample(sample: Sample, *, key: bytes | None, reward_key: str | None, limits: SampleLimits) -> str | None:
    """Return a readable reason the sample is invalid, or None when it may join its window."""
    if sample.group_index is None:
        return "group_index is missing"
    problem = _reward_problem(sample, reward_key)
    if problem is not None:
        return problem
    group_size = effective_group_size(sample, limits)
    if group_size is None:
        return "group_size is unset in the record and the stage has no --group-size default"
    if group_size < 1:
        return f"group_size {group_size} is below 1"
    if group_size > limits.max_group_size:
        return f"group_size {group_size} exceeds the stage limit {limits.max_group_size}"
    if sample.sibling_count < 1:
        return f"sibling_count {sample.sibling_count} is below 1"
    if sample.sibling_count > limits.max_sibling_count:
        return f"sibling_count {sample.sibling_count} exceeds the stage limit {limits.max_sibling_count}"
    if not 0 <= sample.sibling_index < sample.sibling_count:
        return f"sibling_index {sample.sibling_index} is outside 0..{sample.sibling_count - 1}"
    if sample.response_length < 0:
        return f"response_length {sample.response_length} is negative"
    if sample.loss_mask is not None and len(sample.loss_mask) != sample.response_length:
        return f"loss_mask has {len(sample.loss_mask)} entries but response_length is {sample.response_length}"
    if sample.tokens is not None and sample.response_length > len(sample.tokens):
        return f"response_length {sample.response_length} exceeds the {len(sample.tokens)} tokens"
    if sample.rollout_log_probs is not None and len(sample.rollout_log_probs) != sample.response_length:
        return (f"rollout_log_probs has {len(sample.rollout_log_probs)} entries but response_length is "
                f"{sample.response_length}")
    expected_key = group_key_of(sample.run_id, sample.group_index).encode()
    if key != expected_key:
        shown = key.decode("utf-8", "backslashreplace") if key is not None else None
        return f"record key {shown!r} is not the group key {expected_key.decode()!r}"
    return None
