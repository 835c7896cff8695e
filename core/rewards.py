"""Reward post-processing: shared-reward check and per-prompt-group normalization (docs/spec.md §2).

Bit-identical to the reference trainer (radixark/miles, `miles/ray/rollout/train_data_conversion.py`,
`_post_process_rewards` / `_normalize_rewards_by_rollout` after PR #2498): the same torch float32
operations, in the same order, on the same per-rollout lists. On the stream's hot path the group
statistics skip torch's per-call overhead where plain Python provably yields the same bits (see
"per-group float32 statistics" below).

Exceptions::

    ValueError
     ├── RewardSelectionError   a sample's raw reward cannot be selected (missing, shape, not a number)
     └── SharedRewardError      siblings of one rollout carry different raw rewards (docs/spec.md §2.5 text)
"""

from __future__ import annotations

import functools
import math
import operator
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import msgspec
import numpy as np

from rollout_stream.codec import Sample, compiled
from rollout_stream.core.config import RewardConfig

__all__ = [
    "torch_free_normalization",
    "GroupRewards",
    "RewardSelectionError",
    "RolloutIdentity",
    "RolloutKey",
    "SharedRewardError",
    "SharedRewardViolation",
    "normalize_group",
    "post_process_rewards",
    "declared_rollout_key",
    "prompt_groups",
    "rollout_key",
    "select_reward",
    "selected_reward",
]

# A rollout's identity inside its prompt group: rollout_id, else index, else ("row", batch row).
RolloutKey = int | str | tuple[str, int]

_NUMBER_TYPES = (int, float, np.integer, np.floating)
_PLAIN_NUMBER_TYPES = frozenset({int, float})  # exact types: bool, numpy scalars and subclasses excluded


class RewardSelectionError(ValueError):
    """A sample's raw reward cannot be selected: missing, not a mapping, key absent, or not a number."""


class SharedRewardError(ValueError):
    """Siblings of one rollout carry different raw rewards; `str()` is exactly docs/spec.md §2.5's text."""

    def __init__(self, message: str, violation: SharedRewardViolation | None = None) -> None:
        super().__init__(message)
        self.violation = violation


class GroupRewards(msgspec.Struct, frozen=True, gc=False):
    """One prompt group's rewards: `raw`/`rewards` per sample in input order, stats over rollouts.

    A struct, not a frozen dataclass: one is built per group, and a frozen dataclass's `__init__` calls
    `object.__setattr__` per field, a large part of `normalize_group` (docs/benchmarks.md). Nothing in it
    refers back to it, so the collector need not track it.
    """

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
    """The sample's raw reward: `reward`, or `reward[reward_key]` when a key is set (docs/spec.md §2.1).

    The one definition of reward selection: the batch API, the window's validation and the dead-letter
    tools all ask it. The value is returned unchanged (an int stays an int, as in the reference). An
    empty `reward_key` counts as unset, like the reference's `if not args.reward_key`. With
    `require_finite`, NaN and ±inf are refused too (the stream's stricter input rule, §4.4).
    """
    return select_reward(sample.reward, reward_key, require_finite=require_finite)


def select_reward(reward: object, reward_key: str | None, *, require_finite: bool = False) -> float:
    """`selected_reward` of a sample whose reward field is `reward` (for readers that decode only part of
    a sample); raises `RewardSelectionError` when it cannot be selected."""
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
    # Unchanged, as in the reference: an int stays an int and a numpy scalar a numpy scalar (float here
    # is the numeric tower's "a real number", which numpy's scalar types are not to mypy).
    return value  # type: ignore[return-value]


class RolloutIdentity(Protocol):
    """What names a sample's rollout: a `Sample`, or a dead-letter tool's partial decoding of one."""

    @property
    def rollout_id(self) -> int | str | None: ...

    @property
    def index(self) -> int | None: ...


