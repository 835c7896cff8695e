"""What the worker counts, and the snapshot of it the loop publishes for other threads (metrics)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["LoopObserver", "OutcomeCounts", "Snapshot", "WorkerStats"]


class LoopObserver(Protocol):
    """What the loop reports timings to (rollout_stream.worker.metrics.LoopMetrics while an endpoint serves
    it)."""

    def observe_batch(self, seconds: float) -> None: ...

    def observe_commit(self, seconds: float, published_ts_ms: Iterable[int], now_ms: int) -> None: ...


@dataclass
class OutcomeCounts:
    """Outcomes routed since the last commit: counted in WorkerStats when it commits, forgotten when it aborts
    (the records are read and routed again after the restore)."""

    samples_published: int = 0
    groups_published: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)
    dead_letter_groups: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    zero_variance_groups: int = 0
    zero_variance_dropped: int = 0

    def clear(self) -> None:
        self.samples_published = self.groups_published = self.duplicates = 0
        self.zero_variance_groups = self.zero_variance_dropped = 0
        self.dead_lettered.clear()
        self.dead_letter_groups.clear()


@dataclass
class WorkerStats:
    records_in: int = 0
    samples_published: int = 0
    groups_published: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)  # records by reason
    dead_letter_groups: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    zero_variance_groups: int = 0
    zero_variance_dropped: int = 0
    commits: int = 0
    aborts: int = 0
    restores: int = 0
    restored_records: int = 0
    paused: bool = False

    def count(self, committed: OutcomeCounts) -> None:
        self.samples_published += committed.samples_published
        self.groups_published += committed.groups_published
        self.dead_lettered.update(committed.dead_lettered)
        self.dead_letter_groups.update(committed.dead_letter_groups)
        self.duplicates += committed.duplicates
        self.zero_variance_groups += committed.zero_variance_groups
        self.zero_variance_dropped += committed.zero_variance_dropped
        committed.clear()

    def summary(self) -> dict[str, Any]:
        return {
            "records_in": self.records_in,
            "groups_published": self.groups_published,
            "samples_published": self.samples_published,
            "dead_lettered": sum(self.dead_lettered.values()),
            "dead_lettered_by_reason": dict(sorted(self.dead_lettered.items())),
            "duplicates": self.duplicates,
            "zero_variance_groups": self.zero_variance_groups,
            "zero_variance_dropped": self.zero_variance_dropped,
            "commits": self.commits,
            "aborts": self.aborts,
        }


@dataclass(frozen=True)
class Snapshot:
    """The loop's state as of its last tick, published whole (one reference swap), read by the metrics
    endpoint from its own thread without touching the loop's structures."""

    stats: WorkerStats
    open_windows: int = 0
    open_bytes: int = 0
    closed_groups: int = 0
    ready: bool = False
    lag: dict[int, int] = field(default_factory=dict)
    dead_letter_ratio: float = 0.0
    last_tick: float = 0.0
    open_chunked_values: int = 0  # values whose chunks are still arriving (their bytes are in open_bytes)
