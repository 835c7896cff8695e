"""call_within: the deadline both clients' transactional calls run under."""

from __future__ import annotations

import threading
import time

import pytest

from stream.kafka.bounded import Hung, call_within


def test_a_call_that_returns_in_time_returns():
    seen = []
    call_within(5, lambda: seen.append(1), "quick")
    assert seen == [1]


def test_what_the_call_raised_is_raised_in_the_caller():
    def fail() -> None:
        raise ValueError("from the call")

    with pytest.raises(ValueError, match="from the call"):
        call_within(5, fail, "failing")


def test_a_call_that_hangs_is_abandoned_after_the_deadline():
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(Hung):
        call_within(0.2, release.wait, "wedged")
    assert 0.2 <= time.monotonic() - started < 2
    release.set()
