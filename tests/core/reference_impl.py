"""A straight transcription of the reference trainer's reward post-processing, for differential tests.

Source: radixark/miles (Apache-2.0), `miles/ray/rollout/train_data_conversion.py`
(`_reward_group_segments`, `_normalize_rewards_by_rollout`, `_post_process_rewards`, as of PR #2498
"fix: require shared rewards within rollouts") and `miles/utils/types.py` (`Sample.get_reward_value`).
Kept deliberately independent of `core/`: same statements, same torch ops, same order, same
AssertionError for mismatched sizes. Only the custom-function hook is dropped. `args` is anything with
the reference's attribute names (a `core.RewardConfig` works).
"""

from __future__ import annotations

from typing import Any

import torch


def get_reward_value(sample: Any, args: Any) -> Any:
    # miles.utils.types.Sample.get_reward_value
    return sample.reward if not args.reward_key else sample.reward[args.reward_key]


def reward_group_segments(
    args: Any, samples: list[Any], prompt_group_sizes: list[int] | None
) -> list[list[int]]:
    if prompt_group_sizes is not None:
        assert sum(prompt_group_sizes) == len(
            samples
        ), f"prompt group sizes sum to {sum(prompt_group_sizes)}, but got {len(samples)} rewards"
        groups: list[list[int]] = []
        start = 0
        for size in prompt_group_sizes:
            end = start + size
            if size > 0:
                groups.append(list(range(start, end)))
            start = end
        return groups

    group_indices = [sample.group_index for sample in samples]
    if all(group_index is not None for group_index in group_indices):
        segments_by_group_index: dict[int, list[int]] = {}
        for segment_index, group_index in enumerate(group_indices):
            segments_by_group_index.setdefault(int(group_index), []).append(segment_index)
        return list(segments_by_group_index.values())

    expected_samples = args.n_samples_per_prompt * args.rollout_batch_size
    if len(samples) == expected_samples:
        return [
            list(range(start, start + args.n_samples_per_prompt))
            for start in range(0, len(samples), args.n_samples_per_prompt)
        ]
    return [list(range(len(samples)))]


def normalize_rewards_by_rollout(
    args: Any, samples: list[Any], raw_rewards: list[Any], prompt_group_sizes: list[int] | None
) -> list[float]:
    if not samples:
        return []

    normalized_rewards = torch.empty(len(raw_rewards), dtype=torch.float)
    for prompt_segments in reward_group_segments(args, samples, prompt_group_sizes):
        segments_by_rollout_key: dict[Any, list[int]] = {}
        for segment_index in prompt_segments:
            sample = samples[segment_index]
            if sample.rollout_id is not None:
                rollout_key = sample.rollout_id
            elif sample.index is not None:
                rollout_key = sample.index
            else:
                rollout_key = ("row", segment_index)
            segments_by_rollout_key.setdefault(rollout_key, []).append(segment_index)

        rollout_segment_groups = list(segments_by_rollout_key.items())
        shared_rewards: list[Any] = []
        for rollout_key, rollout_segments in rollout_segment_groups:
            sibling_rewards = [raw_rewards[segment_index] for segment_index in rollout_segments]
            if any(reward != sibling_rewards[0] for reward in sibling_rewards[1:]):
                raise ValueError(
                    f"all samples in rollout {rollout_key!r} must share one reward; "
                    f"rows {rollout_segments} have rewards {sibling_rewards}"
                )
            shared_rewards.append(sibling_rewards[0])

        rollout_rewards = torch.tensor(shared_rewards, dtype=torch.float)
        normalized_rollout_rewards = rollout_rewards - rollout_rewards.mean()
        if (
            args.advantage_estimator in ["grpo", "gspo"]
            and args.grpo_std_normalization
            and len(rollout_rewards) > 1
        ):
            rollout_std = rollout_rewards.std()
            if rollout_std > 0:
                normalized_rollout_rewards = normalized_rollout_rewards / (rollout_std + 1e-6)

        for (_, rollout_segments), normalized_reward in zip(
            rollout_segment_groups, normalized_rollout_rewards.tolist(), strict=True
        ):
            for segment_index in rollout_segments:
                normalized_rewards[segment_index] = normalized_reward

    return normalized_rewards.tolist()


def post_process_rewards(
    args: Any, samples: list[Any], prompt_group_sizes: list[int] | None = None
) -> tuple[list[Any], list[Any]]:
    raw_rewards = [get_reward_value(sample, args) for sample in samples]
    if (
        args.advantage_estimator in ["grpo", "gspo", "reinforce_plus_plus_baseline"]
        and args.rewards_normalization
    ):
        normalized_rewards = normalize_rewards_by_rollout(args, samples, raw_rewards, prompt_group_sizes)
        return raw_rewards, normalized_rewards

    return raw_rewards, raw_rewards
