"""call_within: the deadline both clients' transactional calls run under."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from rollout_stream.errors import RuntimeFailure
from rollout_stream.kafka.bounded import Hung, call_within


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


def test_ctrl_c_lets_the_call_in_flight_finish_then_is_raised():
    finished = threading.Event()

    def commit() -> None:
        time.sleep(0.4)
        finished.set()

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    try:
        with pytest.raises(KeyboardInterrupt):
            call_within(5, commit, "commit")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert finished.is_set()  # an abort after this cannot race the commit


def test_hung_is_a_runtime_failure_and_a_timeout():
    assert issubclass(Hung, RuntimeFailure) and issubclass(Hung, TimeoutError) and Hung.exit_code == 1
