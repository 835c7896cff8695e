"""Rebuild a partition's window state after assignment (exactly-once): closed-group memory from the
changelog, open windows by re-reading the input from the committed offset up to the changelog's position
with outputs suppressed (they are committed already); then continue where the changelog ends."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from codec import DeadLetterReason, decode_changelog, parse_changelog_key
from codec.changelog import POSITION_KEY, ClosedGroupEntry, PartitionPosition
from core.offsets import OffsetLedger
from core.records import Outcome
from core.windows import ClosedGroup, WindowKey, WindowStore, distinct
from stream.errors import RuntimeFailure
from stream.kafka import AssignedConsumer, Client, GroupConsumer, Record, TopicPartition

__all__ = ["Restored", "Restorer", "RestoreStalled", "read_changelog"]


class RestoreStalled(RuntimeFailure, RuntimeError):
    """A restore read made no progress for too long (broker unavailable?)."""


@dataclass(frozen=True, slots=True)
class Restored:
    partition: int
    closed_groups: int
    changelog_records: int
    committed_offset: int
    resume_at: int
    reread: int
    seconds: float


def _records(consumer: AssignedConsumer, tp: TopicPartition, start: int, end: int, stall_s: float
             ) -> Iterator[Record]:
    """Records of one partition from `start` (inclusive) to `end` (exclusive), read_committed."""
    consumer.assign([tp])
    consumer.seek(tp, start)
    last_progress = time.monotonic()
    while consumer.position(tp) < end:
        got = consumer.poll(0.2).get(tp, [])
        if got:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > stall_s:
            raise RestoreStalled(f"no progress reading {tp.topic}[{tp.partition}] at {consumer.position(tp)} "
                                 f"of {end} for {stall_s:.0f}s")
        for rec in got:
            if rec.offset >= end:
                return
            yield rec


def read_changelog(consumer: AssignedConsumer, topic: str, partition: int, *, stall_s: float = 60.0
                   ) -> tuple[dict[WindowKey, ClosedGroup], int | None, int]:
    """Closed groups and the committed read position of one input partition, from its changelog."""
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
            assert rec.value is not None  # a position record is never a tombstone
            entry = decode_changelog(rec.value)
            assert isinstance(entry, PartitionPosition)
            position = entry.next_offset
            continue
        assert rec.key is not None
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
            entry.message, entry.deadline_ms, entry.closed_at_ms, distinct(entry.digests),
            entry.digest_algorithm)
    return closed, position, count


class Restorer:
    """Restores one partition at a time into the worker's store and ledger."""

    def __init__(self, client: Client, consumer: GroupConsumer, *, input_topic: str, changelog_topic: str,
                 store: WindowStore, ledger: OffsetLedger, max_record_bytes: int,
                 accept: Callable[[Record, int], list[Outcome]], clock: Callable[[], float]) -> None:
        self.client, self.consumer = client, consumer
        self.input_topic, self.changelog_topic = input_topic, changelog_topic
        self.store, self.ledger, self.max_record_bytes = store, ledger, max_record_bytes
        self.accept, self.clock = accept, clock

    def _reader(self) -> AssignedConsumer:
        return self.client.assigned_consumer(client_id="rollout-stream-restore",
                                             max_record_bytes=self.max_record_bytes)

    def restore(self, p: int) -> Restored:
        started = time.monotonic()
        self.store.drop_partition(p)
        self.ledger.forget(p)
        reader = self._reader()
        try:
            closed, position, changelog_records = read_changelog(reader, self.changelog_topic, p)
            for wkey, entry in closed.items():
                self.store.restore_closed(wkey, entry)
            tp = TopicPartition(self.input_topic, p)
            committed = self.consumer.committed(tp)
            start = committed.offset if committed is not None else self.consumer.beginning_offsets([tp])[tp]
            reread = 0
            if position is not None and position > start:
                now_ms = int(self.clock() * 1000)
                for rec in _records(reader, tp, start, position, 60.0):
                    # Same transitions as the first time, outputs suppressed: they are already committed.
                    self.ledger.hold(p, rec.offset)
                    for outcome in self.accept(rec, now_ms):
                        self.ledger.resolve(p, [r.offset for r in outcome.records])
                    reread += 1
                self.store.discard_changes(p)  # re-created by the re-read: the changelog holds them
        finally:
            reader.close()
        resume_at = max(start, position or start)
        self.ledger.mark_committed({p: start})
        self.consumer.seek(tp, resume_at)
        return Restored(
            p, len(closed), changelog_records, start, resume_at, reread, time.monotonic() - started
        )
