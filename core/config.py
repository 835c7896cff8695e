"""Reward post-processing settings, named as in the reference trainer (docs/spec.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

__all__ = ["AdvantageEstimator", "ADVANTAGE_ESTIMATORS", "NORMALIZING_ESTIMATORS", "RewardConfig"]

AdvantageEstimator = Literal["grpo", "gspo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]
ADVANTAGE_ESTIMATORS: tuple[str, ...] = get_args(AdvantageEstimator)
# Estimators whose rewards are centred per prompt group (when rewards_normalization is on).
NORMALIZING_ESTIMATORS: frozenset[str] = frozenset({"grpo", "gspo", "reinforce_plus_plus_baseline"})
# Estimators that additionally divide by the group's standard deviation (grpo_std_normalization).
_STD_ESTIMATORS: frozenset[str] = frozenset({"grpo", "gspo"})


@dataclass(frozen=True, slots=True)
class RewardConfig:
    """How raw rewards become training rewards; field names match the reference trainer's args."""

    advantage_estimator: AdvantageEstimator = "grpo"
    rewards_normalization: bool = True
    grpo_std_normalization: bool = True
    reward_key: str | None = None
    n_samples_per_prompt: int = 1
    rollout_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"advantage_estimator must be one of {', '.join(ADVANTAGE_ESTIMATORS)}; "
                f"got {self.advantage_estimator!r}"
            )
        for name in ("rewards_normalization", "grpo_std_normalization"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool; got {getattr(self, name)!r}")
        if self.reward_key is not None and not isinstance(self.reward_key, str):
            raise ValueError(f"reward_key must be a string or None; got {self.reward_key!r}")
        if not _is_positive_int(self.n_samples_per_prompt):
            raise ValueError(
                f"n_samples_per_prompt must be an integer >= 1; got {self.n_samples_per_prompt!r}"
            )
        if self.rollout_batch_size is not None and not _is_positive_int(self.rollout_batch_size):
            raise ValueError(
                f"rollout_batch_size must be an integer >= 1 or None; got {self.rollout_batch_size!r}"
            )

    @property
    def normalizes(self) -> bool:
        """True when rewards are group-normalized; otherwise they pass through unchanged (§2.2)."""
        return self.rewards_normalization and self.advantage_estimator in NORMALIZING_ESTIMATORS

    @property
    def divides_by_std(self) -> bool:
        """True when a group's centred rewards are also divided by its std (§2.6)."""
        return self.normalizes and self.grpo_std_normalization and self.advantage_estimator in _STD_ESTIMATORS


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
