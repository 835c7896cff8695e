"""`normalize_group`'s torch-free statistics against the implementation they replaced, bit for bit.

`_reference_normalize_group` is `rollout_stream.core.rewards.normalize_group` as it was before the fast path:
the reference trainer's torch float32 sequence, call for call. It stays the definition of correct; every
output field of the new function (raw, rewards, mean, std, zero_variance, rollout_count, or the violation)
must carry the same types and IEEE-754 bits for every input.
`bench/scripts/normalize_bench.py` times it against the current function.
"""

from __future__ import annotations

import math
import operator
import random
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rollout_stream.codec import Sample
from rollout_stream.core import GroupRewards, RewardConfig, SharedRewardViolation, normalize_group
from rollout_stream.core import rewards as rewards_module
from rollout_stream.core.config import ADVANTAGE_ESTIMATORS
from rollout_stream.core.rewards import RolloutKey, rollout_key, selected_reward

# ---------------------------------------------------------------- the implementation before the fast path


def _reference_normalize_group(
    samples: Sequence[Sample], cfg: RewardConfig, *, rows: Sequence[int] | None = None
) -> GroupRewards | SharedRewardViolation:
    """Verbatim copy of `normalize_group` before it computed statistics without torch."""
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


# ---------------------------------------------------------------- exact identity of a result


def bits(value: Any) -> tuple[str, Any]:
    """A value's type and, for floats, its float64 bit pattern (sign of zero, NaN payload included)."""
    if isinstance(value, float):
        return type(value).__name__, struct.pack("<d", value).hex()
    if isinstance(value, list):
        return "list", [bits(item) for item in value]
    return type(value).__name__, repr(value)


def identity(result: GroupRewards | SharedRewardViolation) -> tuple[Any, ...]:
    if isinstance(result, SharedRewardViolation):
        return ("violation", bits(result.rollout_key), bits(result.rows), bits(result.rewards),
                result.message)
    return (
        "rewards",
        bits(result.raw),
        bits(result.rewards),
        bits(result.mean),
        bits(result.std),
        bits(result.zero_variance),
        bits(result.rollout_count),
    )


def outcome(call: Callable[[], GroupRewards | SharedRewardViolation]) -> tuple[Any, ...]:
    try:
        return identity(call())
    except Exception as exc:  # both must fail alike, e.g. on an int too large for a float
        return ("raised", type(exc).__name__, str(exc))


def assert_same(samples: Sequence[Sample], cfg: RewardConfig, rows: Sequence[int] | None = None) -> None:
    expected = outcome(lambda: _reference_normalize_group(samples, cfg, rows=rows))
    assert outcome(lambda: normalize_group(samples, cfg, rows=rows)) == expected, cfg


# Every RewardConfig combination that changes the arithmetic (estimator x normalization x std flag).
ALL_CONFIGS = [
    RewardConfig(advantage_estimator=estimator, rewards_normalization=normalization,  # type: ignore[arg-type]
                 grpo_std_normalization=std)
    for estimator in ADVANTAGE_ESTIMATORS for normalization in (True, False) for std in (True, False)
]


def rollouts(shared: Sequence[Any], siblings: int = 1) -> list[Sample]:
    """One sample per rollout, each repeated `siblings` times with the same reward."""
    return [Sample(rollout_id=k, reward=value) for k, value in enumerate(shared) for _ in range(siblings)]


# ---------------------------------------------------------------- generated groups

FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_OVERFLOW = 3.4028235677973366e38  # the float32 rounding midpoint to inf: rounds to inf

