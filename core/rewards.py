"""Reward post-processing: shared-reward check and per-prompt-group normalization (SPEC §2).

Bit-identical to the reference trainer (radixark/miles, `miles/ray/rollout/train_data_conversion.py`,
`_post_process_rewards` / `_normalize_rewards_by_rollout` after PR #2498): the same torch float32
operations, in the same order, on the same per-rollout lists.

Exceptions::

    ValueError
     ├── RewardSelectionError   a sample's raw reward cannot be selected (missing, shape, not a number)
     └── SharedRewardError      siblings of one rollout carry different raw rewards (SPEC §2.5 text)
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from codec import Sample
from core.config import RewardConfig

__all__ = [
    "GroupRewards",
    "RewardSelectionError",
    "RolloutKey",
    "SharedRewardError",
    "SharedRewardViolation",
    "normalize_group",
    "post_process_rewards",
    "prompt_groups",
    "rollout_key",
    "selected_reward",
]

# A rollout's identity inside its prompt group: rollout_id, else index, else ("row", batch row).
RolloutKey = int | str | tuple[str, int]

_NUMBER_TYPES = (int, float, np.integer, np.floating)


class RewardSelectionError(ValueError):
    """A sample's raw reward cannot be selected: missing, not a mapping, key absent, or not a number."""


class SharedRewardError(ValueError):
    """Siblings of one rollout carry different raw rewards; `str()` is exactly SPEC §2.5's text."""

    def __init__(self, message: str, violation: SharedRewardViolation | None = None) -> None:
        super().__init__(message)
        self.violation = violation


@dataclass(frozen=True)
class GroupRewards:
    """One prompt group's rewards: `raw`/`rewards` per sample in input order, stats over rollouts."""

    raw: list[float]
    rewards: list[float]
    rollout_count: int
    mean: float  # float32 mean of the per-rollout shared rewards
    std: float  # float32 unbiased std of the per-rollout shared rewards; 0.0 for one rollout
    zero_variance: bool  # every rollout's shared reward is the same float32 value


@dataclass(frozen=True)
class SharedRewardViolation:
    """Siblings of `rollout_key` (batch rows `rows`) carry the different raw rewards `rewards`."""

    rollout_key: object
    rows: list[int]
    rewards: list[float]

    @property
    def message(self) -> str:
        return (
            f"all samples in rollout {self.rollout_key!r} must share one reward; "
            f"rows {self.rows} have rewards {self.rewards}"
        )

    def to_error(self) -> SharedRewardError:
        return SharedRewardError(self.message, self)


def selected_reward(sample: Sample, reward_key: str | None, *, require_finite: bool = False) -> float:
    """The sample's raw reward: `reward`, or `reward[reward_key]` when a key is set (SPEC §2.1).

    The value is returned unchanged (an int stays an int, as in the reference). An empty
    `reward_key` counts as unset, like the reference's `if not args.reward_key`. With
    `require_finite`, NaN and ±inf are refused too (the stream's stricter input rule, §4.4).
    """
    reward = sample.reward
    if reward is None:
        raise RewardSelectionError("sample has no reward")
    if reward_key:
        if not isinstance(reward, dict):
            raise RewardSelectionError(
                f"reward_key {reward_key!r} is set but the reward is not a mapping: {reward!r}"
            )
        if reward_key not in reward:
            raise RewardSelectionError(
                f"reward has no key {reward_key!r}; its keys are {sorted(map(str, reward))}"
            )
        value = reward[reward_key]
        where = f"reward[{reward_key!r}]"
    else:
        if isinstance(reward, dict):
            raise RewardSelectionError(
                f"reward is a mapping with keys {sorted(map(str, reward))}; set reward_key to select one"
            )
        value = reward
        where = "reward"
    if isinstance(value, bool) or not isinstance(value, _NUMBER_TYPES):
        raise RewardSelectionError(f"{where} is not a number: {value!r}")
    if require_finite and not math.isfinite(value):
        raise RewardSelectionError(f"{where} is not finite: {value!r}")
    return value


def rollout_key(sample: Sample, row: int) -> RolloutKey:
    """A row's rollout identity (SPEC §2.4): `rollout_id`, else `index`, else the row itself."""
    if sample.rollout_id is not None:
        return sample.rollout_id
    if sample.index is not None:
        return sample.index
    return ("row", row)


