"""Rebuild a partition's window state after assignment (exactly-once): closed-group memory from the
changelog, open windows by re-reading the input from the committed offset up to the changelog's position
with outputs suppressed (they are committed already); then continue where the changelog ends. The state
restored is the processor's, lent for the restore: its window store and its offset ledger."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rollout_stream.codec import DeadLetterReason, decode_changelog, parse_changelog_key
from rollout_stream.codec.changelog import POSITION_KEY, ClosedGroupEntry, PartitionPosition
from rollout_stream.core.offsets import OffsetLedger
from rollout_stream.core.windows import ClosedGroup, WindowKey, WindowStore, distinct, input_record
from rollout_stream.errors import RuntimeFailure
from rollout_stream.kafka import AssignedConsumer, Client, GroupConsumer, KafkaFailure, Record, TopicPartition
from rollout_stream.logs import log_event

__all__ = ["RESTORE_RETRY_S", "Restored", "Restorer", "RestoreStalled", "read_changelog"]

log = logging.getLogger("rollout_stream.worker")

RESTORE_RETRY_S = 0.5
"""After a retriable failure, how long a partition's restore waits before it is tried again."""


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
            entry.digest_algorithm, entry.first_offset)
    return closed, position, count


class Restorer:
    """Restores one partition at a time into a window store and an offset ledger."""

    def __init__(self, client: Client, consumer: GroupConsumer, *, input_topic: str, changelog_topic: str,
                 max_record_bytes: int, clock: Callable[[], float]) -> None:
        self.client, self.consumer = client, consumer
        self.input_topic, self.changelog_topic = input_topic, changelog_topic
        self.max_record_bytes, self.clock = max_record_bytes, clock
        self.retry_after = 0.0  # monotonic time before which no restore is tried (after a failed one)

    def restore_each(self, partitions: list[int], now: float, store: WindowStore, ledger: OffsetLedger
                     ) -> list[Restored]:
        """Restore each partition (none before `retry_after`); one that meets a retriable broker failure (a
        leader or coordinator still moving after a broker restart) stays to restore and is tried again a
        moment later. The restores done."""
        done: list[Restored] = []
        if now < self.retry_after:
            return done
        for p in partitions:
            try:
                r = self.restore(p, store, ledger)
            except KafkaFailure as exc:
                if not exc.retriable:
                    raise
                self.retry_after = now + RESTORE_RETRY_S
                log_event(log, "partition.restore_failed", logging.WARNING, partition=p, error=str(exc),
                          action=f"restoring it again in {RESTORE_RETRY_S:g} s; its records wait until then")
                continue
            done.append(r)
            log_event(log, "partition.restored", partition=p, closed_groups=r.closed_groups,
                      changelog_records=r.changelog_records, committed_offset=r.committed_offset,
                      resume_at=r.resume_at, reread=r.reread,
                      open_windows=sum(1 for k in store.open if k[0] == p), ms=f"{r.seconds * 1000:.0f}")
        return done

    def _reader(self) -> AssignedConsumer:
        return self.client.assigned_consumer(client_id="rollout-stream-restore",
                                             max_record_bytes=self.max_record_bytes)

    def restore(self, p: int, store: WindowStore, ledger: OffsetLedger) -> Restored:
        started = time.monotonic()
        store.drop_partition(p)
        ledger.forget(p)
        reader = self._reader()
        try:
            closed, position, changelog_records = read_changelog(reader, self.changelog_topic, p)
            tp = TopicPartition(self.input_topic, p)
            committed = self.consumer.committed(tp)
            start = committed.offset if committed is not None else self.consumer.beginning_offsets([tp])[tp]
            for wkey, entry in closed.items():
                # A chunked value whose chunks are all read again is joined again, as the first time (its
                # group may still be open); one begun before `start` was decided with its group.
                if entry.first_offset is None or entry.first_offset < start:
                    store.restore_closed(wkey, entry)
            reread = 0
            if position is not None and position > start:
                now_ms = int(self.clock() * 1000)
                for rec in _records(reader, tp, start, position, 60.0):
                    # Same transitions as the first time, outputs suppressed: they are already committed.
                    ledger.hold(p, rec.offset)
                    for outcome in store.take(input_record(rec), now_ms):
                        ledger.resolve(p, [o for r in outcome.records for o in r.offsets])
                    reread += 1
                store.discard_changes(p)  # re-created by the re-read: the changelog holds them
        finally:
            reader.close()
        resume_at = max(start, position or start)
        ledger.mark_committed({p: start})
        self.consumer.seek(tp, resume_at)
        return Restored(
            p, len(closed), changelog_records, start, resume_at, reread, time.monotonic() - started
        )
