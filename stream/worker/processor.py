"""Everything the worker does with the records of the partitions it is assigned, top to bottom:

    process(batch)  restore what needs it → take each partition's records into the window store (core) →
                    hold them in the offset ledger → route each outcome (routing.py: the records to write) →
                    send them (delivery.py) → expire groups past their deadline → commit when due
    commit()        through the delivery: the ledger's resolved positions and the closed-group changes
    revoke/assign/lose  what a rebalance changes (partitions.py), restores from the changelog (restore.py)

The processor owns the window store, the offset ledger, the router and the delivery. The ledger is lent
for one call, never held: to the store's `take_batch` (which holds each record it takes), to the delivery
with the store's closed-group changes for each commit, to the restorer with the store for each restore.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from rollout_stream.config import WorkerConfig
from rollout_stream.core.offsets import OffsetLedger
from rollout_stream.core.records import Outcome
from rollout_stream.core.windows import WindowStore
from rollout_stream.kafka import GroupConsumer, Record, TopicPartition
from rollout_stream.logs import log_event
from rollout_stream.worker.admission import SILENT, AdmissionResolver
from rollout_stream.worker.cadence import CommitCadence, caught_up
from rollout_stream.worker.delivery import CommitAborted, Delivery
from rollout_stream.worker.partitions import Partitions
from rollout_stream.worker.periodic import Every
from rollout_stream.worker.restore import Restorer
from rollout_stream.worker.routing import Router
from rollout_stream.worker.stats import LoopObserver, OutcomeCounts, WorkerStats

__all__ = ["Processor"]

log = logging.getLogger("rollout_stream.worker")


class Processor:
    """The assigned partitions' state and the route of their records from a poll to a commit."""

    def __init__(self, config: WorkerConfig, stats: WorkerStats, clock: Callable[[], float]) -> None:
        self.config, self.stats, self.clock = config, stats, clock
        self.store = WindowStore(config.windows)
        self.ledger = OffsetLedger()
        self.partitions = Partitions(restores=False)  # as the delivery says, once `start` gives it
        self.cadence = CommitCadence(config.commit_interval_s, config.commit_max_records)
        self.outcomes = OutcomeCounts()  # routed since the last commit; in self.stats once committed
        self.router = Router(config, config.windows.reward, self.outcomes)
        self.metrics: LoopObserver | None = None
        self.consumer: GroupConsumer | None = None  # the Kafka side, given by `start`
        self.delivery: Delivery | None = None
        self.restorer: Restorer | None = None
        self.resolver = SILENT  # what the admission log hears of groups that will never train
        self._expire = Every(0.2)

    def start(self, consumer: GroupConsumer, delivery: Delivery, restorer: Restorer, now: float,
              resolver: AdmissionResolver = SILENT) -> None:
        self.consumer, self.delivery, self.restorer, self.resolver = consumer, delivery, restorer, resolver
        self.partitions.restores = delivery.restores
        self.cadence.committed(now)

    # ---- a poll's records ----------------------------------------------------------------------
    def process(self, batch: Mapping[TopicPartition, Sequence[Record]], started: float, *, paused: bool
                ) -> float:
        """Restore what needs it, take and route each active partition's records, expire what is due (not
        while `paused`: the high watermarks are stale, members may wait behind the pause), commit when due.
        Returns the monotonic time after it."""
        assert self.consumer is not None
        skip = set(self.partitions.to_restore)  # fetched before the restore: they are read again after it
        if skip - self.partitions.leaving:
            self._restore(sorted(skip - self.partitions.leaving), started)
        now_ms = int(self.clock() * 1000)
        active = self.partitions.active
        try:
            for tp, records in batch.items():
                if tp.partition in skip or tp.partition not in active:
                    if records and tp.partition not in skip and tp.partition in self.partitions.assigned:
                        self.partitions.passed_over(tp.partition)  # revoked: read again if it comes back
                    continue
                self._take(records, now_ms)
            mono = time.monotonic()
            if self.metrics is not None and batch:
                self.metrics.observe_batch(mono - started)
            if self._expire.due(mono):
                self._route(self.store.expire(now_ms, set() if paused else self.read_up() & active))
        except CommitAborted as exc:  # a send failed: the rest of this batch is read again after the restore
            self._aborted(exc)
            mono = time.monotonic()
        if self.cadence.due(mono, caught_up=caught_up(self.consumer, sum(map(len, batch.values())))):
            self.commit()
        return mono

    def _take(self, records: Sequence[Record], now_ms: int) -> None:
        """Hold, decide and route each record of one partition's poll batch, in order, until the dead-letter
        limit is exceeded (the rest stays uncommitted, for after the fix); counters per batch, not record."""
        router, take, ledger = self.router, self.store.take_batch, self.ledger
        accepted, count = 0, len(records)
        try:
            # The store takes records until one decides something; most only join their window.
            while accepted < count and router.limit_exceeded is None:
                accepted, outcomes = take(records, accepted, now_ms, ledger)
                self._route(outcomes)
        finally:
            self.stats.records_in += accepted
            self.cadence.uncommitted += accepted

    def _route(self, outcomes: list[Outcome]) -> None:
        """Each outcome's outputs to the delivery, in order; an outcome without any is settled at once."""
        delivery = self.delivery
        assert delivery is not None  # records are taken only once the worker has its delivery
        for outcome in outcomes:
            outs = self.router.route(outcome, delivery.producer.partition_for)
            if outs:
                delivery.send(outs, self.router.head)
                self.cadence.outputs += len(outs)
            else:
                for record in outcome.records:
                    self.ledger.resolve(record.partition, record.offsets)
            self.router.sent(outcome, outs)
            self.resolver.observe(outcome, outs)

    # ---- commit --------------------------------------------------------------------------------
    def commit(self, timeout: float | None = None) -> None:
        assert self.delivery is not None
        started = time.monotonic()
        self.cadence.committed(started)
        try:
            committed = self.delivery.commit(self.ledger, self.store.drain_changes(), self.partitions.active,
                                             timeout)
            self.cadence.finished(time.monotonic())
        except CommitAborted as exc:
            self._aborted(exc)
            return
        self.resolver.committed()
        router = self.router
        if self.metrics is not None and (committed or router.published_ts):  # idle ticks are not commits
            self.metrics.observe_commit(time.monotonic() - started, router.published_ts,
                                        int(self.clock() * 1000))
        router.published_ts = []
        self.stats.count(self.outcomes)
        if committed:
            self.stats.commits += 1
            log_event(log, "commit", logging.DEBUG, ms=f"{(time.monotonic() - started) * 1000:.1f}",
                      offsets=",".join(f"{p}:{o}" for p, o in sorted(committed.items())))

    def _aborted(self, exc: CommitAborted) -> None:
        """The open transaction was aborted: everything since the last commit is read and routed again."""
        self.stats.aborts += 1
        self.outcomes.clear()  # routed again after the restore, and counted then
        self.resolver.aborted()
        self.router.published_ts = []  # re-processed after the restore, and observed then
        log_event(log, "commit.aborted", logging.WARNING, error=str(exc),
                  action="restoring every assigned partition from the last commit")
        self._restore_all_later()

    # ---- rebalance -----------------------------------------------------------------------------
    def revoke(self, partitions: set[int]) -> None:
        """Commit what is processed before the partitions may move."""
        if self.delivery is None:  # not started: nothing was processed
            return
        committed = True
        try:
            self.delivery.commit_on_revoke(self.ledger, self.store.drain_changes(), self.partitions.active)
        except CommitAborted as exc:
            log_event(log, "commit.on_revoke_aborted", logging.WARNING, error=str(exc))
            committed = False
        except Exception as exc:  # at-least-once: the next owner re-reads from the last commit
            log_event(log, "commit.on_revoke_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}")
            committed = False
        if committed:
            self.stats.count(self.outcomes)
        elif self.delivery.restores:  # routed again after the restore, and counted then
            self.outcomes.clear()
        self.partitions.revoked(partitions, committed=committed)
        log_event(log, "partitions.revoked", partitions=_listed(partitions))

    def assign(self, partitions: set[int]) -> None:
        drop, new = self.partitions.assign(partitions)
        for p in drop:
            self._drop(p)
        log_event(log, "partitions.assigned", topic=self.config.topics.input, partitions=_listed(partitions),
                  new=_listed(new))

    def lose(self, partitions: set[int]) -> None:
        for p in partitions:
            self._drop(p)
        self.partitions.lose(partitions)
        log_event(log, "partitions.lost", logging.WARNING, partitions=_listed(partitions))
        if self.delivery is not None and self.delivery.lost(partitions):
            self.stats.aborts += 1
            self.outcomes.clear()
            self._restore_all_later()

    def _drop(self, partition: int) -> None:
        """Forget a partition's windows; its uncommitted records are re-read by whoever owns it next."""
        self.store.drop_partition(partition)
        self.ledger.forget(partition)
        if self.delivery is not None:
            self.delivery.forget(partition)

    def _restore_all_later(self) -> None:
        for p in self.partitions.assigned:
            self._drop(p)
        self.partitions.restore_all()

    def _restore(self, partitions: list[int], now: float) -> None:
        assert self.restorer is not None and self.delivery is not None
        for done in self.restorer.restore_each(partitions, now, self.store, self.ledger):
            self.delivery.restored(done.partition, done.resume_at)
            self.partitions.restored(done.partition)
            self.stats.restores += 1
            self.stats.restored_records += done.reread

    # ---- where the input stands ----------------------------------------------------------------
    def positions(self) -> dict[int, tuple[int, int]]:
        """(next offset to read, last known high watermark) of every partition that delivered records."""
        out: dict[int, tuple[int, int]] = {}
        if self.consumer is None:
            return out
        for p in list(self.partitions.assigned):
            next_offset = self.ledger.next_offset(p)
            if next_offset is None:
                continue  # nothing read since assignment, so no window can be open there
            tp = TopicPartition(self.config.topics.input, p)
            high = self.consumer.highwater(tp)
            if high is not None:
                out[p] = (max(next_offset, self.consumer.fetch_position(tp)), high)
        return out

    def read_up(self) -> set[int]:
        """Partitions whose fetched backlog is read: only there may the wall clock expire a group."""
        return {p for p, (pos, high) in self.positions().items() if pos >= high}


def _listed(partitions: set[int]) -> str:
    return ",".join(map(str, sorted(partitions)))