special_floats = st.sampled_from([
    0.0, -0.0, 1.0, -1.0, 0.5, 0.25, 0.75, 0.1, 1 / 3, 2 / 3, 123.456, 1e-6, 1e-7,
    2.0**-149, 2.0**-148, 1e-45, 3e-45, 2.0**-126, 1e-40, 5e-324, 1e-310,  # subnormals, both widths
    2.0**22, 2.0**22 + 1, 2.0**23, 2.0**24, 2.0**24 + 1, 2.0**24 + 2, 16777215.0,
    FLOAT32_MAX, -FLOAT32_MAX, FLOAT32_OVERFLOW, 3.4e38, 1e38, 1e39, 1e300, -1e300,
    math.inf, -math.inf, math.nan, -math.nan,
])
special_ints = st.sampled_from([
    0, 1, -1, 2, 3, 5, 10, 2**22 + 1, 2**24 - 1, 2**24, 2**24 + 1, 2**24 + 3, 2**53 - 1, 2**53, -(2**53),
    2**53 + 1, 2**53 + 2**29 + 1, -(2**53 + 2**29 + 1), 2**63 - 1, -(2**63), 2**64, 2**1100,
])
dyadic = st.builds(lambda k, shift: math.ldexp(k, -shift), st.integers(-4096, 4096), st.integers(0, 12))
float32_values = st.floats(width=32)  # exact float32s: subnormals, extremes, NaN, ±inf
any_reward = st.one_of(
    special_floats,
    special_ints,
    dyadic,
    float32_values,
    st.floats(),  # float64: rounds on conversion, may overflow float32
    st.integers(-(2**60), 2**60),
    st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
    st.sampled_from([0.0, 1.0]),
)


@st.composite
def reward_palettes(draw: st.DrawFn) -> st.SearchStrategy[Any]:
    """Rewards of one group: typical (few values on a grid) more often than arbitrary ones."""
    kind = draw(st.sampled_from(["binary", "quarters", "dyadic", "palette", "any"]))
    if kind == "binary":
        return st.sampled_from([0.0, 1.0]) | st.sampled_from([0, 1])
    if kind == "quarters":
        return st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])
    if kind == "dyadic":
        return dyadic
    if kind == "palette":
        return st.sampled_from(draw(st.lists(any_reward, min_size=1, max_size=4)))
    return any_reward


@st.composite
def groups(draw: st.DrawFn) -> tuple[list[Sample], list[int] | None]:
    """1-32 rollouts; siblings share a rollout key (rollout_id, index, or the row) and mostly a reward."""
    palette = draw(reward_palettes())
    samples: list[Sample] = []
    for k in range(draw(st.integers(1, 32))):
        reward = draw(palette)
        identity_kind = draw(st.sampled_from(["rollout_id", "rollout_id", "index", "row"]))
        siblings = 1 if identity_kind == "row" else draw(st.sampled_from([1, 1, 1, 2, 3]))
        for _ in range(siblings):
            value = reward
            if siblings > 1 and draw(st.integers(0, 19)) == 0:
                value = draw(any_reward)  # a disagreeing sibling: a violation, unless equal anyway
            elif isinstance(value, int) and abs(value) <= 2**53 and draw(st.integers(0, 4)) == 0:
                value = float(value)  # 1 and 1.0 siblings agree
            samples.append(Sample(
                rollout_id=k if identity_kind == "rollout_id" else None,
                index=k if identity_kind == "index" else None,
                reward=value,
            ))
    order = draw(st.permutations(range(len(samples))))
    samples = [samples[i] for i in order]
    rows = None
    if draw(st.booleans()):
        rows = draw(st.lists(st.integers(0, 10_000), min_size=len(samples), max_size=len(samples),
                             unique=True))
    return samples, rows


configs = st.builds(
    RewardConfig,
    advantage_estimator=st.sampled_from(ADVANTAGE_ESTIMATORS),
    rewards_normalization=st.booleans(),
    grpo_std_normalization=st.booleans(),
)


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group=groups(), cfg=configs)
@example(group=(rollouts([-0.0, -0.0]), None), cfg=RewardConfig())
@example(group=(rollouts([2.0**22, 2.0**22, 2.0**22 + 1]), None), cfg=RewardConfig())
@example(group=(rollouts([2**53 + 2**29 + 1, 0]), None), cfg=RewardConfig())
def test_bit_identical_to_the_previous_implementation(
    group: tuple[list[Sample], list[int] | None], cfg: RewardConfig
) -> None:
    samples, rows = group
    assert_same(samples, cfg, rows)


