"""`rollout_stream.core._float32_statistics` (C) against `rollout_stream.core.rewards._fast_statistics`
(Python), the steps it mirrors: the same tuple, bit for bit, wherever it answers; and it answers for the
common groups, or it saves nothing. tests/core/test_rewards_fastpath.py holds both to the reference's torch
ops.

It exists where the package was installed with a C compiler (setup.py; tests/core/test_compiled.py checks
that CI runs it).
"""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.core import RewardConfig
from rollout_stream.core import rewards as rewards_module
from rollout_stream.core.config import ADVANTAGE_ESTIMATORS
from rollout_stream.core.structs import HeldSample

native = rewards_module._native_statistics
needs_native = pytest.mark.skipif(native is None, 
                                  reason="rollout_stream.core._float32_statistics is not in use in this run")

_CONFIGS = [RewardConfig(advantage_estimator=e, grpo_std_normalization=d)
            for e in ADVANTAGE_ESTIMATORS for d in (True, False)]


def _bits(value: Any) -> Any:
    """Floats by their IEEE-754 bits (so 0.0 and -0.0 differ), recursively."""
    if isinstance(value, float):
        return struct.pack("<d", value)
    if isinstance(value, (list, tuple)):
        return type(value)(_bits(v) for v in value)
    return value


def _python(shared: list[float], cfg: RewardConfig, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patch:
        patch.setattr(rewards_module, "_native_statistics", None)
        return rewards_module._fast_statistics(shared, cfg)


_quarters = st.integers(-8, 8).map(lambda k: k / 4)  # the common rewards: exact sums
_floats = st.one_of(
    _quarters,
    st.sampled_from([0.0, -0.0, 1e-45, 2.0**-149, 3.4028234663852886e38, 1e39, 0.1, 1 / 3, 2.0**24 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(width=32),
)


@needs_native
@settings(max_examples=3000, deadline=None)
@given(st.lists(_quarters, min_size=1, max_size=20) | st.lists(_floats, min_size=1, max_size=20),
       st.sampled_from(_CONFIGS))
def test_the_same_statistics_as_the_python_wherever_it_answers(shared: list[float],
                                                               cfg: RewardConfig) -> None:
    assert native is not None
    found = native(shared, cfg.normalizes, cfg.divides_by_std)
    if found is None:
        return
    with pytest.MonkeyPatch.context() as monkeypatch:
        expected = _python(shared, cfg, monkeypatch)
    assert _bits(found) == _bits(expected)


@needs_native
@pytest.mark.parametrize("shared", [
    [0.5], [1.0, 0.0, 0.25, 0.75, 0.5, 0.5, 1.0, 0.0], [0.25] * 8, [-0.0, 0.0], [3.0, -1.5, 2.0**20],
    [0.75] * 4096, [float(k % 5) / 4 for k in range(100)],
])
def test_common_groups_are_answered_in_c(shared: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    assert native is not None
    for cfg in _CONFIGS:
        found = native(shared, cfg.normalizes, cfg.divides_by_std)
        assert found is not None
        assert _bits(found) == _bits(_python(shared, cfg, monkeypatch))


@needs_native
@pytest.mark.parametrize("shared", [
    [], [1, 2], [0.5, 1], [math.nan], [math.inf, 0.0], [1e39], [-0.0, -0.0], [0.1, 0.2, 0.3], (0.5,),
])
def test_what_it_does_not_answer_is_left_to_the_python(shared: Any) -> None:
    assert native is not None
    assert native(shared, True, True) is None


# ---- normalize_group's one-sample-per-rollout path (rollout_stream.core.rewards._plain_group), which asks
# the C first

def _held(rewards: list[Any], ids: list[Any]) -> list[HeldSample]:
    return [HeldSample(reward, rollout_id, None, 0) for reward, rollout_id in zip(rewards, ids, strict=True)]


def _general(samples: list[HeldSample], cfg: RewardConfig, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patch:
        patch.setattr(rewards_module, "_plain_group", lambda samples, cfg: None)
        return rewards_module.normalize_group(samples, cfg)


def _fields(result: Any) -> Any:
    return _bits([result.raw, result.rewards, result.rollout_count, result.mean, result.std,
                  result.zero_variance])


@needs_native
@settings(max_examples=1500, deadline=None)
@given(st.lists(_quarters, min_size=1, max_size=20) | st.lists(_floats | st.integers(-3, 3), min_size=1,
                                                                max_size=20),
       st.sampled_from(_CONFIGS), st.booleans())
def test_normalize_group_takes_the_c_only_where_it_gives_the_general_paths_values(
        rewards: list[Any], cfg: RewardConfig, distinct: bool) -> None:
    ids = list(range(len(rewards))) if distinct else [k // 2 for k in range(len(rewards))]
    samples = _held(rewards, ids)
    plain = rewards_module._plain_group(samples, cfg)
    with pytest.MonkeyPatch.context() as monkeypatch:
        general = _general(samples, cfg, monkeypatch)
    if plain is None:
        return
    assert distinct or len(rewards) == 1  # siblings are the general path's to check
    assert type(general) is rewards_module.GroupRewards
    assert _fields(plain) == _fields(general)


@needs_native
def test_normalize_group_answers_the_common_group_in_c() -> None:
    samples = _held([1.0, 0.0, 0.25, 0.75, 0.5, 0.5, 1.0, 0.0], list(range(8)))
    for cfg in _CONFIGS:
        assert rewards_module._plain_group(samples, cfg) is not None
    # a reward key, int rewards, a missing or repeated rollout_id: the general path
    keyed = RewardConfig(reward_key="score")
    assert rewards_module._plain_group(_held([1.0, 0.0], [0, 1]), keyed) is None
    assert rewards_module._plain_group(_held([1, 0], [0, 1]), RewardConfig()) is None
    assert rewards_module._plain_group(_held([1.0, 0.0], [None, 1]), RewardConfig()) is None
    assert rewards_module._plain_group(_held([1.0, 0.0], ["a", "a"]), RewardConfig()) is None
