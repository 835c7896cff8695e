"""One retry loop: a call tried again while it fails with a retriable error, up to a deadline.

A fresh cluster answers some requests with retriable errors for a few seconds (its offsets topic still being
made, a group coordinator still being elected): a caller that asks once at start waits that out here instead
of failing. Retriable means what the error says of itself (`retriable`, as `rollout_stream.kafka.KafkaFailure`
carries it); every other error is raised at once. Imports nothing of the project but its error tree, so the
seam and everything above it can use it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from rollout_stream.errors import RolloutStreamError

__all__ = ["RETRY_EVERY_S", "is_retriable", "retrying"]

T = TypeVar("T")

RETRY_EVERY_S = 0.5


def is_retriable(exc: BaseException) -> bool:
    """True for a project error that says trying again may help."""
    return isinstance(exc, RolloutStreamError) and getattr(exc, "retriable", False) is True


def retrying(call: Callable[[], T], *, within_s: float, every_s: float = RETRY_EVERY_S,
             stop: threading.Event | None = None) -> T:
    """What `call()` returns, tried again every `every_s` while it raises a retriable error, for `within_s` in
    all or until `stop` is set; then, or on any other error, the error is raised."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return call()
        except RolloutStreamError as exc:
            if not is_retriable(exc) or time.monotonic() > deadline or (stop is not None and stop.is_set()):
                raise
        if stop is not None:
            stop.wait(every_s)
        else:
            time.sleep(every_s)
