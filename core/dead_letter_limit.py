"""The dead-letter limit: stop when most of the recent input is refused (after arroyo's `DlqLimit`).

A bad producer deploy, a wrong `--reward-key` or a wrong `--group-size` makes every record (or half of them,
or more) a dead-letter. Without a limit the worker keeps going and drains the input topic into the
dead-letter topic: nothing is lost (`dlq replay` puts it back), but trainers starve and someone has to replay
the whole backlog. With it the worker stops, loudly, once the dead-lettered share of the last `window`
resolved input records exceeds `max_ratio`.

Only resolved records count: each published sample (including a zero-variance group dropped by policy) is
one good record, each dead-lettered record one bad one. Identical duplicates are neither. Records still held
in open windows have no outcome yet. The window is a count of records, not a span of time, so a quiet input
is judged on as much evidence as a busy one, and the decision needs no clock.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

__all__ = ["DeadLetterLimit", "DeadLetterWindow", "LimitExceeded", "MAX_WINDOW"]

MAX_WINDOW = 1_000_000
"""Largest window: its runs of outcomes are kept in memory (at worst one per record)."""


@dataclass(frozen=True, slots=True)
class DeadLetterLimit:
    """Stop once more than `max_ratio` of the last `window` resolved records were dead-lettered.

    max_ratio: 0 stops at the first dead-letter in a full window; 1 never stops (nothing exceeds all).
    window: records resolved before the first decision, and the span each decision looks back over.
    """

    max_ratio: float = 0.4
    window: int = 10_000

    def __post_init__(self) -> None:
        if not 0.0 <= self.max_ratio <= 1.0:
            raise ValueError(f"max_ratio must be between 0 and 1, got {self.max_ratio}")
        if not 1 <= self.window <= MAX_WINDOW:
            raise ValueError(f"window must be between 1 and {MAX_WINDOW}, got {self.window}")

    @property
    def enabled(self) -> bool:
        return self.max_ratio < 1.0


@dataclass(frozen=True, slots=True)
class LimitExceeded:
    """The evidence for stopping: the window's dead-letters, by reason."""

    dead_lettered: int
    resolved: int
    limit: DeadLetterLimit
    by_reason: tuple[tuple[str, int], ...]  # most frequent first

    @property
    def ratio(self) -> float:
        return self.dead_lettered / self.resolved

    def describe(self) -> str:
        reasons = ", ".join(f"{reason} {n}" for reason, n in self.by_reason)
        return (f"{self.dead_lettered} of the last {self.resolved} resolved input records were dead-lettered "
                f"({self.ratio:.1%}: {reasons}), more than the limit of {self.limit.max_ratio * 100:g}%")


@dataclass(slots=True)
class _Run:
    reason: str | None  # None: published
    count: int


class DeadLetterWindow:
    """The outcomes of the last `limit.window` resolved records, as runs of one outcome, oldest first."""

    def __init__(self, limit: DeadLetterLimit) -> None:
        self.limit = limit
        self._runs: deque[_Run] = deque()
        self.resolved = 0  # records in the window (at most limit.window)
        self.dead_lettered = 0
        self._by_reason: Counter[str] = Counter()

    @property
    def ratio(self) -> float:
        """Dead-lettered share of the window so far (0.0 while empty)."""
        return self.dead_lettered / self.resolved if self.resolved else 0.0

    def published(self, records: int) -> LimitExceeded | None:
        if not self.dead_lettered and records > 0:
            # Nothing refused in the window (the common case, once per published group): its runs are at most
            # one run of published records, and no verdict can stop the worker.
            self.resolved = min(self.resolved + records, self.limit.window)
            if self._runs:
                self._runs[0].count = self.resolved
            else:
                self._runs.append(_Run(None, self.resolved))
            return None
        return self._add(None, records)

    def dead_lettered_as(self, reason: str, records: int) -> LimitExceeded | None:
        return self._add(reason, records)

    def _add(self, reason: str | None, records: int) -> LimitExceeded | None:
        if records <= 0:
            return None
        if self._runs and self._runs[-1].reason == reason:
            self._runs[-1].count += records
        else:
            self._runs.append(_Run(reason, records))
        self.resolved += records
        if reason is not None:
            self.dead_lettered += records
            self._by_reason[reason] += records
        self._trim()
        return self._verdict()

    def _trim(self) -> None:
        excess = self.resolved - self.limit.window
        while excess > 0:
            oldest = self._runs[0]
            dropped = min(oldest.count, excess)
            oldest.count -= dropped
            if not oldest.count:
                self._runs.popleft()
            self.resolved -= dropped
            excess -= dropped
            if oldest.reason is not None:
                self.dead_lettered -= dropped
                self._by_reason[oldest.reason] -= dropped
                if not self._by_reason[oldest.reason]:
                    del self._by_reason[oldest.reason]

    def _verdict(self) -> LimitExceeded | None:
        limit = self.limit
        if self.resolved < limit.window or not self.dead_lettered > limit.max_ratio * self.resolved:
            return None
        by_reason = tuple(sorted(self._by_reason.items(), key=lambda item: (-item[1], item[0])))
        return LimitExceeded(self.dead_lettered, self.resolved, limit, by_reason)
