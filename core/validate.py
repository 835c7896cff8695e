"""Invariants a decoded rollout sample must hold to join a window (docs/spec.md §4.4, invalid_sample)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rollout_stream.codec import Array, Sample, group_key_of
from rollout_stream.codec.head import RolloutFields, ext_integers
from rollout_stream.core.rewards import RewardSelectionError, select_reward

__all__ = ["MAX_GROUP_SIZE", "MAX_SIBLING_COUNT", "SampleLimits", "validate_sample", "effective_group_size",
           "plainly_valid", "version_offsets_problem", "version_spans_problem"]

# The stage's limits: larger sizes are dead-lettered as invalid_sample instead of opening unbounded windows.
# The worker's --group-size and synth's --group-size are refused above MAX_GROUP_SIZE too.
MAX_GROUP_SIZE = 4096
MAX_SIBLING_COUNT = 1024


@dataclass(frozen=True, slots=True)
class SampleLimits:
    """Bounds that turn absurd sizes into dead-letters instead of unbounded windows."""

    default_group_size: int | None = None
    max_group_size: int = MAX_GROUP_SIZE
    max_sibling_count: int = MAX_SIBLING_COUNT


def effective_group_size(sample: Sample, limits: SampleLimits) -> int | None:
    return sample.group_size if sample.group_size is not None else limits.default_group_size


def _reward_problem(sample: Sample, reward_key: str | None) -> str | None:
    try:
        select_reward(sample.reward, reward_key, require_finite=True)
    except RewardSelectionError as exc:
        return str(exc)
    return None


def validate_sample(
    sample: Sample, *, key: bytes | None, reward_key: str | None, limits: SampleLimits
) -> str | None:
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
        return (
            f"loss_mask has {len(sample.loss_mask)} entries but response_length is {sample.response_length}"
        )
    if sample.tokens is not None and sample.response_length > len(sample.tokens):
        return f"response_length {sample.response_length} exceeds the {len(sample.tokens)} tokens"
    if sample.rollout_log_probs is not None and len(sample.rollout_log_probs) != sample.response_length:
        return (f"rollout_log_probs has {len(sample.rollout_log_probs)} entries but response_length is "
                f"{sample.response_length}")
    problem = _log_prob_problem(sample) or _sampling_mask_problem(sample) or version_spans_problem(sample)
    if problem is not None:
        return problem
    expected_key = group_key_of(sample.run_id, sample.group_index).encode()
    if key != expected_key:
        shown = key.decode("utf-8", "backslashreplace") if key is not None else None
        return f"record key {shown!r} is not the group key {expected_key.decode()!r}"
    return None


def _log_prob_problem(sample: Sample) -> str | None:
    """A NaN or infinite rollout log-prob on a token the loss uses (a non-zero loss mask; a missing mask is
    all ones, a removed sample has none): it would poison importance ratios and the gradient, every time the
    group is trained. Elsewhere it is left alone, as the trainer masks it out."""
    log_probs = sample.rollout_log_probs
    if log_probs is None or log_probs.dtype.kind != "f" or sample.remove_sample:
        return None
    values = log_probs.numpy()
    bad = ~np.isfinite(values)
    if not bad.any():
        return None
    if sample.loss_mask is not None:
        bad &= sample.loss_mask.numpy() != 0
        if not bad.any():
            return None
    token = int(np.argmax(bad))
    return (f"rollout_log_probs[{token}] is {values[token]} on a trainable response token "
            f"({int(bad.sum())} such tokens)")


def _sampling_mask_problem(sample: Sample) -> str | None:
    """The sampling mask (CSR over the response) must describe exactly the response's tokens: offsets start at
    0, never decrease, end at the number of ids, one more of them than response tokens."""
    ids, offsets = sample.rollout_sampling_mask_ids, sample.rollout_sampling_mask_offsets
    if ids is None and offsets is None:
        return None
    if ids is None or offsets is None:
        given = "rollout_sampling_mask_ids" if offsets is None else "rollout_sampling_mask_offsets"
        return f"{given} is set without its other half (the sampling mask needs ids and offsets)"
    for name, arr in (("rollout_sampling_mask_ids", ids), ("rollout_sampling_mask_offsets", offsets)):
        if arr.dtype.kind not in "iu":
            return f"{name} must hold integers, got {arr.dtype}"
    length = sample.response_length
    if len(offsets) != length + 1:
        return (f"rollout_sampling_mask_offsets has {len(offsets)} entries but a response of {length} tokens "
                f"needs {length + 1}")
    values = offsets.numpy().astype(np.int64, copy=False)
    if values[0] != 0:
        return f"rollout_sampling_mask_offsets must start at 0, got {int(values[0])}"
    if values[-1] != len(ids):
        return (f"rollout_sampling_mask_offsets ends at {int(values[-1])} but rollout_sampling_mask_ids has "
                f"{len(ids)} entries")
    falls = np.diff(values) < 0
    if falls.any():
        token = int(np.argmax(falls))
        return (f"rollout_sampling_mask_offsets decrease at response token {token} "
                f"({int(values[token])} then {int(values[token + 1])})")
    return None


def version_spans_problem(sample: Sample) -> str | None:
    """Why the sample's `weight_version_offsets` cannot say where each of its weight versions started, or None
    (also when it has none)."""
    offsets = sample.weight_version_offsets
    if offsets is None:
        return None
    if offsets.dtype.kind not in "iu":
        return f"weight_version_offsets must hold integers, got {offsets.dtype}"
    return version_offsets_problem(offsets, len(sample.weight_versions), sample.response_length)


class Offsets(Protocol):
    """Integers with a length: a list, an integer `Array`, a head's unpacked `Ext`."""

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[int]: ...


