"""Staleness by group, by rollout or by token: what of a prompt group trains at a trainer's weight version
under a staleness bound (docs/spec.md §4.7, docs/reader.md "Staleness grain").

A weight version `v` is past the bound when `v < weight_version - max_staleness` (`collate.is_stale_version`).

* `group`: the group is skipped whole when its oldest version is past the bound (`collate.is_stale`).
* `rollout`: a rollout (a sample and its siblings) whose oldest version is past the bound leaves the batch.
* `token`: response tokens generated under a version past the bound get loss mask 0; a rollout with such
  tokens and no trainable token left leaves the batch.

What stays trains with the rewards the stage computed over the whole group: the baseline keeps every
rollout's reward, nothing is renormalized. A group with nothing left is skipped, as in `group` mode. With
nothing past the bound the three modes train the same. Pure: the same group, version and bound give the
same decision on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec
import numpy as np

from rollout_stream.codec import Array, Sample, TrainSample
from rollout_stream.core.collate import _INT, is_stale_version, oldest_weight_version, rollout_units
from rollout_stream.core.validate import version_spans_problem

__all__ = [
    "STALENESS_MODES",
    "StalenessMode",
    "StalenessDecision",
    "staleness_decision",
    "span_loss_tokens",
    "spans_loss_mask",
    "stale_tokens",
    "token_version_rows",
    "token_versions",
    "trainable_tokens",
    "trained",
    "without_stale_tokens",
    "version_numbers",
]

StalenessMode = Literal["group", "rollout", "token"]
STALENESS_MODES: tuple[StalenessMode, ...] = ("group", "rollout", "token")

_INT64 = np.iinfo(np.int64)


def version_numbers(sample: Sample) -> list[int]:
    """The sample's weight versions as integers; ValueError for one that is not an integer."""
    numbers = []
    for text in sample.weight_versions:
        if not _INT.fullmatch(text.strip()):
            raise ValueError(f"weight version {text!r} is not an integer")
        numbers.append(int(text))
    return numbers


def token_versions(sample: Sample) -> np.ndarray | None:
    """The weight version each response token was generated under: int64, `response_length` long, aligned
    with the loss mask; None when the sample lists no version.

    Without `weight_version_offsets` every token gets the oldest listed version (the whole response is judged
    by it, as before offsets existed). ValueError for a version that is not an integer or offsets that do not
    fit.
    """
    versions = version_numbers(sample)
    if not versions:
        return None
    if not _INT64.min <= min(versions) <= max(versions) <= _INT64.max:
        raise ValueError(f"weight versions {sample.weight_versions} do not fit int64")
    length = sample.response_length
    offsets = sample.weight_version_offsets
    if offsets is None:
        return np.full(length, min(versions), dtype=np.int64)
    problem = version_spans_problem(sample)
    if problem is not None:
        raise ValueError(problem)
    starts = offsets.numpy().astype(np.int64)
    return np.repeat(np.asarray(versions, dtype=np.int64), np.diff(starts, append=length))


def trainable_tokens(sample: Sample) -> np.ndarray:
    """Which response tokens count in the loss, as `collate` masks them: a missing mask is all ones, a removed
    sample has none."""
    length = sample.response_length
    if sample.remove_sample:
        return np.zeros(length, dtype=bool)
    if sample.loss_mask is None:
        return np.ones(length, dtype=bool)
    return np.asarray(sample.loss_mask.numpy() != 0, dtype=bool)


def stale_tokens(sample: Sample, floor: int) -> np.ndarray:
    """Which response tokens count in the loss and were generated under a weight version below `floor`."""
    trainable = trainable_tokens(sample)
    versions = token_versions(sample)
    return trainable & (versions < floor) if versions is not None else np.zeros_like(trainable)


def without_stale_tokens(train: TrainSample, floor: int) -> TrainSample:
    """`train` with loss mask 0 on its `stale_tokens` (the same object when there are none); rewards kept."""
    stale = stale_tokens(train.sample, floor)
    return _with_mask(train, _masked(train.sample, stale)) if stale.any() else train


def span_loss_tokens(sample: Sample) -> list[int] | None:
    """Per weight version, the response tokens of its span that count in the loss; None without
    `weight_version_offsets`. What a group head carries for token staleness without the payload."""
    offsets = sample.weight_version_offsets
    if offsets is None or version_spans_problem(sample) is not None:
        return None
    running = np.concatenate(([0], np.cumsum(trainable_tokens(sample), dtype=np.int64)))
    starts = offsets.numpy().astype(np.int64)
    ends = np.append(starts[1:], sample.response_length)
    return (running[ends] - running[starts]).tolist()  # type: ignore[no-any-return]


def spans_loss_mask(offsets: Sequence[int], span_tokens: Sequence[int], length: int) -> np.ndarray:
    """A uint8 loss mask with `span_tokens[i]` ones at the start of version i's span (clipped to it): a
    sample's mask as its group head tells it, enough to decide staleness as the whole mask would."""
    starts = np.asarray(offsets, dtype=np.int64)
    sizes = np.diff(starts, append=length)
    span = np.repeat(np.arange(len(starts)), sizes)
    position = np.arange(length, dtype=np.int64) - starts[span]
    return (position < np.asarray(span_tokens, dtype=np.int64)[span]).astype(np.uint8)


