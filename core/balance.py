"""Sequence-length balanced partitions: equal-size largest differencing (Karmarkar–Karp).

Reproduces miles' `get_seqlen_balanced_partitions(lengths, k, equal_size=True)`
(`miles/utils/seqlen_balancing.py`, itself from verl) partition for partition, so a trainer rank gets the
rows it would get in-process. That means the same tie-breaking, which is why the orderings below are
spelled out: a partial solution's bins are ordered by (total, item count, items), and the partial
solution with the largest spread is merged first, ties going to the one whose largest bin is largest.
Every two partial solutions differ in those keys (each holds distinct rows), so the merge order, and the
result, does not depend on the heap implementation.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["balanced_partitions"]

Item = tuple[int, int]  # (row, length)


@dataclass(slots=True)
class _Bin:
    total: int = 0
    items: list[Item] = field(default_factory=list)

    def key(self) -> tuple[int, int, list[Item]]:
        return (self.total, len(self.items), self.items)


def _sorted_bins(bins: list[_Bin]) -> list[_Bin]:
    # Largest first. Equal keys only happen for empty bins, which are interchangeable.
    return sorted(bins, key=_Bin.key, reverse=True)


def _priority(bins: list[_Bin]) -> tuple[int, int, int, tuple[Item, ...]]:
    """Heap key (smallest pops first): largest spread first, then the largest first bin.

    Negating the first bin's key reverses its order: item lists are only compared at equal lengths,
    where element-wise negation reverses a lexicographic comparison.
    """
    first = bins[0]
    spread = first.total - bins[-1].total
    return (-spread, -first.total, -len(first.items), tuple((-row, -length) for row, length in first.items))


def _merge(larger: list[_Bin], smaller: list[_Bin]) -> list[_Bin]:
    # Pair the largest bin of one with the smallest of the other: that is what shrinks the spread.
    merged = [
        _Bin(big.total + small.total, big.items + small.items)
        for big, small in zip(larger, reversed(smaller), strict=True)
    ]
    return _sorted_bins(merged)


def balanced_partitions(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Rows of `lengths` in `k` partitions of equal size with balanced length sums; each sorted ascending.

    Raises ValueError unless 1 <= k <= len(lengths) and k divides len(lengths).
    """
    count = len(lengths)
    if k < 1 or count < k or count % k:
        raise ValueError(f"cannot split {count} rows into {k} balanced partitions of equal size")
    ordered = sorted((length, row) for row, length in enumerate(lengths))
    heap: list[tuple[tuple[int, int, int, tuple[Item, ...]], int, list[_Bin]]] = []
    serial = 0  # never compared in practice (priorities differ); keeps the heap from comparing bins
    for start in range(0, count, k):
        # Each chunk of k consecutive lengths (ascending) starts as k one-row bins.
        bins = _sorted_bins([_Bin(length, [(row, length)]) for length, row in ordered[start : start + k]])
        heapq.heappush(heap, (_priority(bins), serial, bins))
        serial += 1
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        bins = _merge(first, second)
        heapq.heappush(heap, (_priority(bins), serial, bins))
        serial += 1
    return [sorted(row for row, _ in b.items) for b in heap[0][2]]
