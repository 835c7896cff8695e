"""A blocking client call with a deadline: both clients' transactional calls can wait forever for a
coordinator that went away (kafka-python 3.0 after a broker SIGKILL, librdkafka#5456/#5511)."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Hung", "call_within"]


class Hung(Exception):
    """The call did not return in time; it goes on in an abandoned daemon thread."""


def call_within(seconds: float, call: Callable[[], object], name: str) -> None:
    """Run `call` in a daemon thread; raise what it raised, or Hung when it has not returned in `seconds`."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # handed to the calling thread
            outcome.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join(seconds)
    if not outcome:
        raise Hung(name)
    if outcome[0] is not None:
        raise outcome[0]
