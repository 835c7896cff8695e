"""A guard against kafka-python 3.0.12 dropping a group join that completes while `poll()` times out: the
broker then shows the member owning partitions it never receives. Rejoin when nothing is assigned for long."""

from __future__ import annotations

from typing import Any

__all__ = ["RejoinWatchdog"]


class RejoinWatchdog:
    """Call `check(now)` once per poll; it resubscribes after `after_s` without partitions and says so."""

    def __init__(self, consumer: Any, topic: str, after_s: float, listener: Any = None) -> None:
        self.consumer, self.topic, self.after_s, self.listener = consumer, topic, after_s, listener
        self.unassigned_since: float | None = None

    def check(self, now: float, assigned: bool = False) -> float | None:
        """Seconds without partitions when it rejoined just now, else None (`assigned`: the caller knows)."""
        if assigned or self.consumer.assignment():
            self.unassigned_since = None
            return None
        if self.unassigned_since is None:
            self.unassigned_since = now
            return None
        waited = now - self.unassigned_since
        if waited < self.after_s:
            return None
        self.consumer.unsubscribe()
        if self.listener is not None:
            self.consumer.subscribe([self.topic], listener=self.listener)
        else:
            self.consumer.subscribe([self.topic])
        self.unassigned_since = now
        return waited