def declared_rollout_key(sample: RolloutIdentity) -> int | str | None:
    """The rollout a sample names itself (docs/spec.md §2.4): `rollout_id`, else `index`; None when it names
    neither, and is then a rollout of its own.

    Only a rollout's siblings share this key. Who holds a nameless sample gives it a key of its own:
    the batch API its row (`rollout_key`), the window its Kafka offset, the reader its position.
    """
    if sample.rollout_id is not None:
        return sample.rollout_id
    return sample.index


def rollout_key(sample: Sample, row: int) -> RolloutKey:
    """A batch row's rollout identity (docs/spec.md §2.4): `declared_rollout_key`, else the row itself."""
    key = declared_rollout_key(sample)
    return ("row", row) if key is None else key


def _raw_rewards(samples: Sequence[Sample], reward_key: str | None) -> list[float]:
    """`selected_reward` of each sample; plain int/float rewards without a key are taken as they are."""
    if not reward_key:
        raw = [sample.reward for sample in samples]
        if set(map(type, raw)) <= _PLAIN_NUMBER_TYPES:  # what selected_reward returns unchanged
            return cast(list[float], raw)  # every one an int or a float: checked just above
    return [selected_reward(sample, reward_key) for sample in samples]


def normalize_group(
    samples: Sequence[Sample], cfg: RewardConfig, *, rows: Sequence[int] | None = None
) -> GroupRewards | SharedRewardViolation:
    """Check shared rewards and normalize one prompt group (docs/spec.md §2.4–§2.7).

    `rows` are the samples' batch row indices, printed in a violation message and used as the
    identity of rows without `rollout_id`/`index` (default `range(len(samples))`). The shared-reward
    check runs for every estimator here (the stream is strict); the batch API skips it for
    pass-through estimators, as the reference does. Raises `RewardSelectionError` for a sample whose
    reward cannot be selected and `ValueError` for an empty group.
    """
    count = len(samples)
    if count == 0:
        raise ValueError("a prompt group needs at least one sample")
    row_ids: Sequence[int]
    if rows is None:
        row_ids = range(count)
    else:
        row_ids = [operator.index(row) for row in rows]
        if len(row_ids) != count or len(set(row_ids)) != count:
            raise ValueError(f"rows must be {count} distinct batch row indices; got {row_ids}")
    if rows is None:
        plain = _plain_group(samples, cfg)
        if plain is not None:
            return plain
    raw = _raw_rewards(samples, cfg.reward_key)

    members: dict[RolloutKey, list[int]] | None = None  # None: one sample per rollout, in `samples` order
    rollout_ids = [sample.rollout_id for sample in samples]
    if None not in rollout_ids and len(set(rollout_ids)) == count:
        # The common case: every sample names a rollout of its own (its rollout_id is its rollout key), so
        # there are no siblings to check and each rollout's shared reward is its sample's.
        shared = list(raw)
    else:
        members = {}  # rollout key -> positions in `samples`, first-seen order
        for position, sample in enumerate(samples):
            members.setdefault(rollout_key(sample, row_ids[position]), []).append(position)
        shared = []
        for key, positions in members.items():
            first = raw[positions[0]]
            if len(positions) > 1 and any(raw[position] != first for position in positions[1:]):
                return SharedRewardViolation(
                    rollout_key=key,
                    rows=[row_ids[position] for position in positions],
                    rewards=[raw[position] for position in positions],
                )
            shared.append(first)

    # Over rollouts: torch-free where that is provably bit-identical, else the reference's torch ops.
    fast = torch_free_normalization() and not _flushes_subnormals()
    statistics = _fast_statistics(shared, cfg) if fast else None
    values, mean, std, zero_variance = statistics or _torch_statistics(shared, cfg)
    if values is None:
        rewards = list(raw)
    elif members is None:
        rewards = values  # rollout i is sample i
    else:
        rewards = [0.0] * count
        for positions, value in zip(members.values(), values, strict=True):
            for position in positions:
                rewards[position] = value
    return GroupRewards(
        raw=raw,
        rewards=rewards,
        rollout_count=len(shared),
        mean=mean,
        std=std,
        zero_variance=zero_variance,
    )


