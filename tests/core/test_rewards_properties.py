"""Hypothesis properties of reward post-processing, and a bit-for-bit differential test against a
straight transcription of the reference trainer (tests/core/reference_impl.py)."""

from __future__ import annotations

import importlib.util
import math
import random
import struct
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_stream.codec import Sample
from rollout_stream.core import (
    GroupRewards,
    RewardConfig,
    SharedRewardError,
    SharedRewardViolation,
    normalize_group,
    post_process_rewards,
)
from rollout_stream.core.config import ADVANTAGE_ESTIMATORS
from rollout_stream.core.rewards import prompt_groups, rollout_key


def _load_reference() -> Any:
    path = Path(__file__).resolve().parent / "reference_impl.py"
    spec = importlib.util.spec_from_file_location("rollout_stream_tests_reference_impl", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


reference = _load_reference()

PROPERTY_SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FLOAT32_EPS = 2.0**-23


def bits(value: Any) -> tuple[type, bytes]:
    """Exact identity of a reward value: its type and, for floats, its IEEE-754 bits."""
    if isinstance(value, float):
        return float, struct.pack("<d", value)
    return type(value), repr(value).encode()


# ---------------------------------------------------------------- well-formed grouped batches

reward_values = st.one_of(
    st.integers(min_value=-20, max_value=20),
    st.floats(min_value=-1000.0, max_value=1000.0, allow_nan=False, allow_infinity=False),
)


@st.composite
def grouped_batches(draw: st.DrawFn, max_groups: int = 4) -> list[Sample]:
    """Batches with group_index on every sample, agreeing siblings, rows shuffled across groups."""
    samples: list[Sample] = []
    for group in range(draw(st.integers(1, max_groups))):
        for rollout in range(draw(st.integers(1, 5))):
            reward = draw(reward_values)
            use_index = draw(st.booleans())
            for _ in range(draw(st.integers(1, 3))):
                samples.append(Sample(
                    group_index=group,
                    rollout_id=None if use_index else rollout,  # rollout ids repeat across groups
                    index=rollout + 100 * group if use_index else draw(st.none() | st.integers(0, 3)),
                    reward=reward,
                    response_length=draw(st.integers(0, 3)),
                    remove_sample=draw(st.booleans()),
                ))
    order = draw(st.permutations(range(len(samples))))
    return [samples[i] for i in order]


normalizing_configs = st.builds(
    RewardConfig,
    advantage_estimator=st.sampled_from(["grpo", "gspo", "reinforce_plus_plus_baseline"]),
    grpo_std_normalization=st.booleans(),
)


def rollouts_of(samples: list[Sample], rows: list[int]) -> dict[object, list[int]]:
    members: dict[object, list[int]] = {}
    for row in rows:
        members.setdefault(rollout_key(samples[row], row), []).append(row)
    return members


@PROPERTY_SETTINGS
@given(samples=grouped_batches(), cfg=normalizing_configs)
def test_group_mean_is_zero(samples: list[Sample], cfg: RewardConfig) -> None:
    raw, rewards = post_process_rewards(samples, cfg)
    for rows in prompt_groups(samples, cfg):
        members = rollouts_of(samples, rows)
        shared = [float(raw[positions[0]]) for positions in members.values()]
        values = [rewards[positions[0]] for positions in members.values()]
        scale = max(max(abs(value) for value in shared), 1.0)
        result = normalize_group([samples[row] for row in rows], cfg)
        assert isinstance(result, GroupRewards)
        divisor = result.std + 1e-6 if cfg.divides_by_std and result.std > 0 else 1.0
        tolerance = 8 * len(shared) * FLOAT32_EPS * scale / divisor
        assert abs(math.fsum(values) / len(values)) <= tolerance


@PROPERTY_SETTINGS
@given(data=st.data(), rollouts=st.integers(2, 8), groups=st.integers(1, 3),
       estimator=st.sampled_from(["grpo", "gspo"]))
def test_std_normalized_groups_have_unit_std(data: st.DataObject, rollouts: int, groups: int,
                                             estimator: str) -> None:
    samples = []
    for group in range(groups):
        base = data.draw(st.floats(-100, 100))
        spread = data.draw(st.floats(0.5, 50))
        for k in range(rollouts):
            samples.append(Sample(group_index=group, rollout_id=k, reward=base + spread * (k - rollouts / 2)))
    cfg = RewardConfig(advantage_estimator=estimator)  # type: ignore[arg-type]
    _, rewards = post_process_rewards(samples, cfg)
    for group in range(groups):
        chunk = rewards[group * rollouts:(group + 1) * rollouts]
        mean = math.fsum(chunk) / rollouts
        std = math.sqrt(math.fsum((value - mean) ** 2 for value in chunk) / (rollouts - 1))
        assert abs(std - 1.0) < 1e-3


@PROPERTY_SETTINGS
@given(samples=grouped_batches(),
       estimator=st.sampled_from(ADVANTAGE_ESTIMATORS), normalization=st.booleans())
def test_passthrough_is_identity(samples: list[Sample], estimator: str, normalization: bool) -> None:
    cfg = RewardConfig(
        advantage_estimator=estimator, rewards_normalization=normalization  # type: ignore[arg-type]
    )
    if cfg.normalizes:
        return
    raw, rewards = post_process_rewards(samples, cfg)
    assert [bits(value) for value in rewards] == [bits(sample.reward) for sample in samples]
    assert [bits(value) for value in raw] == [bits(sample.reward) for sample in samples]


@PROPERTY_SETTINGS
@given(samples=grouped_batches(), cfg=normalizing_configs)
def test_siblings_get_equal_values(samples: list[Sample], cfg: RewardConfig) -> None:
    _, rewards = post_process_rewards(samples, cfg)
    for rows in prompt_groups(samples, cfg):
        for positions in rollouts_of(samples, rows).values():
            assert len({bits(rewards[row]) for row in positions}) == 1


@PROPERTY_SETTINGS
@given(samples=grouped_batches(), others=grouped_batches(max_groups=3), cfg=normalizing_configs,
       seed=st.integers(0, 2**32 - 1))
def test_group_result_is_independent_of_other_groups(samples: list[Sample], others: list[Sample],
                                                     cfg: RewardConfig, seed: int) -> None:
    """Group 0 alone and group 0 interleaved with other groups get bit-identical rewards."""
    alone = [sample for sample in samples if sample.group_index == 0]
    _, alone_rewards = post_process_rewards(alone, cfg)
    shifted = iter([
        Sample(group_index=sample.group_index + 1, rollout_id=sample.rollout_id,  # type: ignore[operator]
               index=sample.index, reward=sample.reward)
        for sample in others
    ])
    mine_first = iter(alone)
    flags = [True] * len(alone) + [False] * len(others)
    random.Random(seed).shuffle(flags)  # interleave, keeping each side's own order
    tagged = [(flag, next(mine_first) if flag else next(shifted)) for flag in flags]
    _, mixed_rewards = post_process_rewards([sample for _, sample in tagged], cfg)
    ours = [value for (mine, _), value in zip(tagged, mixed_rewards, strict=True) if mine]
    assert [bits(value) for value in ours] == [bits(value) for value in alone_rewards]


@PROPERTY_SETTINGS
@given(samples=grouped_batches(), estimator=st.sampled_from(ADVANTAGE_ESTIMATORS), std=st.booleans())
def test_normalize_group_agrees_with_batch_api(samples: list[Sample], estimator: str, std: bool) -> None:
    cfg = RewardConfig(advantage_estimator=estimator, grpo_std_normalization=std)  # type: ignore[arg-type]
    raw, rewards = post_process_rewards(samples, cfg)
    for rows in prompt_groups(samples, cfg):
        result = normalize_group([samples[row] for row in rows], cfg, rows=rows)
        assert isinstance(result, GroupRewards)
        assert [bits(value) for value in result.rewards] == [bits(rewards[row]) for row in rows]
        assert [bits(value) for value in result.raw] == [bits(raw[row]) for row in rows]
        assert result.rollout_count == len(rollouts_of(samples, rows))


# ---------------------------------------------------------------- differential test vs the reference

DIFF_SETTINGS = settings(max_examples=700, deadline=None, suppress_health_check=[HealthCheck.too_slow])

any_reward = st.one_of(
    st.sampled_from([0, 1, 1.0, 0.5, -2, 2.0, 1e-7, 3.4e38, -0.0]),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(width=64),  # NaN, ±inf, subnormals, values beyond float32 range
)


@st.composite
def any_batch(draw: st.DrawFn) -> tuple[RewardConfig, list[Sample], list[int] | None]:
    """Arbitrary batches: optional group_index/index/rollout_id, siblings mostly agreeing, sizes."""
    cfg = RewardConfig(
        advantage_estimator=draw(st.sampled_from(["grpo", "gspo", "reinforce_plus_plus_baseline", "grpo",
                                                  "reinforce_plus_plus", "ppo"])),
        rewards_normalization=draw(st.sampled_from([True, True, True, False])),
        grpo_std_normalization=draw(st.booleans()),
        reward_key=draw(st.sampled_from([None, "score"])),
        n_samples_per_prompt=draw(st.integers(1, 4)),
        rollout_batch_size=draw(st.integers(1, 4)),
    )
    count = draw(st.integers(0, 14))
    group_mode = draw(st.sampled_from(["all", "none", "mixed"]))
    reward_of: dict[object, Any] = {}  # siblings agree unless perturbed
    samples = []
    for _ in range(count):
        rollout_id = draw(st.none() | st.integers(0, 5) | st.sampled_from(["a", "b", "5"]))
        index = draw(st.none() | st.integers(0, 5))
        group_index = {"all": draw(st.integers(0, 3)), "none": None,
                       "mixed": draw(st.none() | st.integers(0, 3))}[group_mode]
        identity = rollout_id if rollout_id is not None else index
        if identity is None or identity not in reward_of or draw(st.integers(0, 9)) == 0:
            reward_of[identity] = draw(any_reward)
        value = reward_of[identity]
        if draw(st.integers(0, 7)) == 0:
            value = float(value) if isinstance(value, int) else value  # 1 vs 1.0 siblings
        reward: Any = {"score": value, "other": draw(any_reward)} if cfg.reward_key else value
        samples.append(Sample(group_index=group_index, index=index, rollout_id=rollout_id, reward=reward,
                              loss_mask=draw(st.none() | st.just([1, 0])), remove_sample=draw(st.booleans())))
    sizes = None
    if draw(st.booleans()):
        cuts = sorted(draw(st.lists(st.integers(0, count), max_size=5)))
        edges = [0, *cuts, count]
        sizes = [end - start for start, end in zip(edges, edges[1:], strict=False)]
    return cfg, samples, sizes


def outcome(fn: Any) -> tuple[str, Any]:
    try:
        raw, rewards = fn()
    except ValueError as exc:  # SharedRewardError is a ValueError, as in the reference
        return "ValueError", str(exc)
    except Exception as exc:  # both sides must fail the same way on exotic values
        return type(exc).__name__, str(exc)
    return "ok", ([bits(value) for value in raw], [bits(value) for value in rewards])


@DIFF_SETTINGS
@given(batch=any_batch())
def test_bit_identical_to_reference(batch: tuple[RewardConfig, list[Sample], list[int] | None]) -> None:
    cfg, samples, sizes = batch
    expected = outcome(lambda: reference.post_process_rewards(cfg, samples, sizes))
    actual = outcome(lambda: post_process_rewards(samples, cfg, sizes))
    assert actual == expected
    if cfg.normalizes:
        # The stream's per-group function reports the reference's error text as a value.
        violations = [
            result
            for rows in prompt_groups(samples, cfg, sizes)
            if isinstance(result := normalize_group([samples[row] for row in rows], cfg, rows=rows),
                          SharedRewardViolation)
        ]
        if expected[0] == "ValueError":
            assert violations and violations[0].message == expected[1]
            assert str(violations[0].to_error()) == expected[1]
            assert isinstance(violations[0].to_error(), SharedRewardError)
        else:
            assert not violations
