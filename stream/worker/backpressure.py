"""Bounded memory: pause fetching at the open-group or open-byte cap, resume below 80 % of it.

Open windows complete only with records behind the pause, though: if none closed within `stall_s`, read on
past the cap (logged) until below it, rather than let complete groups time out as incomplete. Groups are
bounded by the byte cap per group (group_too_large)."""

from __future__ import annotations

import logging

from rollout_stream.kafka import GroupConsumer, TopicPartition
from rollout_stream.logs import log_event

__all__ = ["BackPressure", "PAUSE_STALL_S"]

log = logging.getLogger("rollout_stream.worker")

PAUSE_STALL_S = 1.0
"""A pause at the cap during which no window closed ends in an overrun."""


class BackPressure:
    def __init__(self, consumer: GroupConsumer, topic: str, *, max_groups: int, max_bytes: int,
                 stall_s: float = PAUSE_STALL_S) -> None:
        self.consumer, self.topic = consumer, topic
        self.max_groups, self.max_bytes, self.stall_s = max_groups, max_bytes, stall_s
        self.paused = False
        self.overrun = False  # reading past the cap: open windows needed records behind a pause
        self._paused_at = 0.0

    def check(self, now: float, open_groups: int, open_bytes: int, assigned: set[int]) -> None:
        full = open_groups >= self.max_groups or open_bytes >= self.max_bytes
        low = open_groups < 0.8 * self.max_groups and open_bytes < 0.8 * self.max_bytes
        if self.overrun:
            if low:
                self.overrun = False
                log_event(log, "backpressure.overrun_ended", open_windows=open_groups, open_bytes=open_bytes)
            return
        tps = [TopicPartition(self.topic, p) for p in assigned]
        if full and not self.paused:
            self.consumer.pause(tps)
            self.paused, self._paused_at = True, now
            log_event(
                log, "backpressure.paused", logging.WARNING, open_windows=open_groups, open_bytes=open_bytes
            )
        elif self.paused and low:
            self.consumer.resume(tps)
            self.paused = False
            log_event(log, "backpressure.resumed", open_windows=open_groups, open_bytes=open_bytes)
        elif self.paused and now - self._paused_at >= self.stall_s:
            self.consumer.resume(tps)
            self.paused, self.overrun = False, True
            log_event(
                log,
                "backpressure.overrun",
                logging.WARNING,
                open_windows=open_groups,
                open_bytes=open_bytes,
                paused_s=f"{now - self._paused_at:.1f}",
                why="no open group closed while paused: their members are behind the pause; "
                "reading on past the cap until below it",
            )
