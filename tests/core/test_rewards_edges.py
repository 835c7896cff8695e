"""Edge cases of reward post-processing (docs/spec.md §2) as parametrized tables."""

from __future__ import annotations

import math
from typing import Any

import pytest

from rollout_stream.codec import Sample
from rollout_stream.core import (
    GroupRewards,
    RewardConfig,
    RewardSelectionError,
    SharedRewardError,
    SharedRewardViolation,
    normalize_group,
    post_process_rewards,
    selected_reward,
)
from rollout_stream.core.rewards import prompt_groups, rollout_key

SQRT_HALF = 0.7071057558059692  # float32 result of (x - mean) / (std + 1e-6) for two rollouts 0, 1


def s(reward: Any = 0.0, *, g: int | None = 0, idx: int | None = None, rid: int | str | None = None,
      **extra: Any) -> Sample:
    return Sample(group_index=g, index=idx, rollout_id=rid, reward=reward, **extra)


MEAN_ONLY = RewardConfig(grpo_std_normalization=False)
GRPO = RewardConfig()
BASELINE = RewardConfig(advantage_estimator="reinforce_plus_plus_baseline")

# (id, samples, config, prompt_group_sizes, expected processed rewards)
CASES: list[tuple[str, list[Sample], RewardConfig, list[int] | None, list[float]]] = [
    # §2.4 rollout identity and its fallbacks
    ("rollout_id_groups_siblings_across_index",
     [s(1.0, rid=1, idx=0), s(1.0, rid=1, idx=5), s(3.0, rid=2, idx=0)], MEAN_ONLY, None, [-1.0, -1.0, 1.0]),
    ("index_when_no_rollout_id",
     [s(1.0, idx=7), s(1.0, idx=7), s(4.0, idx=8)], MEAN_ONLY, None, [-1.5, -1.5, 1.5]),
    ("row_when_no_rollout_id_and_no_index",
     [s(1.0), s(1.0), s(4.0)], MEAN_ONLY, None, [-1.0, -1.0, 2.0]),
    ("string_rollout_ids",
     [s(1.0, rid="a"), s(1.0, rid="a"), s(3.0, rid="b")], MEAN_ONLY, None, [-1.0, -1.0, 1.0]),
    ("string_and_int_rollout_ids_differ",
     [s(1.0, rid="5"), s(2.0, rid=5)], MEAN_ONLY, None, [-0.5, 0.5]),
    ("rollout_id_and_index_share_a_key_space",  # reference quirk: rollout_id 5 == index 5
     [s(1.0, rid=5, idx=0), s(1.0, idx=5), s(3.0, rid=6)], MEAN_ONLY, None, [-1.0, -1.0, 1.0]),
    ("keys_only_count_inside_a_group",
     [s(1.0, g=0, rid=1), s(3.0, g=0, rid=2), s(10.0, g=1, rid=1), s(30.0, g=1, rid=2)],
     MEAN_ONLY, None, [-1.0, 1.0, -10.0, 10.0]),
    # §2.3 precedence
    ("sizes_beat_group_index",
     [s(0.0, g=0), s(2.0, g=0), s(4.0, g=0), s(6.0, g=0)], MEAN_ONLY, [1, 3], [0.0, -2.0, 0.0, 2.0]),
    ("zero_sizes_skipped",
     [s(0.0), s(2.0), s(10.0), s(14.0)], MEAN_ONLY, [0, 2, 0, 0, 2, 0], [-1.0, 1.0, -2.0, 2.0]),
    ("group_index_beats_legacy_chunks",
     [s(0.0, g=0), s(10.0, g=1), s(2.0, g=1), s(4.0, g=0)],
     RewardConfig(grpo_std_normalization=False, n_samples_per_prompt=2, rollout_batch_size=2),
     None, [-2.0, 4.0, -4.0, 2.0]),
    ("group_index_first_appearance_noncontiguous",
     [s(0.0, g=7), s(10.0, g=3), s(2.0, g=7), s(14.0, g=3), s(4.0, g=7)], MEAN_ONLY, None,
     [-2.0, -2.0, 0.0, 2.0, 2.0]),
    ("legacy_chunks_when_a_group_index_is_missing",
     [s(0.0, g=None), s(2.0, g=0), s(10.0, g=0), s(14.0, g=0)],
     RewardConfig(grpo_std_normalization=False, n_samples_per_prompt=2, rollout_batch_size=2),
     None, [-1.0, 1.0, -2.0, 2.0]),
    ("whole_batch_when_count_mismatch",
     [s(0.0, g=None), s(2.0, g=None), s(4.0, g=None)],
     RewardConfig(grpo_std_normalization=False, n_samples_per_prompt=2, rollout_batch_size=2),
     None, [-2.0, 0.0, 2.0]),
    ("whole_batch_when_no_rollout_batch_size",
     [s(0.0, g=None), s(2.0, g=None), s(10.0, g=None), s(14.0, g=None)],
     RewardConfig(grpo_std_normalization=False, n_samples_per_prompt=2), None, [-6.5, -4.5, 3.5, 7.5]),
    # §2.5 equality is ==, so 1 and 1.0 are the same reward
    ("int_and_float_siblings_are_equal",
     [s(1, rid=1), s(1.0, rid=1), s(3, rid=2)], MEAN_ONLY, None, [-1.0, -1.0, 1.0]),
    # §2.6 single rollouts, zero spread, std, baseline
    ("single_rollout_group_gives_zero",
     [s(5.0, rid=1), s(5.0, rid=1)], GRPO, None, [0.0, 0.0]),
    ("single_sample_group_gives_zero",
     [s(5.0, g=0), s(0.0, g=1), s(1.0, g=1)], GRPO, None, [0.0, -SQRT_HALF, SQRT_HALF]),
    ("single_rollout_baseline_gives_zero", [s(-3.0)], BASELINE, None, [0.0]),
    ("zero_spread_is_not_divided", [s(3.0), s(3.0), s(3.0)], GRPO, None, [0.0, 0.0, 0.0]),
    ("std_over_rollouts_not_rows",
     [s(0.0, rid=1), s(1.0, rid=2), s(1.0, rid=2), s(1.0, rid=2)], GRPO, None,
     [-SQRT_HALF, SQRT_HALF, SQRT_HALF, SQRT_HALF]),
    ("gspo_divides_by_std", [s(0.0), s(1.0)], RewardConfig(advantage_estimator="gspo"), None,
     [-SQRT_HALF, SQRT_HALF]),
    ("baseline_ignores_std_flag", [s(0.0), s(1.0)], BASELINE, None, [-0.5, 0.5]),
    # §2.2 pass-through
    ("ppo_passthrough", [s(1), s(2.5)], RewardConfig(advantage_estimator="ppo"), None, [1, 2.5]),
    ("reinforce_plus_plus_passthrough", [s(1.0), s(2.5)],
     RewardConfig(advantage_estimator="reinforce_plus_plus"), None, [1.0, 2.5]),
    ("normalization_off_passthrough", [s(1.0), s(2.5)], RewardConfig(rewards_normalization=False), None,
     [1.0, 2.5]),
    ("passthrough_skips_sibling_check_like_the_reference",
     [s(1.0, rid=1), s(2.0, rid=1)], RewardConfig(advantage_estimator="ppo"), None, [1.0, 2.0]),
    # §2.1 reward_key
    ("reward_key_selects_scalar",
     [s({"score": 1.0, "len": 9.0}, rid=1), s({"score": 1.0, "len": 2.0}, rid=1), s({"score": 3.0}, rid=2)],
     RewardConfig(grpo_std_normalization=False, reward_key="score"), None, [-1.0, -1.0, 1.0]),
    ("empty_batch", [], GRPO, None, []),
    ("empty_batch_with_zero_sizes", [], GRPO, [0, 0], []),
]


