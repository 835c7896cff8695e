"""The long-running stage: read, call core, write, commit (SPEC §4.2, §4.5).

Delivery is exactly-once by default (outputs, dead-letters, the window changelog and input offsets in one
Kafka transaction) or at-least-once (flush outputs, then commit offsets below every open record).
"""

from __future__ import annotations

import gc
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

from codec import DecodeError, changelog_key, decode_sample, encode_changelog
from codec.changelog import POSITION_KEY, PartitionPosition
from core.dead_letter_limit import DeadLetterWindow, LimitExceeded
from core.offsets import OffsetLedger
from core.records import DeadLettered, DuplicateDropped, InputRecord, Outcome, Published
from core.rewards import torch_free_normalization
from core.windows import WindowStore
from stream.cadence import POLL_RECORDS, CommitCadence, caught_up
from stream.clients import Connection, make_consumer, make_producer
from stream.consumer_state import fetch_position, unpark_resumed
from stream.config import WorkerConfig
from stream.delivery import (
    AtLeastOnce,
    ChangelogWrite,
    CommitAborted,
    ExactlyOnce,
    ProduceFailed,
    partition_of,
)
from stream.instance import InstanceClaim, claim_instance
from stream.logs import log_event
from stream.names import changelog_topic_name, transactional_id
from stream.outputs import OutputRecord, dead_letter_records, train_records
from stream.rejoin import RejoinWatchdog
from stream.restore import closed_entry, read_changelog, read_range
from stream.topics import ensure_changelog

__all__ = ["Worker", "WorkerStats", "ProduceFailed", "DeadLetterLimitExceeded", "changelog_topic_name"]

log = logging.getLogger("rollout_stream.worker")

UNASSIGNED_REJOIN_S = 30.0
"""No partition for this long (more workers than partitions, or a dropped join): rejoin the group."""

PAUSE_STALL_S = 1.0
"""A pause at the open-group cap during which no window closed ends in an overrun (see _back_pressure)."""


class DeadLetterLimitExceeded(RuntimeError):
    """The worker stopped because too much of its recent input was dead-lettered (core.dead_letter_limit)."""

    def __init__(self, verdict: LimitExceeded, input_topic: str, dead_letter_topic: str) -> None:
        self.verdict = verdict
        super().__init__(
            f"dead-letter limit: {verdict.describe()}; stopped rather than drain {input_topic!r} into "
            f"{dead_letter_topic!r}, with everything before this point committed. Find the cause with "
            "`rollout-stream dlq stats` (a bad producer deploy, a wrong --group-size or --reward-key), "
            "fix it and restart; --max-dead-letter-ratio 1 never stops")


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
    aborts: int = 0
    restores: int = 0
    restored_records: int = 0
    paused: bool = False

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
            "commits": self.commits,
            "aborts": self.aborts,
        }


