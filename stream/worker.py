"""The long-running stage: read, call core, write, commit (SPEC §4.2). At-least-once, nothing lost."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka import TopicPartition
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.structs import OffsetAndMetadata

from codec import DecodeError, decode_sample
from core.offsets import OffsetLedger
from core.records import DeadLettered, DuplicateDropped, InputRecord, Outcome, Published
from core.windows import WindowStore
from stream.clients import Connection, make_consumer, make_producer
from stream.config import WorkerConfig
from stream.logs import log_event
from stream.outputs import OutputRecord, dead_letter_records, train_records

__all__ = ["Worker", "WorkerStats", "ProduceFailed"]

log = logging.getLogger("rollout_stream.worker")


class ProduceFailed(RuntimeError):
    """The broker refused an output after the client's retries: stop without committing past it."""


@dataclass
class WorkerStats:
    records_in: int = 0
    samples_published: int = 0
    groups_published: int = 0
    dead_lettered: Counter[str] = field(default_factory=Counter)  # records by reason
    dead_letter_groups: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    zero_variance_groups: int = 0
    zero_variance_dropped: int = 0
    commits: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "records_in": self.records_in,
            "groups_published": self.groups_published,
            "samples_published": self.samples_published,
            "dead_lettered": sum(self.dead_lettered.values()),
            "dead_lettered_by_reason": dict(sorted(self.dead_lettered.items())),
            "duplicates": self.duplicates,
            "zero_variance_groups": self.zero_variance_groups,
            "zero_variance_dropped": self.zero_variance_dropped,
        }