def version_offsets_problem(offsets: Offsets, versions: int, response_length: int) -> str | None:
    """Why `offsets` cannot be the response tokens at which each of `versions` weight versions started
    (`Sample.weight_version_offsets`), or None: one per version, the first 0, never decreasing, none past the
    response (an offset equal to `response_length` is a version that generated no token)."""
    if len(offsets) != versions:
        return (f"weight_version_offsets has {len(offsets)} entries but weight_versions has {versions} "
                "(one offset per version)")
    previous = 0
    for version, offset in enumerate(offsets):
        if version == 0 and offset != 0:
            return f"weight_version_offsets must start at 0, got {int(offset)}"
        if offset < previous:
            return f"weight_version_offsets decrease at version {version} ({previous} then {int(offset)})"
        if offset > response_length:
            return (f"weight_version_offsets[{version}] is {int(offset)}, past the response of "
                    f"{response_length} tokens")
        previous = int(offset)
    return None


def _integers(values: Any) -> Offsets | None:
    """A packed integer array's items (an `Array` of a `Sample`, an `Ext` of a `SampleHead`); None for a
    float or bool array."""
    if isinstance(values, Array):
        return values if values.dtype.kind in "iu" else None
    return ext_integers(values)


def _finite(values: Array) -> bool:
    return values.dtype.kind != "f" or bool(np.isfinite(values.numpy()).all())


def plainly_valid(
    sample: RolloutFields, key: bytes | None, reward_key: str | None, limits: SampleLimits,
    count: Callable[[Any], int] = len, finite: Callable[[Any], bool] = _finite,
) -> str | None:
    """The sample's group key when it is valid the common way (a finite float reward without a reward key,
    every size in range, its record keyed by its group), else None: then `validate_sample` says why, or
    that it is valid after all (an int or keyed reward). One pass of attribute loads instead of
    `validate_sample`'s calls; every check here is one of `validate_sample`'s, so a sample this accepts
    that one accepts too (tests/core/test_fast_paths.py checks it on random samples). `count` is how many
    items an array holds: `len` for a `Sample`, `rollout_stream.codec.head.item_count` for a `SampleHead`;
    `finite` whether
    one holds no NaN or infinity (`rollout_stream.codec.head.ext_all_finite` for a `SampleHead`). A sampling
    mask takes the full check; weight version offsets are checked here, on either.
    """
    reward = sample.reward
    group_index = sample.group_index
    if group_index is None or reward_key or type(reward) is not float or reward - reward != 0.0:
        return None  # reward - reward is 0.0 exactly when the reward is finite (NaN and ±inf give NaN)
    group_size = sample.group_size
    if group_size is None:
        group_size = limits.default_group_size
        if group_size is None:
            return None
    siblings = sample.sibling_count
    length = sample.response_length
    if not (0 < group_size <= limits.max_group_size and 0 < siblings <= limits.max_sibling_count
            and 0 <= sample.sibling_index < siblings and length >= 0):
        return None
    mask, tokens, log_probs = sample.loss_mask, sample.tokens, sample.rollout_log_probs
    if (mask is not None and count(mask) != length) or (tokens is not None and length > count(tokens)) \
            or (log_probs is not None and (count(log_probs) != length or not finite(log_probs))):
        return None
    if sample.rollout_sampling_mask_ids is not None or sample.rollout_sampling_mask_offsets is not None:
        return None
    version_offsets = sample.weight_version_offsets
    if version_offsets is not None:
        versions = len(sample.weight_versions)
        if count(version_offsets) != versions:
            return None
        values = _integers(version_offsets)
        if values is None or version_offsets_problem(values, versions, length) is not None:
            return None
    run_id = sample.run_id
    gkey = f"{run_id}/{group_index}" if run_id else str(group_index)  # codec's group_key_of, inlined
    return gkey if key == gkey.encode() else None