def _plain_group(samples: Sequence[Sample], cfg: RewardConfig) -> GroupRewards | None:
    """`normalize_group`'s common case in few steps, or None: float rewards without a reward key, every
    sample a rollout of its own (distinct rollout_ids), statistics the C answers (it declines anything but
    finite floats with exact sums). The same values as the general path, which the tests compare it with."""
    if cfg.reward_key or _native_statistics is None:
        return None
    if not torch_free_normalization() or _flushes_subnormals():
        return None
    ids = {sample.rollout_id for sample in samples}
    if len(ids) != len(samples) or None in ids:
        return None
    raw = cast(list[float], [sample.reward for sample in samples])  # anything else, the C declines
    found = _native_statistics(raw, cfg.normalizes, cfg.divides_by_std)
    if found is None:
        return None
    values, mean, std, zero_variance = found
    return GroupRewards(raw, list(raw) if values is None else values, len(raw), mean, std, zero_variance)


# ---------------------------------------------------------------- per-group float32 statistics
#
# `_torch_statistics` is the definition: the reference's torch float32 ops, in its order. Its ~13
# tiny torch calls cost far more in dispatch than in arithmetic (docs/benchmarks.md), so
# `_fast_statistics` computes the same bits in plain Python where they provably are the same, and
# declines (returns None) everywhere else. It is used only if `_torch_matches_emulation()` confirms, on
# first use, the torch behaviour it relies on:
#
# * A float32 +, -, / equals the float64 operation on the same operands rounded once to float32
#   (float64 has 53 >= 2*24 + 2 bits, so double rounding is innocuous, subnormal and overflowing
#   results included). `_round32` rounds like the C (float) cast torch uses.
# * torch's float32 `mean()` is sum / n, and its unbiased `std()` is the float64 sum of squared
#   deviations from that float32 mean, / (n - 1), sqrt, cast to float32. Only the summation order is
#   kernel-specific, and only through rounding (and the sign of an all -0.0 sum): `_exact_moments`
#   takes groups whose sums are exact in any order; other groups get both from torch's kernels
#   (`_torch_moments`, 3 torch calls).
# * NaN, ±inf and overflow (whose NaN sign/payload bits are kernel-specific), ints beyond 2**53 (torch
#   rounds them through float64), numpy scalars and threads that flush subnormals to zero are left to
#   `_torch_statistics`.

# Rewards per rollout (None for pass-through estimators), mean, std, zero_variance.
_Statistics = tuple[list[float] | None, float, float, bool]

_FLOAT32 = struct.Struct("<f")  # packing rounds like a (float) cast and raises OverflowError for ±inf
_FLOAT_TYPES = frozenset({float})
_EXACT_INT = 2**53  # ints up to this are exact float64s, so every int -> float32 route agrees
_EXACT_SUM = 2.0**53  # integer float64 sums below this are exact in any order
_FLOAT32_EXPONENT_LIMIT = 128  # multiples of 2**104 below 2**128 are finite float32s
_SUBNORMAL = 5e-324  # float64 subnormal inputs become 0 under DAZ
_MIN_NORMAL = 2.2250738585072014e-308  # and subnormal results (here inexact) become 0 under FTZ


def _round32(value: float) -> float:
    """`value` rounded to the nearest float32 (ties to even); OverflowError when that is ±inf."""
    rounded: float = _FLOAT32.unpack(_FLOAT32.pack(value))[0]
    return rounded


@functools.lru_cache(maxsize=128)
def _float32_vector(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}f")


def _round32_all(values: list[float]) -> list[float]:
    """`_round32` of every value, in one pack and unpack."""
    vector = _float32_vector(len(values))
    return list(vector.unpack(vector.pack(*values)))


# torch casts the scalar of `std + 1e-6` to the tensor's float32 before adding.
_STD_EPSILON = _round32(1e-6)