def normalize_group(
    samples: Sequence[Sample], cfg: RewardConfig, *, rows: Sequence[int] | None = None
) -> GroupRewards | SharedRewardViolation:
    """Check shared rewards and normalize one prompt group (SPEC §2.4–§2.7).

    `rows` are the samples' batch row indices, printed in a violation message and used as the
    identity of rows without `rollout_id`/`index` (default `range(len(samples))`). The shared-reward
    check runs for every estimator here (the stream is strict); the batch API skips it for
    pass-through estimators, as the reference does. Raises `RewardSelectionError` for a sample whose
    reward cannot be selected and `ValueError` for an empty group.
    """
    count = len(samples)
    if count == 0:
        raise ValueError("a prompt group needs at least one sample")
    row_ids = list(range(count)) if rows is None else [operator.index(row) for row in rows]
    if len(row_ids) != count or len(set(row_ids)) != count:
        raise ValueError(f"rows must be {count} distinct batch row indices; got {row_ids}")
    raw = [selected_reward(sample, cfg.reward_key) for sample in samples]

    members: dict[RolloutKey, list[int]] = {}  # rollout key -> positions in `samples`, first-seen order
    for position, sample in enumerate(samples):
        members.setdefault(rollout_key(sample, row_ids[position]), []).append(position)

    shared: list[float] = []
    for key, positions in members.items():
        first = raw[positions[0]]
        if any(raw[position] != first for position in positions[1:]):
            return SharedRewardViolation(
                rollout_key=key,
                rows=[row_ids[position] for position in positions],
                rewards=[raw[position] for position in positions],
            )
        shared.append(first)

    # The reference's exact float32 ops: mean over rollouts, unbiased std, divide only if std > 0.
    rollout_rewards = torch.tensor(shared, dtype=torch.float)
    mean = rollout_rewards.mean()
    std = rollout_rewards.std() if len(shared) > 1 else None
    if cfg.normalizes:
        normalized = rollout_rewards - mean
        if cfg.divides_by_std and std is not None and std > 0:
            normalized = normalized / (std + 1e-6)
        rewards: list[float] = [0.0] * count
        for positions, value in zip(members.values(), normalized.tolist(), strict=True):
            for position in positions:
                rewards[position] = value
    else:
        rewards = list(raw)

    return GroupRewards(
        raw=raw,
        rewards=rewards,
        rollout_count=len(shared),
        mean=mean.item(),
        std=0.0 if std is None else std.item(),
        zero_variance=bool((rollout_rewards == rollout_rewards[0]).all()),
    )


def prompt_groups(
    samples: Sequence[Sample], cfg: RewardConfig, prompt_group_sizes: Sequence[int] | None = None
) -> list[list[int]]:
    """Batch row indices of each prompt group, by SPEC §2.3's precedence."""
    count = len(samples)
    if prompt_group_sizes is not None:
        sizes = [operator.index(size) for size in prompt_group_sizes]
        if any(size < 0 for size in sizes):
            raise ValueError(f"prompt group sizes must be >= 0; got {sizes}")
        if sum(sizes) != count:
            raise ValueError(f"prompt group sizes sum to {sum(sizes)}, but got {count} rewards")
        groups: list[list[int]] = []
        start = 0
        for size in sizes:
            if size > 0:
                groups.append(list(range(start, start + size)))
            start += size
        return groups

    if all(sample.group_index is not None for sample in samples):
        by_group_index: dict[int, list[int]] = {}
        for row, sample in enumerate(samples):
            by_group_index.setdefault(int(sample.group_index), []).append(row)  # type: ignore[arg-type]
        return list(by_group_index.values())

    per_prompt = cfg.n_samples_per_prompt
    if cfg.rollout_batch_size is not None and count == per_prompt * cfg.rollout_batch_size:
        return [list(range(start, start + per_prompt)) for start in range(0, count, per_prompt)]
    return [list(range(count))]


def post_process_rewards(
    samples: Sequence[Sample], cfg: RewardConfig, prompt_group_sizes: Sequence[int] | None = None
) -> tuple[list[float], list[float]]:
    """Raw and processed rewards of a batch, as the reference trainer computes them.

    Pass-through estimators return the raw rewards unchanged without grouping or checking siblings
    (as the reference does); normalizing estimators run `normalize_group` on each prompt group and
    raise `SharedRewardError` on the first violation. Also raises `RewardSelectionError` (with the
    batch row) and `ValueError` for prompt group sizes that are negative or do not sum to the batch.
    """
    raw: list[float] = []
    for row, sample in enumerate(samples):
        try:
            raw.append(selected_reward(sample, cfg.reward_key))
        except RewardSelectionError as exc:
            raise RewardSelectionError(f"row {row}: {exc}") from exc
    groups = prompt_groups(samples, cfg, prompt_group_sizes)
    if not cfg.normalizes:
        return raw, list(raw)

    rewards: list[float] = [0.0] * len(samples)
    for group_rows in groups:
        result = normalize_group([samples[row] for row in group_rows], cfg, rows=group_rows)
        if isinstance(result, SharedRewardViolation):
            raise result.to_error()
        for row, value in zip(group_rows, result.rewards, strict=True):
            rewards[row] = value
    return raw, rewards
