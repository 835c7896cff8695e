"""One helper for the loop's periodic work, instead of a hand-made timer per task."""

from __future__ import annotations

__all__ = ["Every"]


class Every:
    """`due(now)` is true once every `interval_s` of monotonic time (and then waits for the next interval)."""

    __slots__ = ("interval_s", "last")

    def __init__(self, interval_s: float, *, start: float = 0.0) -> None:
        self.interval_s, self.last = interval_s, start

    def due(self, now: float) -> bool:
        if now - self.last < self.interval_s:
            return False
        self.last = now
        return True