# `_fast_statistics` of the common group in C (core/_float32_statistics.c); None where it is not built or the
# Python path was asked for (codec/compiled.py).
_native_statistics: Callable[[list[float], bool, bool], _Statistics | None] | None
try:
    from rollout_stream.core._float32_statistics import statistics as _native_statistics
except ImportError:  # not built: no C compiler when the package was installed
    _native_statistics = None
if not compiled.enabled():
    _native_statistics = None


# torch is imported on first use: command-line tools that never normalize start without waiting for it.
torch: Any = None


def _torch() -> Any:
    global torch
    if torch is None:
        import torch as module

        torch = module
    return torch


def _torch_statistics(shared: list[float], cfg: RewardConfig) -> _Statistics:
    """The reference's exact float32 ops: mean over rollouts, unbiased std, divide only if std > 0."""
    torch = _torch()
    rollout_rewards = torch.tensor(shared, dtype=torch.float)
    mean = rollout_rewards.mean()
    std = rollout_rewards.std() if len(shared) > 1 else None
    values: list[float] | None = None
    if cfg.normalizes:
        normalized = rollout_rewards - mean
        if cfg.divides_by_std and std is not None and std > 0:
            normalized = normalized / (std + 1e-6)
        values = normalized.tolist()
    return (
        values,
        mean.item(),
        0.0 if std is None else std.item(),
        bool((rollout_rewards == rollout_rewards[0]).all()),
    )


def _fast_statistics(shared: list[float], cfg: RewardConfig) -> _Statistics | None:
    """`_torch_statistics(shared, cfg)`, bit for bit, without elementwise torch calls; or None.

    Valid only if the import-time probes passed and the thread does not flush subnormals.
    """
    if _native_statistics is not None:  # the same steps in C, for plain float rewards with exact sums
        found = _native_statistics(shared, cfg.normalizes, cfg.divides_by_std)
        if found is not None:
            return found
    values = _float32_inputs(shared)
    if values is None:
        return None
    moments = _exact_moments(values) or _torch_moments(values)
    if moments is None:
        return None
    mean, std = moments
    normalized: list[float] | None = None
    if cfg.normalizes:
        try:
            normalized = _round32_all([value - mean for value in values])
            if cfg.divides_by_std and std > 0.0:  # std is 0.0 for one rollout, where torch has None
                divisor = _round32(std + _STD_EPSILON)
                normalized = _round32_all([value / divisor for value in normalized])
        except OverflowError:  # ±inf in float32
            return None
    return normalized, mean, std, values.count(values[0]) == len(values)


def _flushes_subnormals() -> bool:
    """Whether this thread's FPU flushes subnormals to zero (`torch.set_flush_denormal(True)`, or a
    library built with -ffast-math): float32 casts and torch's kernels then leave IEEE semantics."""
    return _SUBNORMAL * 2.0 == 0.0 or _MIN_NORMAL / 3.0 == 0.0


def _float32_inputs(shared: list[float]) -> list[float] | None:
    """The float32 values of `torch.tensor(shared, dtype=torch.float)`, as Python floats.

    None unless every value is a plain float or an int within ±2**53, and every float32 is finite.
    """
    kinds = set(map(type, shared))
    if kinds != _FLOAT_TYPES:
        if not kinds <= _PLAIN_NUMBER_TYPES or any(
            type(value) is int and not -_EXACT_INT <= value <= _EXACT_INT for value in shared
        ):
            return None
        shared = [float(value) for value in shared]
    try:
        values = _round32_all(shared)
    except OverflowError:  # finite in float64, beyond the float32 range
        return None
    if not math.isfinite(sum(values)):  # NaN or ±inf (a sum of finite float32s cannot overflow)
        return None
    return values


