"""When a consume-process-produce loop commits, and how long its poll may wait meanwhile."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["CommitCadence", "POLL_MS", "POLL_RECORDS", "CAUGHT_UP_FRACTION", "caught_up"]

POLL_MS = 100
"""The longest a poll waits for records."""

POLL_RECORDS = 500
"""The most records one poll returns."""

CAUGHT_UP_FRACTION = 0.25
"""Caught up with its input, a loop with outputs waiting commits once this much of the interval has passed."""


@dataclass
class CommitCadence:
    """Commit every `interval_s`, or once `max_records` records wait; and, caught up with the input, as soon
    as a quarter of the interval has passed with outputs waiting. Under a backlog commits stay one interval
    apart (each one is a few round trips that the loop waits for); with time to spare, a finished group does
    not wait for the rest of an interval. The worker and the benchmark's passthrough share it."""

    interval_s: float
    max_records: int
    last: float = 0.0  # monotonic time of the last commit
    uncommitted: int = 0  # records read since then
    outputs: int = 0  # records written since then
    behind: bool = False  # the last look found more input than a poll's worth: the interval rules

    @property
    def early_s(self) -> float:
        return self.interval_s * CAUGHT_UP_FRACTION

    def due(self, now: float, *, caught_up: bool) -> bool:
        self.behind = not caught_up
        since = now - self.last
        if since >= self.interval_s or self.uncommitted >= self.max_records:
            return True
        return caught_up and self.outputs > 0 and since >= self.early_s

    def committed(self, now: float) -> None:
        self.last, self.uncommitted, self.outputs = now, 0, 0

    def finished(self, now: float) -> None:
        """The commit begun at `committed` returned: the next one counts from here. Counted from its start, a
        slow commit made the next one due at once: the loop spent its time committing, with no room left to
        catch up after a stalled commit, and the latency's tail grew (docs/benchmarks-archive.md)."""
        self.last = now

    def soon(self) -> None:
        """Commit at the loop's next turn, whatever the interval says."""
        self.last = -math.inf

    def poll_timeout_ms(self, now: float) -> int:
        """Wait for records only until the next commit would be due if none came: on a quiet input a finished
        group would otherwise wait a whole poll on top of its commit's time. Behind its input, the early
        commit is not due however long the fetch takes, so the poll waits for records or the interval: polls
        of 0 ms spun the loop through empty polls on the CPU the fetch needed."""
        if self.outputs and not self.behind:
            wait_s = self.last + self.early_s - now
        elif self.outputs or self.uncommitted:
            wait_s = self.last + self.interval_s - now
        else:
            return POLL_MS
        return 0 if wait_s <= 0 else min(POLL_MS, math.ceil(wait_s * 1000))


def caught_up(consumer: Any, returned: int) -> bool:
    """The last poll returned less than it may and less than a poll's worth is left (`consumer.backlog()`,
    rollout_stream.kafka.seam). A poll's count alone is not enough: 32K-token records come a few per fetch
    even from a long backlog."""
    return returned < POLL_RECORDS and consumer.backlog() < POLL_RECORDS
