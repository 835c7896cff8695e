"""The wait for a topic's partitions, before a consumer subscribes to or assigns them.

A topic created a moment before (by the stage, by `rollout-stream topics create`) reaches a client's metadata
within seconds; until then the client knows no partitions, and a subscription made then can come up empty.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from rollout_stream.logs import log_event

__all__ = ["LOG_EVERY_S", "WAIT_STEP_S", "wait_for_partitions"]

WAIT_STEP_S = 0.5  # between two looks at the client's metadata
LOG_EVERY_S = 10.0  # between two `topic.waiting` lines (the first at once)


def wait_for_partitions(partitions_for_topic: Callable[[str], set[int] | None], topic: str,
                        stop: threading.Event, log: logging.Logger, *,
                        give_up: Callable[[float], None] | None = None, **log_fields: object) -> list[int]:
    """The topic's partitions, sorted, once the client knows any; [] if `stop` is set first.

    `partitions_for_topic`: the consumer's lookup. While none are known, `give_up(waited_s)` is called
    (it raises to end the wait, e.g. once the cluster says there is no such topic) and `topic.waiting` is
    logged on `log` every LOG_EVERY_S, with `log_fields`.
    """
    waited = 0.0
    while not stop.is_set():
        parts = partitions_for_topic(topic)
        if parts:
            return sorted(parts)
        if give_up is not None:
            give_up(waited)
        if waited % LOG_EVERY_S == 0:
            log_event(log, "topic.waiting", logging.WARNING, topic=topic, **log_fields)
        stop.wait(WAIT_STEP_S)
        waited += WAIT_STEP_S
    return []
