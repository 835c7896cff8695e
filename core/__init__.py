"""Pure core of rollout-stream: reward post-processing and grouping logic, no I/O (docs/spec.md §2)."""

from codec.compiled import package_path

# First, before any submodule is imported: the compiled hot path's modules, where built (codec/compiled.py).
__path__ = package_path(__name__, __path__)

from core.config import RewardConfig
from core.rewards import (
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