class _Rebalance(AsyncConsumerRebalanceListener):
    """kafka-python 3 runs these on its IO thread while `poll()` waits in the worker thread: they may touch
    worker state, but must not call blocking consumer APIs."""

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

    def __init__(self, config: WorkerConfig, conn: Connection, *, clock: Callable[[], float] = time.time,
                 claim: InstanceClaim | None = None) -> None:
        self.config = config
        self.claim = claim  # this worker's instance id, held while it runs (stream/instance.py)
        self.conn = conn
        self.clock = clock
        self.stats = WorkerStats()
        self.store = WindowStore(config.windows)
        self.torch_free_normalization = torch_free_normalization()  # torch now, not in the first group
        self.ledger = OffsetLedger()
        self.eos = config.delivery == "exactly-once"
        self.changelog_topic = changelog_topic_name(config.group_id, config.topics.input)
        self._stop = threading.Event()
        self._assigned: set[int] = set()
        self._revoked: set[int] = set()
        self._to_restore: set[int] = set()
        self._reset_all = False
        self._changelog_positions: dict[int, int] = {}
        self._consumer: Any = None
        self._delivery: Any = None
        self.cadence = CommitCadence(config.commit_interval_s, config.commit_max_records)
        self._last_expire = 0.0
        self._last_progress = 0.0
        self._last_heartbeat = 0.0
        self._progress_base = (0.0, 0)
        self.metrics: Any = None  # stream.metrics.LoopMetrics while a metrics endpoint serves this worker
        self.last_tick = 0.0  # monotonic time of the loop's last iteration (liveness)
        self._published_ts: list[int] = []  # per group published since the last commit: newest member's ts
        self._rejoin: Any = None  # RejoinWatchdog, once the consumer exists
        self._overrun = False  # reading past the cap: open windows needed records behind a pause
        self._last_broker_check = 0.0
        self._broker_lost_at: float | None = None  # monotonic time the last broker connection went away
        self._broker_last_said = 0.0
        self._paused_at = 0.0
        self.dead_letters = DeadLetterWindow(config.dead_letter_limit)  # stop when mostly dead-lettering
        self.limit_exceeded: LimitExceeded | None = None

    # ---- lifecycle -----------------------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    def commit_soon(self) -> None:
        """Commit at the loop's next tick instead of the cadence's (e.g. a benchmark that drained its input)."""
        self.cadence.soon()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def ready(self) -> bool:
        """Partitions assigned and every restore done."""
        return bool(self._assigned) and not self._to_restore

    def run(self) -> None:
        """Process until stop is requested; then commit what is resolved and leave the group."""
        if self.claim is None:
            self.claim = claim_instance(self.conn.bootstrap_servers, self.config.group_id, self.config.instance_id)
        try:
            self._run()
        finally:
            self.claim.release()
        if self.limit_exceeded is not None:  # raised after the shutdown committed what came before
            raise DeadLetterLimitExceeded(self.limit_exceeded, self.config.topics.input,
                                          self.config.topics.dead_letter)

    @property
    def instance_id(self) -> str | None:
        return self.claim.instance_id if self.claim is not None else self.config.instance_id

    def _run(self) -> None:
        cfg = self.config
        self._consumer = make_consumer(self.conn, group_id=cfg.group_id, max_record_bytes=cfg.max_record_bytes,
                                       session_timeout_ms=int(cfg.session_timeout_s * 1000),
                                       heartbeat_interval_ms=max(100, int(cfg.session_timeout_s * 1000 / 3)))
        partitions = self._await_topic(cfg.topics.input)
        if self._stop.is_set():
            self._consumer.close(autocommit=False)
            return
        if self.eos:
            ensure_changelog(self.conn, self.changelog_topic, partitions)
            producer = make_producer(
                self.conn, max_record_bytes=cfg.max_record_bytes,
                transactional_id=transactional_id(cfg.group_id, self.instance_id),
                transaction_timeout_ms=int(cfg.transaction_timeout_s * 1000),
            )
            self._delivery = ExactlyOnce(producer, self._consumer, cfg.topics.input, self.ledger, self.changelog_topic)
        else:
            producer = make_producer(self.conn, max_record_bytes=cfg.max_record_bytes)
            self._delivery = AtLeastOnce(producer, self._consumer, cfg.topics.input, self.ledger)
        self._consumer.subscribe([cfg.topics.input], listener=_Rebalance(self))
        self._rejoin = RejoinWatchdog(self._consumer, cfg.topics.input, UNASSIGNED_REJOIN_S, _Rebalance(self))
        # bootstrap_servers: the address connected to (the configured one is None for the local broker).
        log_event(log, "worker.started", **{k: v for k, v in cfg.effective().items()
                                            if k not in ("topics", "instance_id", "bootstrap_servers")},
                  instance_id=self.instance_id, bootstrap_servers=self.conn.bootstrap_servers,
                  input_topic=cfg.topics.input, output_topic=cfg.topics.output,
                  dead_letter_topic=cfg.topics.dead_letter,
                  security=str(self.conn.security),  # masked: no password or key material
                  changelog_topic=self.changelog_topic if self.eos else "-",
                  torch_free_normalization=self.torch_free_normalization)
        now = time.monotonic()
        self._last_progress = now
        self.cadence.committed(now)
        self._progress_base = (now, 0)
        # Everything alive now (torch's ~200k objects above all) lives as long as the process: leave it out of
        # the collector's full passes, each of which stopped the loop for ~90 ms (measured with it imported).
        gc.freeze()
        try:
            while not self._stop.is_set():
                self._step()
        finally:
            self._shutdown()

    def _await_topic(self, topic: str) -> int:
        """Subscribe only once the topic's partitions are known, or the first assignment can come up empty."""
        waited = 0.0
        while not self._stop.is_set():
            parts = self._consumer.partitions_for_topic(topic)
            if parts:
                return len(parts)
            if waited % 10 == 0:
                log_event(log, "topic.waiting", logging.WARNING, topic=topic,
                          hint="create it with `rollout-stream topics create`")
            time.sleep(0.5)
            waited += 0.5
        return 0

    def _step(self) -> None:
        wait_ms = self.cadence.poll_timeout_ms(time.monotonic())
        unpark_resumed(self._consumer)  # back-pressure pauses partitions (stream.consumer_state)
        batch = self._consumer.poll(timeout_ms=wait_ms, max_records=POLL_RECORDS)
        self.last_tick = started = time.monotonic()
        self._assignment_watchdog(started)
        if self._to_restore:
            skip = set(self._to_restore)  # fetched before the restore: they are read again after it
            self._restore(skip)
        else:
            skip = set()
        now_ms = int(self.clock() * 1000)
        for tp, records in batch.items():
            if tp.partition in skip or tp.partition not in self._assigned:
                continue
            for rec in records:
                if self.limit_exceeded is not None:  # the rest stays uncommitted, for after the fix
                    break
                self._accept(rec, now_ms)
        mono = time.monotonic()
        if self.metrics is not None and batch:
            self.metrics.observe_batch(mono - started)
        if mono - self._last_expire >= 0.2:
            self._last_expire = mono
            # Paused, the high watermarks are stale and members may wait behind the pause: expire nothing.
            partitions = set() if self.stats.paused else self._partitions_read()
            self._handle(self.store.expire(now_ms, partitions))
        returned = sum(map(len, batch.values()))
        if self.cadence.due(mono, caught_up=caught_up(self._consumer, returned)):
            self._commit()
        self._back_pressure()
        if mono - self._last_broker_check >= 1.0:
            self._watch_broker(mono)
        if mono - self._last_progress >= self.config.progress_interval_s:
            self._progress(mono)
        if self.config.heartbeat_file and mono - self._last_heartbeat >= 5.0:
            self._last_heartbeat = mono
            with open(self.config.heartbeat_file, "a"):
                os.utime(self.config.heartbeat_file)

    def _assignment_watchdog(self, now: float) -> None:
        waited = self._rejoin.check(now, assigned=bool(self._assigned))
        if waited is not None:
            log_event(log, "partitions.none_assigned", logging.WARNING, seconds=f"{waited:.0f}",
                      action="rejoined the consumer group")

    def _shutdown(self) -> None:
        log_event(log, "worker.stopping", open_windows=self.store.open_count())
        try:
            if self._delivery is not None:
                self._commit(timeout=self.config.shutdown_timeout_s)
        finally:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
            if self._delivery is not None:
                self._delivery.close(timeout=self.config.shutdown_timeout_s)
            log_event(log, "worker.stopped", open_windows_left_uncommitted=self.store.open_count(),
                      **self.stats.summary())

    # ---- records in ----------------------------------------------------------------------------
    def _input_record(self, rec: Any) -> InputRecord:
        return InputRecord(rec.topic, rec.partition, rec.offset, rec.timestamp, rec.key, rec.value,
                           tuple(rec.headers) if rec.headers else ())

    def _decode(self, rec: Any) -> Any:
        if rec.value is None:
            return DecodeError("record has no value (tombstone)")
        try:
            return decode_sample(rec.value)
        except DecodeError as exc:
            return exc

    def _accept(self, rec: Any, now_ms: int) -> None:
        self.stats.records_in += 1
        self.cadence.uncommitted += 1
        self.ledger.hold(rec.partition, rec.offset)
        self._handle(self.store.accept(self._input_record(rec), self._decode(rec), now_ms))

    def _positions(self) -> dict[int, tuple[int, int]]:
        """(next offset to read, last known high watermark) of every partition that delivered records."""
        out: dict[int, tuple[int, int]] = {}
        for p in list(self._assigned):  # a copy: the metrics endpoint calls this from its own thread
            tracker = self.ledger.partitions.get(p)
            if tracker is None or tracker.next_offset is None:
                continue  # nothing read since assignment, so no window can be open there
            tp = TopicPartition(self.config.topics.input, p)
            high = self._consumer.highwater(tp)
            if high is not None:
                out[p] = (max(tracker.next_offset, fetch_position(self._consumer, tp)), high)
        return out

    def _partitions_read(self) -> set[int]:
        """Partitions whose fetched backlog is read: only there may the wall clock expire a group."""
        return {p for p, (pos, high) in self._positions().items() if pos >= high}

    # ---- outcomes out --------------------------------------------------------------------------
    def _handle(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Published):
                self._publish(outcome)
                self._judge(self.dead_letters.published(len(outcome.members)))
            elif isinstance(outcome, DeadLettered):
                self._dead_letter(outcome)
                self._judge(self.dead_letters.dead_lettered_as(outcome.reason.value, len(outcome.records)))
            elif isinstance(outcome, DuplicateDropped):
                self.stats.duplicates += 1
                self.ledger.resolve(outcome.record.partition, (outcome.record.offset,))
                log_event(log, "duplicate.dropped", logging.DEBUG, group=outcome.group_key,
                          partition=outcome.record.partition, offset=outcome.record.offset)

    def _judge(self, verdict: LimitExceeded | None) -> None:
        """Past the dead-letter limit: stop taking records; the shutdown commits what was resolved."""
        if verdict is None or self.limit_exceeded is not None:
            return
        self.limit_exceeded = verdict
        log_event(log, "dead_letter.limit_exceeded", logging.ERROR, dead_lettered=verdict.dead_lettered,
                  resolved=verdict.resolved, max_ratio=verdict.limit.max_ratio,
                  reasons=",".join(f"{r}:{n}" for r, n in verdict.by_reason), action="stopping")
        self._stop.set()

    def _publish(self, group: Published) -> None:
        policy = self.config.zero_variance
        topic = self.config.topics.output
        if group.rewards.zero_variance:
            self.stats.zero_variance_groups += 1
            if policy.mode == "drop":
                self.stats.zero_variance_dropped += len(group.members)
                for m in group.members:
                    self.ledger.resolve(m.record.partition, (m.record.offset,))
                log_event(log, "group.zero_variance_dropped", group=group.group_key, samples=len(group.members))
                return
            if policy.mode == "route":
                assert policy.topic is not None
                topic = policy.topic
        partition = partition_of(self._delivery.producer, topic, group.group_key.encode())
        for out in train_records(group, self.store.config.reward, topic, partition):
            self._send(out)
        self.stats.groups_published += 1
        self.stats.samples_published += len(group.members)
        if self.metrics is not None:
            self._published_ts.append(max(m.record.timestamp_ms for m in group.members))

    def _dead_letter(self, failure: DeadLettered) -> None:
        reason = failure.reason.value
        self.stats.dead_lettered[reason] += len(failure.records)
        first = failure.records[0]
        if failure.straggler:  # its group was counted and logged when it was rejected
            log_event(log, "dead_letter.straggler", logging.DEBUG, reason=reason, group=failure.group_key,
                      partition=first.partition, offset=first.offset)
        else:
            self.stats.dead_letter_groups[reason] += 1
            log_event(log, "dead_letter", logging.WARNING, reason=reason, group=failure.group_key,
                      records=len(failure.records), partition=first.partition, offset=first.offset,
                      message=failure.message[:500])
        for out in dead_letter_records(failure, self.config.topics.dead_letter):
            self._send(out)

    def _send(self, out: OutputRecord) -> None:
        self._delivery.send(out)
        self.cadence.outputs += 1

    # ---- commit --------------------------------------------------------------------------------
    def _changelog_writes(self) -> list[ChangelogWrite]:
        changes = self.store.drain_changes()
        if not self.eos:
            return []
        writes = [
            ChangelogWrite(k[0], changelog_key(k[1], k[2]), encode_changelog(closed_entry(c)) if c else None)
            for k, c in changes.items() if k[0] in self._assigned
        ]
        for p in self._assigned - self._to_restore:
            tracker = self.ledger.partitions.get(p)
            if tracker is not None and tracker.next_offset is not None \
                    and tracker.next_offset != self._changelog_positions.get(p):
                writes.append(ChangelogWrite(p, POSITION_KEY, encode_changelog(PartitionPosition(tracker.next_offset))))
                self._changelog_positions[p] = tracker.next_offset
        return writes

    def _commit(self, timeout: float | None = None) -> None:
        started = time.monotonic()
        self.cadence.committed(started)
        try:
            if self.eos:
                committed = self._delivery.commit(self._assigned - self._to_restore, self._changelog_writes(), timeout)
            else:
                self.store.drain_changes()
                committed = self._delivery.commit(self._assigned, [], timeout)
        except CommitAborted as exc:
            self.stats.aborts += 1
            self._published_ts = []  # re-processed after the restore, and observed then
            log_event(log, "commit.aborted", logging.WARNING, error=str(exc),
                      action="restoring every assigned partition from the last commit")
            self._restore_all_later()
            return
        if self.metrics is not None and (committed or self._published_ts):  # idle ticks are not commits
            self.metrics.observe_commit(time.monotonic() - started, self._published_ts, int(self.clock() * 1000))
            self._published_ts = []
        if committed:
            self.stats.commits += 1
            log_event(log, "commit", logging.DEBUG, ms=f"{(time.monotonic() - started) * 1000:.1f}",
                      offsets=",".join(f"{p}:{o}" for p, o in sorted(committed.items())))

    def _restore_all_later(self) -> None:
        for p in list(self._assigned):
            self.store.drop_partition(p)
            self.ledger.forget(p)
            self._changelog_positions.pop(p, None)
        self._to_restore |= self._assigned

    # ---- rebalance and restore -----------------------------------------------------------------
    async def _on_revoked(self, partitions: set[int]) -> None:
        """Commit what is processed before the partitions may move."""
        if not partitions:
            return
        try:
            if self.eos:
                await self._delivery.commit_on_revoke(self._assigned - self._to_restore, self._changelog_writes())
            else:
                await self._delivery.commit_on_revoke(self._assigned)
        except CommitAborted as exc:
            log_event(log, "commit.on_revoke_aborted", logging.WARNING, error=str(exc))
            self._reset_all = True
        except Exception as exc:  # at-least-once: the next owner re-reads from the last commit
            log_event(log, "commit.on_revoke_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            self._reset_all = True
        self._revoked |= partitions
        log_event(log, "partitions.revoked", partitions=",".join(map(str, sorted(partitions))))

    def _on_assigned(self, partitions: set[int]) -> None:
        # kafka-python keeps the fetch position of a partition assigned again, so its state stays valid.
        gone = (self._revoked | self._assigned) - partitions
        for p in gone:
            self._drop(p)
        new = partitions - (self._assigned - gone) if not self._reset_all else set(partitions)
        if self._reset_all:
            for p in partitions:
                self._drop(p)
            self._reset_all = False
        self._revoked.clear()
        self._assigned = set(partitions)
        if self.eos:
            self._to_restore |= new
        log_event(log, "partitions.assigned", topic=self.config.topics.input,
                  partitions=",".join(map(str, sorted(partitions))), new=",".join(map(str, sorted(new))))

    def _on_lost(self, partitions: set[int]) -> None:
        for p in partitions:
            self._drop(p)
        self._assigned -= partitions
        log_event(log, "partitions.lost", logging.WARNING, partitions=",".join(map(str, sorted(partitions))))
        if self.eos and self._delivery is not None and self._delivery.open:
            # Lost while this worker was stalled or cut off: the new owner produces these outputs again, so the
            # open transaction must never commit (after a rejoin its offsets would pass the generation check).
            self._delivery.abort(CommitAborted(f"partitions {','.join(map(str, sorted(partitions)))} were lost"))
            self.stats.aborts += 1
            self._restore_all_later()

    def _drop(self, partition: int) -> None:
        """Forget a partition's windows; its uncommitted records are re-read by whoever owns it next."""
        self.store.drop_partition(partition)
        self.ledger.forget(partition)
        self._delivery.forget(partition)
        self._changelog_positions.pop(partition, None)
        self._to_restore.discard(partition)

    def _restore(self, partitions: set[int]) -> None:
        """Exactly-once: rebuild state from the changelog and the input, then continue where it ends."""
        topic = self.config.topics.input
        for p in sorted(partitions):
            started = time.monotonic()
            self.store.drop_partition(p)
            self.ledger.forget(p)
            closed, position, changelog_records = read_changelog(self.conn, self.changelog_topic, p)
            for wkey, entry in closed.items():
                self.store.restore_closed(wkey, entry)
            tp = TopicPartition(topic, p)
            committed = self._consumer.committed(tp)
            start = committed if committed is not None else self._consumer.beginning_offsets([tp])[tp]
            replayed = 0
            if position is not None and position > start:
                now_ms = int(self.clock() * 1000)

                def refeed(rec: Any) -> None:
                    # Same transitions as the first time, outputs suppressed: they are already committed.
                    self.ledger.hold(p, rec.offset)
                    for outcome in self.store.accept(self._input_record(rec), self._decode(rec), now_ms):
                        self.ledger.resolve(p, [r.offset for r in outcome.records])

                replayed = read_range(self.conn, topic, p, start, position, refeed,
                                      max_record_bytes=self.config.max_record_bytes)
                self.store.changes = {k: v for k, v in self.store.changes.items() if k[0] != p}
            resume_at = max(start, position or start)
            self.ledger.mark_committed({p: start})
            self._changelog_positions[p] = resume_at
            self._consumer.seek(tp, resume_at)
            self._to_restore.discard(p)
            self.stats.restores += 1
            self.stats.restored_records += replayed
            log_event(log, "partition.restored", partition=p, closed_groups=len(closed),
                      changelog_records=changelog_records, committed_offset=start, resume_at=resume_at,
                      reread=replayed, open_windows=sum(1 for k in self.store.open if k[0] == p),
                      ms=f"{(time.monotonic() - started) * 1000:.0f}")

    # ---- back-pressure -------------------------------------------------------------------------
    def _back_pressure(self) -> None:
        """At a cap, pause fetching. Open windows complete only with records behind the pause, though: if none
        closed within PAUSE_STALL_S, read on past the cap (logged) until below it, rather than let complete
        groups time out as incomplete. Groups are bounded by the byte cap per group (group_too_large)."""
        cfg = self.config
        n, nbytes = self.store.open_count(), self.store.open_bytes
        full = n >= cfg.max_open_groups or nbytes >= cfg.max_open_bytes
        low = n < 0.8 * cfg.max_open_groups and nbytes < 0.8 * cfg.max_open_bytes
        mono = time.monotonic()
        if self._overrun:
            if low:
                self._overrun = False
                log_event(log, "backpressure.overrun_ended", open_windows=n, open_bytes=nbytes)
            return
        tps = [TopicPartition(cfg.topics.input, p) for p in self._assigned]
        if full and not self.stats.paused:
            self._consumer.pause(*tps)
            self.stats.paused = True
            self._paused_at = mono
            log_event(log, "backpressure.paused", logging.WARNING, open_windows=n, open_bytes=nbytes)
        elif self.stats.paused and low:
            self._consumer.resume(*tps)
            self.stats.paused = False
            log_event(log, "backpressure.resumed", open_windows=n, open_bytes=nbytes)
        elif self.stats.paused and mono - self._paused_at >= PAUSE_STALL_S:
            self._consumer.resume(*tps)
            self.stats.paused = False
            self._overrun = True
            log_event(log, "backpressure.overrun", logging.WARNING, open_windows=n, open_bytes=nbytes,
                      paused_s=f"{mono - self._paused_at:.1f}",
                      why="no open group closed while paused: their members are behind the pause; "
                          "reading on past the cap until below it")

    # ---- broker connectivity -------------------------------------------------------------------
    def _broker_connections(self) -> int | None:
        try:
            return int(self._consumer.metrics()["consumer-metrics"]["connection-count"])
        except (KeyError, TypeError, ValueError):
            return None  # metrics disabled or renamed: say nothing rather than something wrong

    def _watch_broker(self, mono: float) -> None:
        """Say when the worker has no broker connection left, and when it is back. The clients reconnect
        with backoff on their own; uncommitted outputs and offsets wait in the open transaction."""
        self._last_broker_check = mono
        count = self._broker_connections()
        if count is None:
            return
        if count == 0 and self._broker_lost_at is None:
            self._broker_lost_at = self._broker_last_said = mono
            log_event(log, "broker.unreachable", logging.WARNING, bootstrap=self.conn.bootstrap_servers,
                      open_windows=self.store.open_count(),
                      action="retrying with backoff; nothing is committed until it is back")
        elif count == 0 and self._broker_lost_at is not None and mono - self._broker_last_said >= 10.0:
            self._broker_last_said = mono
            log_event(log, "broker.still_unreachable", logging.WARNING, bootstrap=self.conn.bootstrap_servers,
                      down_s=f"{mono - self._broker_lost_at:.0f}")
        elif count > 0 and self._broker_lost_at is not None:
            log_event(log, "broker.reconnected", bootstrap=self.conn.bootstrap_servers,
                      down_s=f"{mono - self._broker_lost_at:.1f}")
            self._broker_lost_at = None

    # ---- progress ------------------------------------------------------------------------------
    def partition_lag(self) -> dict[int, int]:
        """Records between each partition's next offset and its last known high watermark."""
        return {p: max(0, high - pos) for p, (pos, high) in self._positions().items()}

    def lag(self) -> int:
        return sum(self.partition_lag().values())

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
            commits=self.stats.commits,
        )