@settings(max_examples=400, deadline=None)
@given(group=groups(), cfg=configs, key=st.sampled_from(["score", ""]))
def test_bit_identical_with_a_reward_key(group: tuple[list[Sample], list[int] | None], cfg: RewardConfig,
                                         key: str) -> None:
    samples, rows = group
    keyed = [Sample(rollout_id=s.rollout_id, index=s.index, reward={"score": s.reward, "other": 1.0})
             for s in samples] if key else samples
    cfg = RewardConfig(advantage_estimator=cfg.advantage_estimator, reward_key=key,
                       rewards_normalization=cfg.rewards_normalization,
                       grpo_std_normalization=cfg.grpo_std_normalization)
    assert_same(keyed, cfg, rows)


# ---------------------------------------------------------------- targeted cases

EDGE_GROUPS: list[tuple[str, list[Any]]] = [
    # typical rewards: the torch-free path
    ("binary_g8", [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
    ("binary_g16", [1.0, 0.0] * 8),
    ("quarters_g8", [0.0, 0.25, 0.5, 0.75, 1.0, 0.5, 0.25, 0.0]),
    ("binary_ints", [0, 1, 1, 0, 0, 0, 0, 1]),
    ("mean_not_a_float32_g12", [1.0] * 5 + [0.0] * 7),
    ("mean_rounds_g3", [5.0, 0.0, 0.0]),
    ("mean_rounds_up_half_ulp", [2.0**22, 2.0**22, 2.0**22 + 1]),
    ("mean_near_zero", [-1.0] * 5 + [1.0] * 7),
    ("all_equal_zero_variance", [0.75] * 8),
    ("all_zero", [0.0] * 8),
    ("all_fail_ints", [0] * 16),
    ("single_rollout", [0.5]),
    ("single_int_rollout", [3]),
    ("thirty_two_rollouts", [k / 8 for k in range(32)]),
    # signed zeros
    ("all_negative_zero", [-0.0] * 4),
    ("single_negative_zero", [-0.0]),
    ("mixed_zeros", [-0.0, 0.0, -0.0]),
    ("negative_zero_and_values", [-0.0, 1.0, -1.0]),
    ("cancelling_to_zero", [-1.5, 1.5, -0.25, 0.25]),
    # sums exactly at, and just past, the exact-in-float32 limit
    ("sum_magnitude_2p24_minus_1", [2.0**23, 2.0**23 - 1]),
    ("sum_magnitude_2p24", [2.0**23, 2.0**23]),
    ("sum_rounds_in_float32", [2.0**24, 1.0]),
    ("sum_rounds_in_float32_ints", [2**24, 1, 1, 1]),
    ("odd_at_2p24", [16777215.0, 1.0]),
    ("wide_spread", [2.0**-20, 2.0**20]),
    # not exact: torch's own reductions
    ("tenths", [0.1 * k for k in range(8)]),
    ("thirds", [1 / 3, 2 / 3, 1.0]),
    ("reward_model_scores", [0.8123, -1.7, 2.25e-3, 3.14159, -0.5, 12.0, 7.7, -3.3]),
    ("equal_but_not_exact_mean", [123.456] * 11),
    ("large_offset", [1e6 + 0.1 * k for k in range(8)]),
    # ints: exact below 2**53, torch's double rounding above
    ("int_2p24_plus_1", [2**24 + 1, 0]),
    ("int_2p53", [2**53, -(2**53), 1]),
    ("int_2p53_plus_1", [2**53 + 1, 0]),
    ("int_double_rounding", [2**53 + 2**29 + 1, 0]),
    ("int_beyond_int64", [2**64, 1]),
    ("int_beyond_float64", [2**1100, 1]),
    ("int_and_float_mix", [1, 0.5, 2, -3]),
    # subnormals
    ("float32_subnormals", [2.0**-149, 2.0**-148, 0.0]),
    ("float32_subnormal_mean", [1e-45, 0.0, 0.0]),
    ("float64_subnormal_to_zero", [5e-324, 1e-310, 0.0]),
    ("tiny_and_normal", [1e-40, 1.0]),
    ("tiny_std", [1e-38, 1.1e-38, 1.2e-38]),
    ("subnormal_mix", [1.37e-43, -9.38e-41, 2.1e-39, -8.1e-45, 1.8e-38, -1.85e-38, 0.0, 2.9e-44]),
    ("subnormal_sum", [-(2.0**-125), 2.0**-125 - 2.0**-130, 0.0]),
    ("subnormal_sum_mix", [1.77e-41, 5.29e-38, -6.02e-38, -2.55e-41, 1.27e-40]),
    # beyond float32, overflow inside the ops, non-finite
    ("float32_max", [FLOAT32_MAX, 0.0]),
    ("float32_max_pair", [FLOAT32_MAX, -FLOAT32_MAX]),
    ("sum_overflows_float32", [3e38, 3e38]),
    ("std_overflows_float32", [3e38, -3e38]),
    ("rounds_to_float32_max", [3.4028235e38, 1.0]),
    ("rounds_to_inf", [FLOAT32_OVERFLOW, 1.0]),
    ("beyond_float32", [1e39, 1.0]),
    ("beyond_float32_negative", [-1e300, 1.0]),
    ("inf", [math.inf, 1.0]),
    ("inf_minus_inf", [math.inf, -math.inf]),
    ("single_inf", [-math.inf]),
    ("nan", [math.nan, 1.0]),
    ("negative_nan", [-math.nan, 0.5]),
    ("single_nan", [math.nan]),
    # not plain int/float: torch's conversion
    ("numpy_float64", [np.float64(0.25), np.float64(1.0)]),
    ("numpy_float32", [np.float32(0.1), 0.5]),
    ("numpy_int64", [np.int64(3), 1]),
    ("numpy_float16", [np.float16(0.3), 0.0]),
]


@pytest.mark.parametrize(("shared", "siblings"), [
    pytest.param(shared, siblings, id=f"{name}-x{siblings}")
    for name, shared in EDGE_GROUPS for siblings in (1, 2)
])
def test_edge_groups(shared: list[Any], siblings: int) -> None:
    for cfg in ALL_CONFIGS:
        assert_same(rollouts(shared, siblings), cfg)


@pytest.mark.parametrize("rows", [None, [4, 0, 9, 7, 1, 2], [100, 101, 102, 103, 104, 105]])
def test_siblings_by_index_and_row(rows: list[int] | None) -> None:
    samples = [
        Sample(index=7, reward=0.25), Sample(reward=1.0), Sample(index=7, reward=0.25),
        Sample(rollout_id="a", reward=0.0), Sample(reward=0.5), Sample(rollout_id="a", index=3, reward=0.0),
    ]
    for cfg in ALL_CONFIGS:
        assert_same(samples, cfg, rows)


@pytest.mark.parametrize(("samples", "rows"), [
    ([Sample(rollout_id=1, reward=1.0), Sample(rollout_id=1, reward=2.0)], None),
    ([Sample(rollout_id=1, reward=math.nan), Sample(rollout_id=1, reward=math.nan)], [3, 5]),
    ([Sample(rollout_id=1, reward=1), Sample(rollout_id=1, reward=True)], None),  # bool: selection error
    ([Sample(rollout_id=1, reward=None)], None),
    ([Sample(rollout_id=1, reward={"score": 1.0})], None),
    ([Sample(reward=1.0), Sample(reward=2.0)], [1, 1]),
    ([Sample(reward=1.0)], [0, 1]),
    ([], None),
])
def test_errors_and_violations_unchanged(samples: list[Sample], rows: list[int] | None) -> None:
    for cfg in (RewardConfig(), RewardConfig(advantage_estimator="ppo")):
        assert_same(samples, cfg, rows)


def test_random_groups_in_bulk() -> None:
    """Many more groups than hypothesis draws, of the kinds the stream sees, against the reference."""
    rng = random.Random(20240611)
    choices: list[Callable[[], Any]] = [
        lambda: rng.choice([0.0, 1.0]),
        lambda: rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]),
        lambda: rng.randint(-3, 10),
        lambda: rng.randint(-64, 64) / 16,
        lambda: rng.gauss(0.0, 1.0),
        lambda: rng.uniform(-1e6, 1e6),
        lambda: math.ldexp(rng.randint(-(2**23), 2**23), rng.randint(-160, 110)),
    ]
    for _ in range(4000):
        draw = rng.choice(choices)
        shared = [draw() for _ in range(rng.choice([1, 2, 3, 4, 5, 7, 8, 12, 16, 24, 32]))]
        assert_same(rollouts(shared), rng.choice(ALL_CONFIGS))


