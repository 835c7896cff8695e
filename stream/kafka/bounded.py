"""A blocking client call with a deadline: both clients' transactional calls can wait forever for a
coordinator that went away (kafka-python 3.0 after a broker SIGKILL, librdkafka#5456/#5511)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rollout_stream.errors import RuntimeFailure

__all__ = ["Hung", "call_within"]


class Hung(RuntimeFailure, TimeoutError):
    """The call did not return in time; it goes on in an abandoned daemon thread."""


def call_within(seconds: float, call: Callable[[], object], name: str) -> None:
    """Run `call` in a daemon thread; raise what it raised, or Hung when it has not returned in `seconds`.

    Ctrl-C while waiting lets the call finish within its deadline first, then re-raises: a transaction
    must not be aborted while its commit is still in flight (librdkafka answers INVALID_TXN_STATE)."""
    outcome: list[BaseException | None] = []
    done = threading.Event()  # not Thread.join: an interrupted join marks the thread stopped (bpo-45274)

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # handed to the calling thread
            outcome.append(exc)
        finally:
            done.set()

    deadline = time.monotonic() + seconds
    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        done.wait(seconds)
    except KeyboardInterrupt:
        _finish(done, deadline)
        raise
    if not outcome:
        raise Hung(name)
    if outcome[0] is not None:
        raise outcome[0]


def _finish(done: threading.Event, deadline: float) -> None:
    """Wait for an interrupted call until its deadline; a second Ctrl-C stops waiting."""
    try:
        done.wait(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        pass