def token_version_rows(samples: Sequence[TrainSample]) -> np.ndarray:
    """`token_versions` of each sample as an int64 (B, R) matrix aligned with `collate`'s loss mask: -1 on
    padding and for a sample without integer weight versions (or whose offsets do not fit)."""
    width = max((t.sample.response_length for t in samples), default=0)
    out = np.full((len(samples), width), -1, dtype=np.int64)
    for row, t in enumerate(samples):
        try:
            versions = token_versions(t.sample)
        except ValueError:
            continue
        if versions is not None:
            out[row, :len(versions)] = versions
    return out


@dataclass(frozen=True, slots=True)
class StalenessDecision:
    """What of a group trains.

    `rows`: positions (in the group) of the samples that train, in group order; none when the group is skipped
    (`skipped`). `loss_masks`: for each of them, its loss mask after the decision, or None where it is the
    sample's own (the same dtype, excluded tokens set to 0; a missing mask becomes int32 ones first).
    `excluded_rollouts`, `excluded_samples`: rollouts and samples that left (all of a skipped group's);
    `excluded_tokens`: tokens that counted in the loss and no longer do.
    """

    rows: tuple[int, ...]
    loss_masks: tuple[np.ndarray | None, ...]
    excluded_rollouts: int = 0
    excluded_samples: int = 0
    excluded_tokens: int = 0

    @property
    def skipped(self) -> bool:
        return not self.rows


def _everything(count: int) -> StalenessDecision:
    return StalenessDecision(tuple(range(count)), (None,) * count)


def _masked(sample: Sample, stale: np.ndarray) -> np.ndarray:
    mask = sample.loss_mask
    out = np.ones(sample.response_length, dtype=np.int32) if mask is None else mask.numpy().copy()
    out[stale] = 0
    return out


def staleness_decision(group: Sequence[TrainSample], mode: StalenessMode, weight_version: int | None,
                       max_staleness: int | None) -> StalenessDecision:
    """What of `group` trains at `weight_version` under `max_staleness`, by `mode` (the module docstring).

    No bound or no weight version: everything. ValueError for a negative bound, an unknown mode, a weight
    version that is not an integer, or version offsets that do not fit the response.
    """
    if mode not in STALENESS_MODES:
        raise ValueError(f"staleness must be one of {', '.join(STALENESS_MODES)}, got {mode!r}")
    if max_staleness is None or weight_version is None:
        return _everything(len(group))
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    units = rollout_units([group])
    if mode == "group":
        if not is_stale_version(oldest_weight_version(group), weight_version, max_staleness):
            return _everything(len(group))
        return _skipped(group, units)
    samples = [t.sample for t in group]
    leaving: set[int] = set()
    masks: dict[int, np.ndarray] = {}
    excluded_tokens = 0
    floor = weight_version - max_staleness
    for unit in units:
        numbers = [v for row in unit for v in version_numbers(samples[row])]
        if not is_stale_version(min(numbers, default=None), weight_version, max_staleness):
            continue
        trainable = [trainable_tokens(samples[row]) for row in unit]
        if mode == "rollout":
            leaving.update(unit)
            excluded_tokens += sum(int(t.sum()) for t in trainable)
            continue
        left = 0
        for row, can in zip(unit, trainable, strict=True):
            stale = stale_tokens(samples[row], floor)
            if stale.any():
                masks[row] = _masked(samples[row], stale)
                excluded_tokens += int(stale.sum())
            left += int(can.sum()) - int(stale.sum())
        if not left:
            leaving.update(unit)
    rows = tuple(row for row in range(len(group)) if row not in leaving)
    if not rows:
        return _skipped(group, units)
    return StalenessDecision(
        rows, tuple(masks.get(row) for row in rows),
        excluded_rollouts=sum(1 for unit in units if unit[0] in leaving), excluded_samples=len(leaving),
        excluded_tokens=excluded_tokens,
    )


def _skipped(group: Sequence[TrainSample], units: list[list[int]]) -> StalenessDecision:
    tokens = sum(int(trainable_tokens(t.sample).sum()) for t in group)
    return StalenessDecision((), (), excluded_rollouts=len(units), excluded_samples=len(group),
                             excluded_tokens=tokens)


def trained(group: Sequence[TrainSample], decision: StalenessDecision) -> list[TrainSample]:
    """The samples of `group` that train, with their loss masks after `decision`; rewards untouched."""
    return [group[row] if mask is None else _with_mask(group[row], mask)
            for row, mask in zip(decision.rows, decision.loss_masks, strict=True)]


def _with_mask(train: TrainSample, mask: np.ndarray) -> TrainSample:
    return msgspec.structs.replace(train, sample=msgspec.structs.replace(train.sample, loss_mask=Array(mask)))