def _exact_moments(values: list[float]) -> tuple[float, float] | None:
    """torch's float32 `mean()` and unbiased `std()` (0.0 for one value) when all sums are exact.

    The float32 sum is exact in any order when every value is a multiple of 2**(e-24) and their
    magnitudes sum below 2**e <= 2**128: no partial sum can round or overflow. The float64 sum of
    squared deviations is exact in any order when the values and the mean are multiples of 2**g and
    the squares, in units of 2**(2g), sum below 2**53. Otherwise None: the kernels' summation order
    would decide the rounding.
    """
    _, exponent = math.frexp(sum(map(abs, values)))
    if exponent > _FLOAT32_EXPONENT_LIMIT:  # a partial sum could overflow float32
        return None
    scale = math.ldexp(1.0, 24 - exponent)
    if not all(map(float.is_integer, [value * scale for value in values])):
        return None
    total = sum(values)  # exact
    if total == 0.0 and all(math.copysign(1.0, value) < 0.0 for value in values):
        return None  # all -0.0: the sign of a zero sum depends on the kernel's initial value
    count = len(values)
    mean = _round32(total / count)
    if count == 1:
        return mean, 0.0
    grid = min(exponent, math.frexp(mean)[1]) - 24
    units = math.ldexp(1.0, -grid)
    deviations = [(value - mean) * units for value in values]  # exact integers if the check passes
    squares = sum(map(operator.mul, deviations, deviations))
    if squares >= _EXACT_SUM:
        return None
    variance = math.ldexp(squares, 2 * grid) / (count - 1)
    try:
        return mean, _round32(math.sqrt(variance))
    except OverflowError:
        return None


def _torch_moments(values: list[float]) -> tuple[float, float] | None:
    """torch's float32 `mean()` and unbiased `std()` of `values` from its own kernels, if finite.

    `values` are float32 already, so the tensor holds exactly the reference's.
    """
    tensor = _torch().from_numpy(np.array(values, dtype=np.float32))
    mean = tensor.mean().item()
    std = tensor.std().item() if len(values) > 1 else 0.0
    if not (math.isfinite(mean) and math.isfinite(std)):
        return None
    return mean, std


def _torch_matches_emulation() -> bool:
    """Whether this torch build computes what `_fast_statistics` assumes; checked once, on first use.

    Each probe tells the assumed operation from a plausible alternative: mean as sum / n (not
    sum * (1/n)), std as two passes over the float32 mean (not Welford), `std + 1e-6` in float32,
    division (not multiplication by the reciprocal).
    """
    torch = _torch()
    grpo = RewardConfig()
    for shared in ([5.0, 0.0, 0.0], [2.0**22, 2.0**22, 2.0**22 + 1.0], [0.0, 1.0, 0.25, 0.25]):
        fast = _fast_statistics(shared, grpo)
        if fast is None or repr(fast) != repr(_torch_statistics(shared, grpo)):  # repr: exact, ±0 apart
            return False
    tiny = 975 * 2.0**-30  # float32(tiny + 1e-6) != float32(tiny + float32(1e-6))
    added = torch.tensor(tiny, dtype=torch.float) + 1e-6
    numerator, denominator = -0.11035414040088654, 1.768979787826538  # float32s; n / d != n * (1 / d)
    divided = torch.tensor([numerator], dtype=torch.float) / torch.tensor(denominator, dtype=torch.float)
    adds_in_float32 = added.item() == _round32(tiny + _STD_EPSILON)
    return adds_in_float32 and bool(divided.item() == _round32(numerator / denominator))


_FAST_STATISTICS: bool | None = None  # decided by `_torch_matches_emulation()` on first use


def torch_free_normalization() -> bool:
    """Whether `normalize_group` may use its torch-free path. The first call imports torch and runs the
    self-check (the stream worker calls it at start, so that cost is not paid in the first group)."""
    global _FAST_STATISTICS
    if _FAST_STATISTICS is None:
        _FAST_STATISTICS = _torch_matches_emulation()
    return _FAST_STATISTICS


def prompt_groups(
    samples: Sequence[Sample], cfg: RewardConfig, prompt_group_sizes: Sequence[int] | None = None
) -> list[list[int]]:
    """Batch row indices of each prompt group, by docs/spec.md §2.3's precedence."""
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
