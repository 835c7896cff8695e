"""The wait for a topic's partitions (rollout_stream.kafka.topic_wait), shared by the worker and reader."""

from __future__ import annotations

import logging
import threading

import pytest

import rollout_stream.kafka.topic_wait as topic_wait
from rollout_stream.kafka.topic_wait import wait_for_partitions

log = logging.getLogger("test.topic_wait")


def test_partitions_known_at_once_are_returned_sorted(monkeypatch):
    monkeypatch.setattr(topic_wait, "WAIT_STEP_S", 0.01)
    looks = iter([None, set(), {2, 0, 1}])
    assert wait_for_partitions(lambda t: next(looks), "t", threading.Event(), log) == [0, 1, 2]


def test_the_wait_logs_gives_up_when_told_and_ends_on_stop(monkeypatch, caplog):
    monkeypatch.setattr(topic_wait, "WAIT_STEP_S", 0.01)
    caplog.set_level(logging.WARNING, logger="test.topic_wait")
    waited: list[float] = []

    def give_up(s: float) -> None:
        waited.append(s)
        if len(waited) == 3:
            raise LookupError("no such topic")

    with pytest.raises(LookupError):
        wait_for_partitions(lambda t: None, "t", threading.Event(), log, give_up=give_up, hint="create it")
    assert waited == [0.0, 0.01, 0.02]
    lines = [r for r in caplog.records if getattr(r, "event", None) == "topic.waiting"]
    assert lines and lines[0].fields == {"topic": "t", "hint": "create it"}  # type: ignore[attr-defined]
    stop = threading.Event()
    stop.set()
    assert wait_for_partitions(lambda t: None, "t", stop, log) == []
