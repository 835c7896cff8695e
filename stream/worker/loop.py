"""The long-running stage as a thin loop: poll → core → route outcomes → commit (docs/spec.md §4.2, §4.5).

Each concern is a part with one job: `Partitions` (rebalance bookkeeping), `Restorer` (state from the
changelog), `Delivery` (exactly-once or at-least-once, each owning its commit and changelog), `Router`
(outcomes to topics, the zero-variance policy, the dead-letter limit), `BackPressure`, `BrokerWatch`,
`CommitCadence`, `Every` (periodic work). The loop is also the consumer's rebalance listener.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from codec import compiled
from core.offsets import OffsetLedger
from core.records import Outcome
from core.rewards import torch_free_normalization
from core.windows import WindowStore, input_record
from stream.clients import Connection
from stream.config import WorkerConfig
from stream.kafka import Client, GroupConsumer, KafkaFailure, Record, TopicPartition, client_for
from stream.logs import log_event
from stream.names import changelog_topic_name, transactional_id
from stream.topics import ensure_changelog
from stream.worker.backpressure import BackPressure
from stream.worker.broker_watch import BrokerWatch
from stream.worker.cadence import POLL_RECORDS, CommitCadence, caught_up
from stream.worker.delivery import AtLeastOnce, CommitAborted, Delivery, ExactlyOnce
from stream.worker.instance import InstanceClaim, claim_instance
from stream.worker.leave import leave_group
from stream.worker.outputs import OutputRecord
from stream.worker.partitions import Partitions
from stream.worker.periodic import Every
from stream.worker.restore import Restorer
from stream.worker.routing import DeadLetterLimitExceeded, Router
from stream.worker.stats import LoopObserver, OutcomeCounts, Snapshot, WorkerStats

__all__ = ["Worker"]

log = logging.getLogger("rollout_stream.worker")

RESTORE_RETRY_S = 0.5
"""After a retriable failure, how long a partition's restore waits before it is tried again."""