class _Rebalance(AsyncConsumerRebalanceListener):
    """Rebalance hooks. kafka-python 3 runs them on its IO thread while `poll()` waits in the worker thread,
    so they may touch worker state but must not call blocking consumer APIs (hence `await`)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.worker._on_revoked({tp.partition for tp in revoked})

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.worker._on_assigned({tp.partition for tp in assigned})

    async def on_partitions_lost(self, lost: Any) -> None:
        self.worker._on_lost({tp.partition for tp in lost})


class Worker:
    """Consumes rollout samples, windows them by prompt group, publishes or dead-letters whole groups."""

    def __init__(
        self,
        config: WorkerConfig,
        conn: Connection,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.conn = conn
        self.clock = clock
        self.stats = WorkerStats()
        self.store = WindowStore(config.windows)
        self.ledger = OffsetLedger()
        self._stop = threading.Event()
        self._in_flight: list[tuple[Any, OutputRecord]] = []
        self._assigned: set[int] = set()
        self._revoked: set[int] = set()
        self._consumer: Any = None
        self._producer: Any = None
        self._last_commit = 0.0
        self._last_expire = 0.0
        self._last_progress = 0.0
        self._last_heartbeat = 0.0
        self._progress_base = (0.0, 0)

    # ---- lifecycle -----------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Process until stop is requested; then flush, commit what is resolved and leave the group."""
        cfg = self.config
        self._producer = make_producer(self.conn, max_record_bytes=cfg.max_record_bytes)
        self._consumer = make_consumer(self.conn, group_id=cfg.group_id, max_record_bytes=cfg.max_record_bytes)
        self._await_topic(cfg.topics.input)
        self._consumer.subscribe([cfg.topics.input], listener=_Rebalance(self))
        log_event(log, "worker.started", **{k: v for k, v in cfg.effective().items() if k != "topics"},
                  input_topic=cfg.topics.input, output_topic=cfg.topics.output,
                  dead_letter_topic=cfg.topics.dead_letter, bootstrap=self.conn.bootstrap_servers)
        now = time.monotonic()
        self._last_progress = now
        self._progress_base = (now, 0)
        try:
            while not self._stop.is_set():
                self._step()
        finally:
            self._shutdown()

    def _await_topic(self, topic: str) -> None:
        """Subscribe only once the topic's partitions are known, or the first assignment can come up empty."""
        waited = 0.0
        while not self._stop.is_set():
            if self._consumer.partitions_for_topic(topic):
                return
            if waited % 10 == 0:
                log_event(log, "topic.waiting", logging.WARNING, topic=topic,
                          hint="create it with `rollout-stream topics create`")
            time.sleep(0.5)
            waited += 0.5

    def _step(self) -> None:
        batch = self._consumer.poll(timeout_ms=100, max_records=500)
        now_ms = int(self.clock() * 1000)
        for tp, records in batch.items():
            for rec in records:
                self._accept(rec, now_ms)
        mono = time.monotonic()
        if mono - self._last_expire >= 0.2:
            self._last_expire = mono
            self._handle(self.store.expire(now_ms, self._caught_up()))
        if mono - self._last_commit >= self.config.commit_interval_s:
            self._flush_and_commit()
        if mono - self._last_progress >= self.config.progress_interval_s:
            self._progress(mono)
        if self.config.heartbeat_file and mono - self._last_heartbeat >= 5.0:
            self._last_heartbeat = mono
            with open(self.config.heartbeat_file, "a"):
                os.utime(self.config.heartbeat_file)

    def _shutdown(self) -> None:
        log_event(log, "worker.stopping", open_windows=self.store.open_count())
        try:
            if self._consumer is not None and self._producer is not None:
                self._flush_and_commit(timeout=self.config.shutdown_timeout_s)
        finally:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
            if self._producer is not None:
                self._producer.close(timeout=self.config.shutdown_timeout_s)
            log_event(log, "worker.stopped", open_windows_left_uncommitted=self.store.open_count(),
                      **self.stats.summary())

    # ---- records in ----------------------------------------------------------------------------
    def _accept(self, rec: Any, now_ms: int) -> None:
        self.stats.records_in += 1
        record = InputRecord(
            topic=rec.topic, partition=rec.partition, offset=rec.offset, timestamp_ms=rec.timestamp,
            key=rec.key, value=rec.value, headers=tuple(rec.headers or ()),
        )
        self.ledger.hold(rec.partition, rec.offset)
        decoded: Any
        if rec.value is None:
            decoded = DecodeError("record has no value (tombstone)")
        else:
            try:
                decoded = decode_sample(rec.value)
            except DecodeError as exc:
                decoded = exc
        self._handle(self.store.accept(record, decoded, now_ms))

    def _positions(self) -> dict[int, tuple[int, int]]:
        """(next offset to read, last known high watermark) of every partition that delivered records."""
        out: dict[int, tuple[int, int]] = {}
        for p in self._assigned:
            tracker = self.ledger.partitions.get(p)
            if tracker is None or tracker.next_offset is None:
                continue  # nothing read since assignment, so no window can be open there
            high = self._consumer.highwater(TopicPartition(self.config.topics.input, p))
            if high is not None:
                out[p] = (tracker.next_offset, high)
        return out

    def _caught_up(self) -> set[int]:
        """Partitions whose fetched backlog is read: only there may the wall clock expire a group."""
        return {p for p, (pos, high) in self._positions().items() if pos >= high}

    # ---- outcomes out --------------------------------------------------------------------------
    def _handle(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Published):
                self._publish(outcome)
            elif isinstance(outcome, DeadLettered):
                self._dead_letter(outcome)
            elif isinstance(outcome, DuplicateDropped):
                self.stats.duplicates += 1
                self._resolve_now(outcome.record)
                log_event(log, "duplicate.dropped", logging.DEBUG, group=outcome.group_key,
                          partition=outcome.record.partition, offset=outcome.record.offset)

    def _publish(self, group: Published) -> None:
        policy = self.config.zero_variance
        topic = self.config.topics.output
        if group.rewards.zero_variance:
            self.stats.zero_variance_groups += 1
            if policy.mode == "drop":
                self.stats.zero_variance_dropped += len(group.members)
                for m in group.members:
                    self._resolve_now(m.record)
                log_event(log, "group.zero_variance_dropped", group=group.group_key, samples=len(group.members))
                return
            if policy.mode == "route":
                assert policy.topic is not None
                topic = policy.topic
        for out in train_records(group, self.config.reward, topic):
            self._send(out)
        self.stats.groups_published += 1
        self.stats.samples_published += len(group.members)

    def _dead_letter(self, failure: DeadLettered) -> None:
        reason = failure.reason.value
        self.stats.dead_lettered[reason] += len(failure.records)
        self.stats.dead_letter_groups[reason] += 1
        first = failure.records[0]
        log_event(log, "dead_letter", logging.WARNING, reason=reason, group=failure.group_key,
                  records=len(failure.records), partition=first.partition, offset=first.offset,
                  message=failure.message[:500])
        for out in dead_letter_records(failure, self.config.topics.dead_letter):
            self._send(out)

    def _send(self, out: OutputRecord) -> None:
        future = self._producer.send(out.topic, value=out.value, key=out.key, headers=out.headers)
        self._in_flight.append((future, out))

    def _resolve_now(self, record: InputRecord) -> None:
        self.ledger.resolve(record.partition, (record.offset,))

    # ---- commit --------------------------------------------------------------------------------
    def _flush(self, timeout: float | None = None) -> None:
        """Wait for every output to be acknowledged and mark its input resolved."""
        if not self._in_flight:
            return
        self._producer.flush(timeout=timeout)
        in_flight, self._in_flight = self._in_flight, []
        for future, out in in_flight:
            if not future.is_done:
                raise ProduceFailed(f"output to {out.topic} not acknowledged within the flush timeout")
            if future.failed():
                raise ProduceFailed(
                    f"broker refused output to {out.topic} for input {out.source.topic}:"
                    f"{out.source.partition}@{out.source.offset}: {type(future.exception).__name__}: "
                    f"{future.exception}"
                )
            self.ledger.resolve(out.source.partition, (out.source.offset,))

    def _due_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        topic = self.config.topics.input
        due = {p: pos for p, pos in self.ledger.due().items() if p in self._assigned}
        return {TopicPartition(topic, p): OffsetAndMetadata(pos, "", -1) for p, pos in due.items()}

    def _flush_and_commit(self, timeout: float | None = None) -> None:
        """Flush outputs, then commit, per partition, the position below every unresolved record."""
        self._last_commit = time.monotonic()
        self._flush(timeout)
        offsets = self._due_offsets()
        if offsets:
            self._consumer.commit(offsets)
            self.ledger.mark_committed({tp.partition: om.offset for tp, om in offsets.items()})
            self.stats.commits += 1

    # ---- rebalance -----------------------------------------------------------------------------
    async def _on_revoked(self, partitions: set[int]) -> None:
        """Commit what is resolved before the partitions may move; their state is dropped on assignment
        unless they come back (kafka-python keeps the fetch position of a partition assigned again)."""
        if not partitions:
            return
        self._flush()
        offsets = self._due_offsets()
        if offsets:
            try:
                # The blocking commit() may not run on the IO thread; this is the coroutine under it.
                await self._consumer._coordinator._commit_offsets_sync_async(offsets)
                self.ledger.mark_committed({tp.partition: om.offset for tp, om in offsets.items()})
            except Exception as exc:  # the new owner re-reads from the last commit: duplicates, never loss
                log_event(log, "commit.on_revoke_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
        self._revoked |= partitions
        log_event(log, "partitions.revoked", partitions=",".join(map(str, sorted(partitions))))

    def _on_assigned(self, partitions: set[int]) -> None:
        gone = self._revoked - partitions
        for p in gone:
            self._drop(p)
        self._revoked.clear()
        self._assigned = set(partitions)
        log_event(log, "partitions.assigned", topic=self.config.topics.input,
                  partitions=",".join(map(str, sorted(partitions))), dropped_state=",".join(map(str, sorted(gone))))

    def _on_lost(self, partitions: set[int]) -> None:
        for p in partitions:
            self._drop(p)
        log_event(log, "partitions.lost", logging.WARNING, partitions=",".join(map(str, sorted(partitions))))

    def _drop(self, partition: int) -> None:
        """Forget a partition's windows; the uncommitted records are re-read by whoever owns it next."""
        self.store.drop_partition(partition)
        self.ledger.forget(partition)
        self._assigned.discard(partition)
        self._in_flight = [(f, o) for f, o in self._in_flight if o.source.partition != partition]

    # ---- progress ------------------------------------------------------------------------------
    def lag(self) -> int:
        return sum(max(0, high - pos) for pos, high in self._positions().values())

    def _progress(self, mono: float) -> None:
        t0, n0 = self._progress_base
        rate = (self.stats.samples_published - n0) / max(mono - t0, 1e-9)
        self._progress_base = (mono, self.stats.samples_published)
        self._last_progress = mono
        log_event(
            log, "progress",
            groups_published=self.stats.groups_published,
            samples_per_s=f"{rate:.1f}",
            dead_lettered=",".join(f"{k}:{v}" for k, v in sorted(self.stats.dead_lettered.items())) or "0",
            duplicates=self.stats.duplicates,
            open_windows=self.store.open_count(),
            open_bytes=self.store.open_bytes,
            lag=self.lag(),
        )