# ---------------------------------------------------------------- the fast path is taken, and safe to leave


def test_torch_build_matches_the_emulation() -> None:
    """The import-time probes passed here; a torch whose kernels differ would silently lose the speed-up."""
    assert rewards_module.torch_free_normalization() and rewards_module._FAST_STATISTICS


@pytest.mark.parametrize("shared", [
    [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
    [1.0, 0.0] * 8,
    [0.0, 0.25, 0.5, 0.75, 1.0, 0.5, 0.25, 0.0],
    [0, 1, 1, 0, 0, 0, 0, 1],
    [1.0] * 5 + [0.0] * 7,
    [0.0] * 8,
    [0.5],
])
def test_typical_groups_need_no_torch(shared: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    expected = [identity(_reference_normalize_group(rollouts(shared), cfg)) for cfg in ALL_CONFIGS]

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch was called for a typical group")

    rewards_module.torch_free_normalization()
    monkeypatch.setattr(rewards_module, "torch", type("NoTorch", (), {"__getattr__": forbidden})())
    assert [identity(normalize_group(rollouts(shared), cfg)) for cfg in ALL_CONFIGS] == expected


@pytest.mark.parametrize("shared", [[0.1 * k for k in range(8)], [123.456] * 11, [1.0, 2.0**-30, 3.0],
                                    [2.0**24, 1.0], [-0.0, -0.0]])
def test_inexact_sums_use_torch_reductions_only(shared: list[float]) -> None:
    values = rewards_module._float32_inputs(shared)
    assert values is not None and rewards_module._exact_moments(values) is None
    assert rewards_module._fast_statistics(shared, RewardConfig()) is not None


@pytest.mark.parametrize("shared", [[math.nan, 1.0], [math.inf], [1e39], [2**53 + 1],
                                    [np.float64(0.5)], [3e38, 3e38], [3e38, -3e38]])
def test_left_to_torch(shared: list[Any]) -> None:
    assert rewards_module._fast_statistics(shared, RewardConfig()) is None


def test_disabled_fast_path_is_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rewards_module, "_FAST_STATISTICS", False)
    for _, shared in EDGE_GROUPS[:12]:
        assert_same(rollouts(shared, 2), RewardConfig())


def test_flushed_subnormals_leave_it_to_torch() -> None:
    """With FTZ/DAZ on (torch.set_flush_denormal, or a -ffast-math library), float32 casts and torch's
    kernels leave IEEE semantics; the fast path stands aside and the results stay torch's."""
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        assert rewards_module._flushes_subnormals()
        for _, shared in EDGE_GROUPS:
            for cfg in (RewardConfig(), RewardConfig(grpo_std_normalization=False),
                        RewardConfig(advantage_estimator="ppo")):
                assert_same(rollouts(shared), cfg)
    finally:
        torch.set_flush_denormal(False)
    assert not rewards_module._flushes_subnormals()
