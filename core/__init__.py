"""Pure core of rollout-stream: reward post-processing and grouping logic, no I/O (docs/spec.md §2)."""

from rollout_stream.core.config import RewardConfig
from rollout_stream.core.rewards import (
    GroupRewards,
    RewardSelectionError,
    SharedRewardError,
    SharedRewardViolation,
    normalize_group,
    post_process_rewards,
    selected_reward,
)

__all__ = [
    "GroupRewards",
    "RewardConfig",
    "RewardSelectionError",
    "SharedRewardError",
    "SharedRewardViolation",
    "normalize_group",
    "post_process_rewards",
    "selected_reward",
]