@pytest.mark.parametrize(("samples", "cfg", "sizes", "expected"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_processed_rewards(samples: list[Sample], cfg: RewardConfig, sizes: list[int] | None,
                           expected: list[float]) -> None:
    raw, rewards = post_process_rewards(samples, cfg, sizes)
    assert rewards == expected
    assert raw == [selected_reward(sample, cfg.reward_key) for sample in samples]
    if not cfg.normalizes:
        assert [type(value) for value in rewards] == [type(value) for value in raw]  # unchanged


MASKED = [
    s(2.0, rid=10, response_length=8, remove_sample=True),
    s(2.0, rid=10, response_length=4, loss_mask=[1, 1, 1, 1]),
    s(6.0, rid=11, response_length=4, loss_mask=[1, 1, 0, 0]),
]
PLAIN = [s(2.0, rid=10), s(2.0, rid=10), s(6.0, rid=11)]


@pytest.mark.parametrize("cfg", [GRPO, MEAN_ONLY, BASELINE], ids=["grpo", "mean_only", "baseline"])
def test_masks_removal_and_lengths_never_change_the_shared_reward(cfg: RewardConfig) -> None:
    assert post_process_rewards(MASKED, cfg) == post_process_rewards(PLAIN, cfg)
    swapped = [MASKED[1], MASKED[0], MASKED[2]]
    assert post_process_rewards(swapped, cfg)[1] == post_process_rewards(PLAIN, cfg)[1]


# (id, samples, config, sizes, exact error text)
VIOLATIONS: list[tuple[str, list[Sample], RewardConfig, list[int] | None, str]] = [
    ("float_rewards", [s(0.0, rid=10), s(2.0, rid=11), s(6.0, rid=11)], MEAN_ONLY, None,
     "all samples in rollout 11 must share one reward; rows [1, 2] have rewards [2.0, 6.0]"),
    ("int_rewards_print_as_ints", [s(2, rid=11), s(6, rid=11)], MEAN_ONLY, None,
     "all samples in rollout 11 must share one reward; rows [0, 1] have rewards [2, 6]"),
    ("string_rollout_id_uses_repr", [s(1.0, rid="r-1"), s(0.0, rid="r-2"), s(0.5, rid="r-1")], GRPO, None,
     "all samples in rollout 'r-1' must share one reward; rows [0, 2] have rewards [1.0, 0.5]"),
    ("index_fallback_key", [s(1.0, idx=4), s(1.0, idx=4), s(1.5, idx=4)], BASELINE, None,
     "all samples in rollout 4 must share one reward; rows [0, 1, 2] have rewards [1.0, 1.0, 1.5]"),
    ("batch_rows_in_noncontiguous_group",
     [s(0.0, g=1, rid=1), s(1.0, g=2, rid=1), s(0.0, g=2, rid=2), s(2.0, g=2, rid=1)], MEAN_ONLY, None,
     "all samples in rollout 1 must share one reward; rows [1, 3] have rewards [1.0, 2.0]"),
    ("batch_rows_with_explicit_sizes", [s(0.0, rid=1), s(0.0, rid=1), s(1.0, rid=1)], MEAN_ONLY, [2, 1, 0],
     None),  # no violation: the third row is another prompt group
    ("selected_reward_is_compared",
     [s({"score": 1.0}, rid=3), s({"score": 2.0}, rid=3)],
     RewardConfig(reward_key="score"), None,
     "all samples in rollout 3 must share one reward; rows [0, 1] have rewards [1.0, 2.0]"),
    ("first_violation_in_group_order",
     [s(0.0, g=5, rid=1), s(1.0, g=6, rid=2), s(9.0, g=5, rid=1), s(8.0, g=6, rid=2)], MEAN_ONLY, None,
     "all samples in rollout 1 must share one reward; rows [0, 2] have rewards [0.0, 9.0]"),
    ("nan_siblings_never_match", [s(math.nan, rid=1), s(math.nan, rid=1)], GRPO, None,
     "all samples in rollout 1 must share one reward; rows [0, 1] have rewards [nan, nan]"),
]


@pytest.mark.parametrize(("samples", "cfg", "sizes", "message"), [c[1:] for c in VIOLATIONS],
                         ids=[c[0] for c in VIOLATIONS])
def test_shared_reward_violation_text(samples: list[Sample], cfg: RewardConfig, sizes: list[int] | None,
                                      message: str | None) -> None:
    if message is None:
        post_process_rewards(samples, cfg, sizes)
        return
    with pytest.raises(SharedRewardError) as info:
        post_process_rewards(samples, cfg, sizes)
    assert str(info.value) == message
    assert isinstance(info.value, ValueError)
    assert info.value.violation is not None and info.value.violation.message == message
    # The per-group function reports the same violation, as a value.
    found = [normalize_group([samples[r] for r in rows], cfg, rows=rows)
             for rows in prompt_groups(samples, cfg, sizes)]
    violation = next(v for v in found if isinstance(v, SharedRewardViolation))
    assert violation.message == message
    assert str(violation.to_error()) == message


def test_per_group_function_checks_siblings_for_passthrough_estimators() -> None:
    """The stream is strict: a pass-through group with disagreeing siblings is still a violation."""
    samples = [s(1.0, rid=1), s(2.0, rid=1)]
    result = normalize_group(samples, RewardConfig(advantage_estimator="ppo"), rows=[7, 9])
    assert result == SharedRewardViolation(rollout_key=1, rows=[7, 9], rewards=[1.0, 2.0])
    assert result.message == (
        "all samples in rollout 1 must share one reward; rows [7, 9] have rewards [1.0, 2.0]"
    )


# (id, samples, config, expected GroupRewards)
GROUP_STATS = [
    ("grpo_two_rollouts", [s(0.0, rid=1), s(1.0, rid=2), s(1.0, rid=2)], GRPO,
     GroupRewards(raw=[0.0, 1.0, 1.0], rewards=[-SQRT_HALF, SQRT_HALF, SQRT_HALF], rollout_count=2,
                  mean=0.5, std=0.7071067690849304, zero_variance=False)),
    ("passthrough_stats_still_computed", [s(1), s(3)], RewardConfig(advantage_estimator="ppo"),
     GroupRewards(raw=[1, 3], rewards=[1, 3], rollout_count=2, mean=2.0, std=1.4142135381698608,
                  zero_variance=False)),
    ("one_rollout_std_zero", [s(4.0, rid=1), s(4.0, rid=1)], GRPO,
     GroupRewards(raw=[4.0, 4.0], rewards=[0.0, 0.0], rollout_count=1, mean=4.0, std=0.0,
                  zero_variance=True)),
    ("zero_variance", [s(2.0), s(2)], MEAN_ONLY,
     GroupRewards(raw=[2.0, 2], rewards=[0.0, 0.0], rollout_count=2, mean=2.0, std=0.0, zero_variance=True)),
    ("zero_variance_in_float32", [s(0.1), s(0.1 + 1e-12)], GRPO,
     GroupRewards(raw=[0.1, 0.1 + 1e-12], rewards=[0.0, 0.0], rollout_count=2, mean=0.10000000149011612,
                  std=0.0, zero_variance=True)),
]


@pytest.mark.parametrize(("samples", "cfg", "expected"), [c[1:] for c in GROUP_STATS],
                         ids=[c[0] for c in GROUP_STATS])
def test_group_statistics(samples: list[Sample], cfg: RewardConfig, expected: GroupRewards) -> None:
    assert normalize_group(samples, cfg) == expected


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"rows": [0]}, "rows must be 2 distinct batch row indices"),
    ({"rows": [3, 3]}, "rows must be 2 distinct batch row indices"),
])
def test_normalize_group_rejects_bad_rows(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        normalize_group([s(1.0), s(2.0)], GRPO, **kwargs)


def test_normalize_group_rejects_empty_group() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        normalize_group([], GRPO)


@pytest.mark.parametrize(("sizes", "message"), [
    ([2, 2], "prompt group sizes sum to 4, but got 3 rewards"),
    ([1], "prompt group sizes sum to 1, but got 3 rewards"),
    ([4, -1], "prompt group sizes must be >= 0; got [4, -1]"),
])
@pytest.mark.parametrize("cfg", [GRPO, RewardConfig(advantage_estimator="ppo")], ids=["grpo", "ppo"])
def test_bad_prompt_group_sizes(sizes: list[int], message: str, cfg: RewardConfig) -> None:
    with pytest.raises(ValueError) as info:
        post_process_rewards([s(0.0), s(1.0), s(2.0)], cfg, sizes)
    assert str(info.value) == message


# (id, reward, reward_key, require_finite, expected value or error fragment)
SELECTION = [
    ("float", 1.5, None, False, 1.5),
    ("int_kept", 2, None, False, 2),
    ("empty_key_is_unset", 2.5, "", False, 2.5),
    ("mapping", {"score": 3.0, "x": 1.0}, "score", False, 3.0),
    ("inf_allowed_by_default", math.inf, None, False, math.inf),
    ("missing", None, None, False, "sample has no reward"),
    ("missing_with_key", None, "score", False, "sample has no reward"),
    ("not_a_mapping", 1.0, "score", False, "reward_key 'score' is set but the reward is not a mapping: 1.0"),
    ("key_absent", {"acc": 1.0}, "score", False, "reward has no key 'score'; its keys are ['acc']"),
    ("mapping_without_key", {"acc": 1.0}, None, False,
     "reward is a mapping with keys ['acc']; set reward_key"),
    ("string_value", {"score": "high"}, "score", False, "reward['score'] is not a number: 'high'"),
    ("bool_value", True, None, False, "reward is not a number: True"),
    ("nan_refused_when_finite_required", math.nan, None, True, "reward is not finite: nan"),
    ("inf_refused_in_mapping", {"s": -math.inf}, "s", True, "reward['s'] is not finite: -inf"),
]


@pytest.mark.parametrize(("reward", "key", "finite", "expected"), [c[1:] for c in SELECTION],
                         ids=[c[0] for c in SELECTION])
def test_selected_reward(reward: Any, key: str | None, finite: bool, expected: Any) -> None:
    sample = s(reward)
    if isinstance(expected, str):
        with pytest.raises(RewardSelectionError) as info:
            selected_reward(sample, key, require_finite=finite)
        assert str(info.value).startswith(expected)
        assert isinstance(info.value, ValueError)
    else:
        value = selected_reward(sample, key, require_finite=finite)
        assert value == expected and type(value) is type(expected)


def test_batch_selection_error_names_the_row() -> None:
    with pytest.raises(RewardSelectionError, match=r"^row 1: sample has no reward$"):
        post_process_rewards([s(1.0), s(None)], GRPO)


@pytest.mark.parametrize(("sample", "row", "key"), [
    (s(rid=3, idx=1), 0, 3),
    (s(rid="x", idx=1), 0, "x"),
    (s(idx=0), 5, 0),
    (s(), 5, ("row", 5)),
])
def test_rollout_key_fallbacks(sample: Sample, row: int, key: object) -> None:
    assert rollout_key(sample, row) == key


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"advantage_estimator": "dapo"}, "advantage_estimator must be one of grpo, gspo"),
    ({"n_samples_per_prompt": 0}, "n_samples_per_prompt must be an integer >= 1"),
    ({"rollout_batch_size": 0}, "rollout_batch_size must be an integer >= 1 or None"),
    ({"rewards_normalization": "false"}, "rewards_normalization must be a bool"),
    ({"reward_key": 3}, "reward_key must be a string or None"),
])
def test_config_validation(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        RewardConfig(**kwargs)


@pytest.mark.parametrize(("estimator", "enabled", "normalizes"), [
    ("grpo", True, True), ("gspo", True, True), ("reinforce_plus_plus_baseline", True, True),
    ("reinforce_plus_plus", True, False), ("ppo", True, False), ("grpo", False, False),
])
def test_config_normalizes(estimator: str, enabled: bool, normalizes: bool) -> None:
    cfg = RewardConfig(advantage_estimator=estimator, rewards_normalization=enabled)  # type: ignore[arg-type]
    assert cfg.normalizes is normalizes
    assert RewardConfig().advantage_estimator == "grpo" and RewardConfig().n_samples_per_prompt == 1


def test_equal_rewards_keep_the_references_float32_rounding() -> None:
    """All rollouts equal, yet the float32 mean of 11 x 123.456 is not 123.456 and the std is tiny but
    > 0: the reference then divides by (std + 1e-6). We reproduce it bit for bit and flag the group."""
    result = normalize_group([s(123.456) for _ in range(11)], GRPO)
    assert isinstance(result, GroupRewards)
    assert result.rewards == [-0.8475431799888611] * 11
    assert result.zero_variance and 0.0 < result.std < 1e-5
    assert post_process_rewards([s(123.456) for _ in range(11)], GRPO)[1] == result.rewards
