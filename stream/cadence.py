"""When a consume-process-produce loop commits, and how long its poll may wait meanwhile."""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["CommitCadence", "POLL_MS"]

POLL_MS = 100
"""The longest a poll waits for records."""


@dataclass
class CommitCadence:
    """Commit every `interval_s`, or sooner once `max_records` records wait; the worker and the benchmark's
    passthrough share it, so their latencies differ by their work only."""

    interval_s: float
    max_records: int
    last: float = 0.0  # monotonic time of the last commit
    uncommitted: int = 0  # records read since then

    def due(self, now: float) -> bool:
        return now - self.last >= self.interval_s or self.uncommitted >= self.max_records

    def committed(self, now: float) -> None:
        self.last, self.uncommitted = now, 0

    def soon(self) -> None:
        """Commit at the loop's next turn, whatever the interval says."""
        self.last = -math.inf

    def poll_timeout_ms(self, now: float) -> int:
        """With records waiting for a commit, wait for more only until that commit is due: on a quiet input a
        finished group would otherwise wait a whole poll on top of the interval."""
        if self.due(now):
            return 0
        if not self.uncommitted:
            return POLL_MS
        return min(POLL_MS, math.ceil((self.last + self.interval_s - now) * 1000))
