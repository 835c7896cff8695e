"""The one retry loop (rollout_stream.retry): retriable failures are tried again up to the deadline or a stop,
anything else is raised at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from rollout_stream.kafka import KafkaFailure
from rollout_stream.retry import is_retriable, retrying


def failing(times: int, exc: Exception) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise exc
        return "done"

    return calls, call


def test_a_retriable_failure_is_tried_again_until_it_passes():
    calls, call = failing(2, KafkaFailure("coordinator not available", retriable=True))
    assert retrying(call, within_s=5, every_s=0.01) == "done"
    assert len(calls) == 3


def test_a_failure_that_is_not_retriable_is_raised_at_once():
    calls, call = failing(5, KafkaFailure("not authorized", retriable=False))
    with pytest.raises(KafkaFailure, match="not authorized"):
        retrying(call, within_s=5, every_s=0.01)
    assert len(calls) == 1
    calls, call = failing(5, ValueError("a bug"))
    with pytest.raises(ValueError):
        retrying(call, within_s=5, every_s=0.01)
    assert len(calls) == 1 and not is_retriable(ValueError("a bug"))


def test_the_last_failure_is_raised_past_the_deadline_or_once_stopped():
    calls, call = failing(1000, KafkaFailure("still electing", retriable=True))
    with pytest.raises(KafkaFailure):
        retrying(call, within_s=0.05, every_s=0.01)
    assert 2 <= len(calls) < 1000
    stop = threading.Event()
    stop.set()
    calls, call = failing(1000, KafkaFailure("still electing", retriable=True))
    with pytest.raises(KafkaFailure):
        retrying(call, within_s=60, stop=stop)
    assert len(calls) == 1
