"""Rebuild a partition's window state after assignment: closed-group memory from the changelog, open
windows by re-reading the input from the committed offset up to the changelog's position."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from kafka import TopicPartition

from codec import DeadLetterReason, decode_changelog, parse_changelog_key
from codec.changelog import POSITION_KEY, ClosedGroupEntry, PartitionPosition
from core.windows import ClosedGroup, WindowKey
from stream.clients import Connection, make_consumer

__all__ = ["RestoreStalled", "read_changelog", "read_range"]


class RestoreStalled(RuntimeError):
    """A restore read made no progress for too long (broker unavailable?)."""


def _records(consumer: Any, tp: TopicPartition, start: int, end: int, stall_s: float) -> Iterator[Any]:
    """Records of one partition from `start` (inclusive) to `end` (exclusive), read_committed."""
    consumer.assign([tp])
    consumer.seek(tp, start)
    last_progress = time.monotonic()
    while consumer.position(tp) < end:
        batch = consumer.poll(timeout_ms=200)
        got = batch.get(tp, [])
        if got:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > stall_s:
            raise RestoreStalled(f"no progress reading {tp.topic}[{tp.partition}] at {consumer.position(tp)} "
                                 f"of {end} for {stall_s:.0f}s")
        for rec in got:
            if rec.offset >= end:
                return
            yield rec


def read_changelog(conn: Connection, topic: str, partition: int, *, stall_s: float = 60.0
                   ) -> tuple[dict[WindowKey, ClosedGroup], int | None, int]:
    """Closed groups and the committed read position of one input partition, from its changelog."""
    consumer = make_consumer(conn, group_id=None)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = consumer.end_offsets([tp])[tp]
        begin = consumer.beginning_offsets([tp])[tp]
        closed: dict[WindowKey, ClosedGroup] = {}
        position: int | None = None
        count = 0
        for rec in _records(consumer, tp, begin, end, stall_s):
            count += 1
            if rec.key == POSITION_KEY:
                entry = decode_changelog(rec.value)
                assert isinstance(entry, PartitionPosition)
                position = entry.next_offset
                continue
            gkey, rid = parse_changelog_key(rec.key)
            wkey = (partition, gkey, rid)
            if rec.value is None:
                closed.pop(wkey, None)
                continue
            entry = decode_changelog(rec.value)
            assert isinstance(entry, ClosedGroupEntry)
            closed.pop(wkey, None)  # keep closing order
            closed[wkey] = ClosedGroup(
                DeadLetterReason(entry.reason) if entry.reason is not None else None,
                entry.message, entry.deadline_ms, entry.closed_at_ms, frozenset(entry.digests),
                entry.digest_algorithm)
        return closed, position, count
    finally:
        consumer.close()


def read_range(conn: Connection, topic: str, partition: int, start: int, end: int,
               handle: Callable[[Any], None], *, max_record_bytes: int, stall_s: float = 60.0) -> int:
    """Feed every input record in [start, end) to `handle`; returns how many were read."""
    consumer = make_consumer(conn, group_id=None, max_record_bytes=max_record_bytes)
    try:
        n = 0
        for rec in _records(consumer, TopicPartition(topic, partition), start, end, stall_s):
            handle(rec)
            n += 1
        return n
    finally:
        consumer.close()


def closed_entry(closed: ClosedGroup) -> ClosedGroupEntry:
    return ClosedGroupEntry(
        reason=closed.reason.value if closed.reason is not None else None, message=closed.message,
        deadline_ms=closed.deadline_ms, closed_at_ms=closed.closed_at_ms, digests=sorted(closed.digests),
        digest_algorithm=closed.digest_algorithm)
