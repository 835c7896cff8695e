"""What a kafka-python consumer knows of its partitions, read from its subscription state: no network call,
safe from any thread. The one place that reads (and, for one bug, mends) that private state; kafka-python
has no public accessor for a position that is not blocking."""

from __future__ import annotations

from typing import Any

from kafka import TopicPartition

__all__ = ["fetch_position", "backlog", "unpark_resumed"]


def fetch_position(consumer: Any, tp: TopicPartition) -> int:
    """The consumer's fetch position in `tp` (which, unlike the last record's offset + 1, also moves past
    transaction markers); -1 when unknown."""
    state = consumer._subscription.assignment.get(tp)
    position = getattr(state, "position", None) if state is not None else None
    return getattr(position, "offset", -1) if position is not None else -1


def backlog(consumer: Any) -> int:
    """Records the consumer knows of and has not returned yet: over its unpaused partitions, last known high
    watermark − fetch position."""
    behind = 0
    for state in list(consumer._subscription.assignment.values()):
        if state.paused or state.position is None or state.highwater is None:
            continue
        behind += max(0, state.highwater - state.position.offset)
    return behind


def unpark_resumed(consumer: Any) -> None:
    """Let records parked while their partition was paused come back after `resume()`.

    kafka-python 3.0 parks a paused partition's fetched records and hands them back only while its in-line
    slot is empty (`is None`); a drained slot keeps its spent object, so parked records of a resumed
    partition were never returned, and the partition, counted as holding data, was never fetched again (a
    reader stalled for good in the middle of a backlog). Call before every poll of a consumer that pauses.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    current = getattr(fetcher, "_next_partition_records", None)
    if current is not None and not current:  # spent: nothing left to return from it
        fetcher._next_partition_records = None