class Worker:
    """Consumes rollout samples, windows them by prompt group, publishes or dead-letters whole groups."""

    def __init__(self, config: WorkerConfig, conn: Connection, *, clock: Callable[[], float] = time.time,
                 claim: InstanceClaim | None = None, client: Client | None = None) -> None:
        self.config, self.conn, self.clock = config, conn, clock
        self.claim = claim  # this worker's instance id, held while it runs (stream/worker/instance.py)
        self.client = client or client_for(conn)
        self.stats = WorkerStats()
        self.store = WindowStore(config.windows)
        self.torch_free_normalization = torch_free_normalization()  # torch now, not in the first group
        self.ledger = OffsetLedger()
        self.eos = config.delivery == "exactly-once"
        self.changelog_topic = changelog_topic_name(config.group_id, config.topics.input)
        self.partitions = Partitions(restores=self.eos)
        self.cadence = CommitCadence(config.commit_interval_s, config.commit_max_records)
        self.outcomes = OutcomeCounts()  # routed since the last commit; in self.stats once committed
        self.router = Router(config, config.windows.reward, self.outcomes, self.ledger, self._send,
                             self._partition_for)
        self.metrics: LoopObserver | None = None
        self.snapshot = Snapshot(self.stats)
        self.last_tick = 0.0  # monotonic time of the loop's last iteration (liveness)
        self._restore_after = 0.0  # monotonic time before which no restore is tried (after a failed one)
        self._stop = threading.Event()
        self._consumer: GroupConsumer | None = None
        self._delivery: Delivery | None = None

    # ---- lifecycle -----------------------------------------------------------------------------
    def observe_with(self, metrics: LoopObserver) -> None:
        """Report batch, commit and latency observations to `metrics` (stream.worker.metrics.LoopMetrics)."""
        self.metrics = metrics
        self.router.track_published = True

    def request_stop(self) -> None:
        self._stop.set()

    def commit_soon(self) -> None:
        """Commit at the next tick instead of the cadence's (e.g. a benchmark that drained its input)."""
        self.cadence.soon()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def ready(self) -> bool:
        """Partitions assigned and every restore done."""
        return self.partitions.ready

    @property
    def instance_id(self) -> str | None:
        return self.claim.instance_id if self.claim is not None else self.config.instance_id

    @property
    def dead_letters(self) -> object:
        return self.router.dead_letters

    @property
    def limit_exceeded(self) -> object:
        return self.router.limit_exceeded

    def run(self) -> None:
        """Process until stop is requested; then commit what is resolved and leave the group."""
        if self.claim is None:
            self.claim = claim_instance(
                self.conn.bootstrap_servers, self.config.group_id, self.config.instance_id
            )
        try:
            if self.open():
                stopped = False
                try:
                    while not self._stop.is_set():
                        self.step()
                    stopped = True
                finally:
                    # Not after an error: fenced, a newer worker holds this instance id, and leaving would
                    # remove it; crashed, a supervisor restarts this one.
                    self.close(leave=stopped)
        finally:
            self.claim.release()
        if self.router.limit_exceeded is not None:  # raised after the shutdown committed what came before
            raise DeadLetterLimitExceeded(self.router.limit_exceeded, self.config.topics.input,
                                          self.config.topics.dead_letter)

    def open(self) -> bool:
        """Connect, subscribe and get ready to loop; False when stopped before the input topic appeared."""
        cfg = self.config
        consumer = self._consumer = self.client.group_consumer(
            cfg.group_id, client_id=self.conn.client_id, max_record_bytes=cfg.max_record_bytes,
            session_timeout_s=cfg.session_timeout_s,
            # Static membership: restarted with its instance id, a worker gets its partitions back at once
            # instead of after the session timeout (KIP-345).
            instance_id=self.instance_id)
        partitions = self._await_topic(consumer, cfg.topics.input)
        if not partitions:
            consumer.close()
            return False
        if self.eos:
            ensure_changelog(self.client, self.changelog_topic, partitions)
            producer = self.client.producer(
                client_id=self.conn.client_id, max_record_bytes=cfg.max_record_bytes,
                transactional_id=transactional_id(cfg.group_id, self.instance_id or ""),
                transaction_timeout_s=cfg.transaction_timeout_s)
            self._delivery = ExactlyOnce(producer, consumer, cfg.topics.input, self.ledger, self.store,
                                         self.changelog_topic)
        else:
            producer = self.client.producer(
                client_id=self.conn.client_id, max_record_bytes=cfg.max_record_bytes
            )
            self._delivery = AtLeastOnce(producer, consumer, cfg.topics.input, self.ledger, self.store)
        self.restorer = Restorer(self.client, consumer, input_topic=cfg.topics.input,
                                 changelog_topic=self.changelog_topic, store=self.store, ledger=self.ledger,
                                 max_record_bytes=cfg.max_record_bytes, accept=self._decide, clock=self.clock)
        self.back_pressure = BackPressure(consumer, cfg.topics.input, max_groups=cfg.max_open_groups,
                                          max_bytes=cfg.max_open_bytes)
        self.broker = BrokerWatch(consumer.connection_count, self.conn.bootstrap_servers)
        consumer.subscribe(cfg.topics.input, self)
        log_event(log, "worker.started", **{k: v for k, v in cfg.effective().items()
                                            if k not in ("topics", "instance_id", "bootstrap_servers")},
                  instance_id=self.instance_id, bootstrap_servers=self.conn.bootstrap_servers,
                  client=self.client.name, input_topic=cfg.topics.input, output_topic=cfg.topics.output,
                  dead_letter_topic=cfg.topics.dead_letter,
                  security=str(self.conn.security),  # masked: no password or key material
                  changelog_topic=self.changelog_topic if self.eos else "-",
                  torch_free_normalization=self.torch_free_normalization,
                  hot_path=compiled.status().describe())
        now = time.monotonic()
        self.cadence.committed(now)
        self.periodic = {"expire": Every(0.2), "broker": Every(1.0, start=now),
                         "progress": Every(cfg.progress_interval_s, start=now), "heartbeat": Every(5.0)}
        self._progress_base = (now, 0)
        # Everything alive now (torch's ~200k objects above all) lives as long as the process: leave it out of
        # the collector's full passes, each of which stopped the loop for ~90 ms (measured with it imported).
        gc.freeze()
        return True

    def _await_topic(self, consumer: GroupConsumer, topic: str) -> int:
        """Subscribe only once the topic's partitions are known, or the first assignment can come up empty."""
        waited = 0.0
        while not self._stop.is_set():
            parts = consumer.partitions_for_topic(topic)
            if parts:
                return len(parts)
            if waited % 10 == 0:
                log_event(log, "topic.waiting", logging.WARNING, topic=topic,
                          hint="create it with `rollout-stream topics create`")
            time.sleep(0.5)
            waited += 0.5
        return 0

    # ---- one tick ------------------------------------------------------------------------------
    def step(self) -> None:
        """One iteration: poll, restore what needs it, decide, route, commit when due, periodic work."""
        assert self._consumer is not None
        batch = self._consumer.poll(self.cadence.poll_timeout_ms(time.monotonic()) / 1000, POLL_RECORDS)
        self.last_tick = started = time.monotonic()
        skip = set(self.partitions.to_restore)  # fetched before the restore: they are read again after it
        if skip and started >= self._restore_after:
            self._restore_each(sorted(skip), started)
        now_ms = int(self.clock() * 1000)
        active = self.partitions.active
        try:
            for tp, records in batch.items():
                if tp.partition in skip or tp.partition not in active:
                    continue
                self._accept_batch(records, now_ms)
            mono = time.monotonic()
            if self.metrics is not None and batch:
                self.metrics.observe_batch(mono - started)
            if self.periodic["expire"].due(mono):
                # Paused, the high watermarks are stale and members may wait behind the pause: expire nothing.
                self.router.route(
                    self.store.expire(now_ms, set() if self.back_pressure.paused else self._read_up())
                )
        except CommitAborted as exc:  # a send failed: the rest of this batch is read again after the restore
            self._aborted(exc)
            mono = time.monotonic()
        if self.router.limit_exceeded is not None:
            self._stop.set()
        if self.cadence.due(mono, caught_up=caught_up(self._consumer, sum(map(len, batch.values())))):
            self._commit()
        self.back_pressure.check(
            mono, self.store.open_count(), self.store.open_bytes, self.partitions.assigned
        )
        self.stats.paused = self.back_pressure.paused
        if self.periodic["broker"].due(mono):
            self.broker.check(mono, self.store.open_count())
        if self.periodic["progress"].due(mono):
            self._progress(mono)
        if self.config.heartbeat_file and self.periodic["heartbeat"].due(mono):
            with open(self.config.heartbeat_file, "a"):
                os.utime(self.config.heartbeat_file)
        self._publish_snapshot()

    def _decide(self, rec: Record, now_ms: int) -> list[Outcome]:
        """The window store's decision for one input record (decoded and judged in core)."""
        return self.store.take(input_record(rec), now_ms)

    def _accept_batch(self, records: Sequence[Record], now_ms: int) -> None:
        """Hold, decide and route each record of one partition's poll batch, in order, until the dead-letter
        limit stops the worker; the lookups and counters are per batch, not per record."""
        router, take, ledger = self.router, self.store.take_batch, self.ledger
        accepted, count = 0, len(records)
        try:
            # The store takes records until one decides something; most only join their window.
            while accepted < count:
                if router.limit_exceeded is not None:  # the rest stays uncommitted, for after the fix
                    self._stop.set()
                    break
                accepted, outcomes = take(records, accepted, now_ms, ledger)
                router.route(outcomes)
        finally:
            self.stats.records_in += accepted
            self.cadence.uncommitted += accepted

    def _partition_for(self, topic: str, key: bytes) -> int | None:
        assert self._delivery is not None  # the router runs only once the loop has its delivery
        return self._delivery.producer.partition_for(topic, key)

    def _send(self, outs: list[OutputRecord]) -> None:
        assert self._delivery is not None
        self._delivery.send(outs)
        self.cadence.outputs += len(outs)

    # ---- commit --------------------------------------------------------------------------------
    def _commit(self, timeout: float | None = None) -> None:
        assert self._delivery is not None
        started = time.monotonic()
        self.cadence.committed(started)
        try:
            committed = self._delivery.commit(self.partitions.active, timeout)
            self.cadence.finished(time.monotonic())
        except CommitAborted as exc:
            self._aborted(exc)
            return
        if self.metrics is not None and (committed or self.router.published_ts):  # idle ticks are not commits
            self.metrics.observe_commit(time.monotonic() - started, self.router.published_ts,
                                        int(self.clock() * 1000))
        self.router.published_ts = []
        self.stats.count(self.outcomes)
        if committed:
            self.stats.commits += 1
            log_event(log, "commit", logging.DEBUG, ms=f"{(time.monotonic() - started) * 1000:.1f}",
                      offsets=",".join(f"{p}:{o}" for p, o in sorted(committed.items())))

    def _aborted(self, exc: CommitAborted) -> None:
        """The open transaction was aborted: everything since the last commit is read and routed again."""
        self.stats.aborts += 1
        self.outcomes.clear()  # routed again after the restore, and counted then
        self.router.published_ts = []  # re-processed after the restore, and observed then
        log_event(log, "commit.aborted", logging.WARNING, error=str(exc),
                  action="restoring every assigned partition from the last commit")
        self._restore_all_later()

    def close(self, *, leave: bool = True) -> None:
        """Commit what is resolved, close the clients; with --leave-group-on-stop and `leave`, then leave the
        group at once (stream/worker/leave.py)."""
        log_event(log, "worker.stopping", open_windows=self.store.open_count())
        self._publish_snapshot()
        committed = False
        try:
            if self._delivery is not None:
                self._commit(timeout=self.config.shutdown_timeout_s)
            committed = True  # or aborted, to be re-read from the last commit; not fenced nor refused
        finally:
            if self._consumer is not None:
                self._consumer.close()
                if leave and committed and self.config.leave_group_on_stop and self.instance_id:
                    leave_group(self.client, self.conn, self.config.group_id, self.instance_id)
            if self._delivery is not None:
                self._delivery.close(timeout=self.config.shutdown_timeout_s)
            log_event(log, "worker.stopped", open_windows_left_uncommitted=self.store.open_count(),
                      **self.stats.summary())

    # ---- rebalance (the consumer calls these inside poll) and restore ---------------------------
    def on_revoked(self, partitions: set[int]) -> None:
        """Commit what is processed before the partitions may move."""
        if not partitions or self._delivery is None:
            return
        committed = True
        try:
            self._delivery.commit_on_revoke(self.partitions.active)
        except CommitAborted as exc:
            log_event(log, "commit.on_revoke_aborted", logging.WARNING, error=str(exc))
            committed = False
        except Exception as exc:  # at-least-once: the next owner re-reads from the last commit
            log_event(log, "commit.on_revoke_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            committed = False
        if committed:
            self.stats.count(self.outcomes)
        elif self.eos:
            self.outcomes.clear()
        self.partitions.revoked(partitions, committed=committed)
        log_event(log, "partitions.revoked", partitions=",".join(map(str, sorted(partitions))))

    def on_assigned(self, partitions: set[int]) -> None:
        drop, new = self.partitions.assign(partitions)
        for p in drop:
            self._drop(p)
        log_event(log, "partitions.assigned", topic=self.config.topics.input,
                  partitions=",".join(map(str, sorted(partitions))), new=",".join(map(str, sorted(new))))

    def on_lost(self, partitions: set[int]) -> None:
        for p in partitions:
            self._drop(p)
        self.partitions.lose(partitions)
        log_event(log, "partitions.lost", logging.WARNING, partitions=",".join(map(str, sorted(partitions))))
        if self.eos and self._delivery is not None and self._delivery.open:
            # Lost while this worker was stalled or cut off: the new owner produces these outputs again, so
            # the open transaction must never commit (after a rejoin its offsets would pass the generation
            # check).
            self._delivery.abort(
                CommitAborted(f"partitions {','.join(map(str, sorted(partitions)))} were lost")
            )
            self.stats.aborts += 1
            self.outcomes.clear()
            self._restore_all_later()

    def _drop(self, partition: int) -> None:
        """Forget a partition's windows; its uncommitted records are re-read by whoever owns it next."""
        self.store.drop_partition(partition)
        self.ledger.forget(partition)
        if self._delivery is not None:
            self._delivery.forget(partition)

    def _restore_all_later(self) -> None:
        for p in self.partitions.assigned:
            self._drop(p)
        self.partitions.restore_all()

    def _restore_each(self, partitions: list[int], now: float) -> None:
        """Restore each partition; one that meets a retriable broker failure (a leader or coordinator still
        moving after a broker restart) stays to restore and is tried again a moment later."""
        for p in partitions:
            try:
                self._restore(p)
            except KafkaFailure as exc:
                if not exc.retriable:
                    raise
                self._restore_after = now + RESTORE_RETRY_S
                log_event(log, "partition.restore_failed", logging.WARNING, partition=p, error=str(exc),
                          action=f"restoring it again in {RESTORE_RETRY_S:g} s; its records wait until then")

    def _restore(self, p: int) -> None:
        done = self.restorer.restore(p)
        if isinstance(self._delivery, ExactlyOnce):
            self._delivery.restored(p, done.resume_at)
        self.partitions.restored(p)
        self.stats.restores += 1
        self.stats.restored_records += done.reread
        log_event(log, "partition.restored", partition=p, closed_groups=done.closed_groups,
                  changelog_records=done.changelog_records, committed_offset=done.committed_offset,
                  resume_at=done.resume_at, reread=done.reread,
                  open_windows=sum(1 for k in self.store.open if k[0] == p), ms=f"{done.seconds * 1000:.0f}")

    # ---- where the input stands ----------------------------------------------------------------
    def _positions(self) -> dict[int, tuple[int, int]]:
        """(next offset to read, last known high watermark) of every partition that delivered records."""
        out: dict[int, tuple[int, int]] = {}
        if self._consumer is None:
            return out
        for p in list(self.partitions.assigned):
            next_offset = self.ledger.next_offset(p)
            if next_offset is None:
                continue  # nothing read since assignment, so no window can be open there
            tp = TopicPartition(self.config.topics.input, p)
            high = self._consumer.highwater(tp)
            if high is not None:
                out[p] = (max(next_offset, self._consumer.fetch_position(tp)), high)
        return out

    def _read_up(self) -> set[int]:
        """Partitions whose fetched backlog is read: only there may the wall clock expire a group."""
        return {p for p, (pos, high) in self._positions().items() if pos >= high}

    def _expiry_blocked(self) -> str:
        """Partitions with open windows the wall clock may not expire although nothing is left to read there,
        and why: for the progress line (a group that never expires never reaches the dead-letter topic)."""
        if self.back_pressure.paused:
            return "all:paused"
        positions, blocked = self._positions(), []
        for p in sorted({k[0] for k in self.store.open}):
            if p not in self.partitions.assigned:
                blocked.append(f"{p}:not_assigned")
            elif self.ledger.next_offset(p) is None:
                blocked.append(f"{p}:nothing_read")
            elif p not in positions:
                blocked.append(f"{p}:no_watermark")
        return ",".join(blocked)

    def partition_lag(self) -> dict[int, int]:
        """Records between each partition's next offset and its last known high watermark."""
        return {p: max(0, high - pos) for p, (pos, high) in self._positions().items()}

    def lag(self) -> int:
        return sum(self.snapshot.lag.values())

    def _publish_snapshot(self) -> None:
        self.snapshot = Snapshot(
            self.stats,
            self.store.open_count(),
            self.store.open_bytes,
            len(self.store.closed),
            self.partitions.ready,
            self.partition_lag(),
            self.router.dead_letters.ratio,
            self.last_tick,
        )

    def _progress(self, mono: float) -> None:
        t0, n0 = self._progress_base
        rate = (self.stats.samples_published - n0) / max(mono - t0, 1e-9)
        self._progress_base = (mono, self.stats.samples_published)
        fields: dict[str, Any] = dict(
            groups_published=self.stats.groups_published,
            groups_uncommitted=self.outcomes.groups_published,  # in the open transaction
            samples_per_s=f"{rate:.1f}",
            dead_lettered=",".join(f"{k}:{v}" for k, v in sorted(self.stats.dead_lettered.items())) or "0",
            duplicates=self.stats.duplicates,
            open_windows=self.store.open_count(),
            open_bytes=self.store.open_bytes,
            lag=sum(self.partition_lag().values()),
            commits=self.stats.commits,
        )
        if blocked := self._expiry_blocked():
            fields["expiry_blocked"] = blocked
        log_event(log, "progress", **fields)
