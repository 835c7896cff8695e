"""Trainer-side pure functions: tensor collation, data-parallel sharding, staleness (docs/spec.md §4.6).

Collation works on whole arrays (one concatenation and one masked scatter per field), never per token.
Sharding assigns whole rollouts (a rollout's sibling samples together) to ranks deterministically, so
ranks that see the same groups agree without talking to each other.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # imported where tensors are built: tools that only assemble groups start without torch
    import torch

from rollout_stream.codec import Sample, TrainSample
from rollout_stream.core.rewards import declared_rollout_key
from rollout_stream.core.validate import version_spans_problem

__all__ = [
    "Collated",
    "collate",
    "collation_problem",
    "oldest_weight_version",
    "is_stale",
    "is_stale_version",
    "rollout_units",
    "shard_ranks",
    "shard_groups",
]

_INT = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True, slots=True)
class Collated:
    """B samples as tensors: token arrays right-padded to the longest sample, response arrays likewise.

    A sample's tokens are its prompt followed by its response: response token j of row i is
    `tokens[i, response_index[i, j]]` (= `total_lengths[i] - response_lengths[i] + j`).
    """

    tokens: torch.Tensor  # int64 (B, T), padded with the pad token id
    attention_mask: torch.Tensor  # bool (B, T), True on real tokens
    total_lengths: torch.Tensor  # int64 (B,)
    response_lengths: torch.Tensor  # int64 (B,)
    loss_mask: torch.Tensor  # float32 (B, R), aligned to the response, 0 on padding and on removed samples
    rollout_log_probs: torch.Tensor  # float32 (B, R), 0 on padding and where a sample has none
    has_rollout_log_probs: torch.Tensor  # bool (B,)
    response_index: torch.Tensor  # int64 (B, R), position in `tokens` of each response token (0 on padding)
    rewards: torch.Tensor  # float32 (B,), the processed (group-normalized) reward
    raw_rewards: torch.Tensor  # float32 (B,), the selected raw reward

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def _tokens(s: TrainSample) -> np.ndarray:
    return s.sample.tokens.numpy() if s.sample.tokens is not None else np.zeros(0, dtype=np.int64)


def collation_problem(s: TrainSample | Sample) -> str | None:
    """Why a train sample (or the rollout sample it carries) cannot be collated (inconsistent lengths or
    dtypes), or None."""
    sample = s if isinstance(s, Sample) else s.sample
    total = len(sample.tokens) if sample.tokens is not None else 0
    resp = sample.response_length
    if sample.tokens is not None and sample.tokens.dtype.kind not in "iu":
        return f"tokens have dtype {sample.tokens.dtype}, not an integer type"
    if not 0 <= resp <= total:
        return f"response_length {resp} is outside 0..{total} (the sample has {total} tokens)"
    if sample.loss_mask is not None and len(sample.loss_mask) != resp:
        return f"loss_mask has {len(sample.loss_mask)} entries but response_length is {resp}"
    lp = sample.rollout_log_probs
    if lp is not None and len(lp) != resp:
        return f"rollout_log_probs has {len(lp)} entries but response_length is {resp}"
    if lp is not None and lp.dtype.kind != "f":
        return f"rollout_log_probs have dtype {lp.dtype}, not a float type"
    # validated by the stage, but a stage older than the field passes it on unread
    return version_spans_problem(sample)


def _padded(parts: list[np.ndarray], lengths: np.ndarray, width: int, fill: float, dtype: type) -> np.ndarray:
    """Right-pad 1-D arrays into a (len(parts), width) matrix: one concatenation and one masked scatter."""
    out: np.ndarray = np.full((len(parts), width), fill, dtype=dtype)
    if width and int(lengths.sum()):
        # Boolean-mask assignment fills in row-major order: row i takes the next lengths[i] values.
        out[np.arange(width)[None, :] < lengths[:, None]] = np.concatenate(parts).astype(dtype, copy=False)
    return out


def collate(samples: Sequence[TrainSample], *, pad_token_id: int = 0) -> Collated:
    """Padded tensors for a trainer; raises ValueError on a sample `collation_problem` refuses.

    Loss masks follow the reference trainer: a missing mask means all response tokens count, and a
    sample with `remove_sample` gets an all-zero mask (it stays in the batch, it does not train).
    """
    import torch

    for s in samples:
        problem = collation_problem(s)
        if problem is not None:
            raise ValueError(f"group {s.group_key}, rollout {declared_rollout_key(s.sample)!r}: {problem}")
    n = len(samples)
    tokens = [_tokens(s) for s in samples]
    total = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=n)
    resp = np.fromiter((s.sample.response_length for s in samples), dtype=np.int64, count=n)
    width = int(total.max()) if n else 0
    rwidth = int(resp.max()) if n else 0

    masks: list[np.ndarray] = []
    log_probs: list[np.ndarray] = []
    has_lp = np.zeros(n, dtype=bool)
    for i, s in enumerate(samples):
        r = int(resp[i])
        if s.sample.remove_sample:
            masks.append(np.zeros(r, dtype=np.float32))
        elif s.sample.loss_mask is None:
            masks.append(np.ones(r, dtype=np.float32))
        else:
            masks.append(s.sample.loss_mask.numpy())
        if s.sample.rollout_log_probs is not None:
            log_probs.append(s.sample.rollout_log_probs.numpy())
            has_lp[i] = True
        else:
            log_probs.append(np.zeros(r, dtype=np.float32))

    cols = np.arange(rwidth, dtype=np.int64)[None, :]
    in_response = cols < resp[:, None]
    response_index = np.where(in_response, (total - resp)[:, None] + cols, 0)
    return Collated(
        tokens=torch.from_numpy(_padded(tokens, total, width, pad_token_id, np.int64)),
        attention_mask=torch.from_numpy(np.arange(width)[None, :] < total[:, None]),
        total_lengths=torch.from_numpy(total),
        response_lengths=torch.from_numpy(resp),
        loss_mask=torch.from_numpy(_padded(masks, resp, rwidth, 0, np.float32)),
        rollout_log_probs=torch.from_numpy(_padded(log_probs, resp, rwidth, 0, np.float32)),
        has_rollout_log_probs=torch.from_numpy(has_lp),
        response_index=torch.from_numpy(response_index),
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
        raw_rewards=torch.tensor([s.raw_reward for s in samples], dtype=torch.float32),
    )


# ---- staleness ---------------------------------------------------------------------------------
def oldest_weight_version(group: Sequence[TrainSample]) -> int | None:
    """The oldest weight version any sample of the group was generated with; None when none carries one.

    Raises ValueError for a version that is not an integer.
    """
    oldest: int | None = None
    for s in group:
        for text in s.sample.weight_versions:
            if not _INT.fullmatch(text.strip()):
                raise ValueError(f"group {s.group_key}: weight version {text!r} is not an integer")
            v = int(text)
            oldest = v if oldest is None or v < oldest else oldest
    return oldest


def is_stale_version(oldest: int | None, current_version: int | None, max_staleness: int | None) -> bool:
    """The staleness rule on a group's oldest weight version: `oldest < current_version - max_staleness`.

    No bound, no current version, or no version on any sample: never stale.
    """
    if max_staleness is None or current_version is None or oldest is None:
        return False
    if max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    return oldest < current_version - max_staleness


def is_stale(group: Sequence[TrainSample], current_version: int | None, max_staleness: int | None) -> bool:
    """True when the group's oldest weight version is below `current_version - max_staleness` (skip it whole).

    Raises ValueError when the rule applies and a weight version is not an integer.
    """
    if max_staleness is None or current_version is None:
        return False
    return is_stale_version(oldest_weight_version(group), current_version, max_staleness)


# ---- data-parallel sharding --------------------------------------------------------------------
def rollout_units(groups: Sequence[Sequence[TrainSample]]) -> list[list[int]]:
    """Rows (indices into the concatenated groups) of each rollout, in order of first appearance.

    A rollout is (prompt group, rollout_id or else index); a sample with neither is a rollout of its own.
    """
    units: list[list[int]] = []
    row = 0
    for group in groups:
        seen: dict[tuple[type, object], int] = {}
        for s in group:
            key = declared_rollout_key(s.sample)
            if key is None:
                units.append([row])
            else:
                tagged = (type(key), key)  # rollout 1 and rollout "1" are different rollouts
                if tagged in seen:
                    units[seen[tagged]].append(row)
                else:
                    seen[tagged] = len(units)
                    units.append([row])
            row += 1
    return units


def shard_ranks(
    groups: Sequence[Sequence[TrainSample]], world_size: int, *, balance_tokens: bool = False
) -> list[int]:
    """The rank of every row of the concatenated groups.

    Default: rollout i goes to rank i mod world_size (strided, as the reference trainer splits a step).
    `balance_tokens`: longest-processing-time greedy on each rollout's token count (largest first,
    ties by order; each to the least loaded rank, ties to the lowest rank).
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    units = rollout_units(groups)
    rows = sum(len(g) for g in groups)
    ranks = [0] * rows
    if not balance_tokens:
        for i, unit in enumerate(units):
            for row in unit:
                ranks[row] = i % world_size
        return ranks
    flat = [s for g in groups for s in g]
    sizes = [sum(len(flat[r].sample.tokens or ()) for r in unit) for unit in units]
    loads = [(0, r) for r in range(world_size)]  # a heap of (tokens, rank)
    for i in sorted(range(len(units)), key=lambda i: (-sizes[i], i)):
        load, rank = heapq.heappop(loads)
        for row in units[i]:
            ranks[row] = rank
        heapq.heappush(loads, (load + sizes[i], rank))
    return ranks


def shard_groups(
    groups: Sequence[Sequence[TrainSample]], rank: int, world_size: int, *, balance_tokens: bool = False
) -> list[TrainSample]:
    """This rank's samples, in global order: no sample on two ranks, none lost, siblings on one rank."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    ranks = shard_ranks(groups, world_size, balance_tokens=balance_tokens)
    return [s for s, r in zip((s for g in groups for s in g), ranks, strict=True) if r == rank]
