"""The worker's driver: connect, poll, hand each poll to the processor, follow rebalances, stop
(docs/architecture.md; docs/spec.md §4.2, §4.5).

    open()   connect the consumer and the producer, give the processor its Kafka side, subscribe
    step()   poll → `Processor.process` (restore, take, route, send, expire, commit when due) → pause or
             resume fetching (`BackPressure`) → `Observer.tick` (broker, progress, heartbeat) → snapshot
    close()  commit what is resolved, close the clients, leave the group when asked to

It is the consumer's rebalance listener and hands each change to the processor.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from rollout_stream.clients import Connection
from rollout_stream.codec import compiled
from rollout_stream.config import WorkerConfig
from rollout_stream.core.offsets import OffsetLedger
from rollout_stream.core.rewards import torch_free_normalization
from rollout_stream.core.windows import WindowStore
from rollout_stream.kafka import Client, GroupConsumer, client_for
from rollout_stream.kafka.topic_wait import wait_for_partitions
from rollout_stream.logs import log_event
from rollout_stream.names import admission_topic, changelog_topic_name
from rollout_stream.worker.admission import AdmissionResolver
from rollout_stream.worker.backpressure import BackPressure
from rollout_stream.worker.broker_watch import BrokerWatch
from rollout_stream.worker.cadence import POLL_RECORDS
from rollout_stream.worker.delivery import open_delivery
from rollout_stream.worker.heads_in_use import refuse_if_heads_in_use
from rollout_stream.worker.instance import InstanceClaim, claim_instance
from rollout_stream.worker.leave import leave_group
from rollout_stream.worker.observer import Observer
from rollout_stream.worker.processor import Processor
from rollout_stream.worker.restore import Restorer
from rollout_stream.worker.routing import DeadLetterLimitExceeded
from rollout_stream.worker.stats import LoopObserver, Snapshot, WorkerStats

__all__ = ["Worker"]

log = logging.getLogger("rollout_stream.worker")


class Worker:
    """Consumes rollout samples, windows them by prompt group, publishes or dead-letters whole groups."""

    def __init__(self, config: WorkerConfig, conn: Connection, *, clock: Callable[[], float] = time.time,
                 claim: InstanceClaim | None = None, client: Client | None = None) -> None:
        self.config, self.conn, self.clock = config, conn, clock
        self.claim = claim  # this worker's instance id, held while it runs (stream/worker/instance.py)
        self.client = client or client_for(conn)
        self.stats = WorkerStats()
        self.processor = Processor(config, self.stats, clock)
        self.torch_free_normalization = torch_free_normalization()  # torch now, not in the first group
        self.changelog_topic = changelog_topic_name(config.group_id, config.topics.input)
        self.snapshot = Snapshot(self.stats)  # as of the last tick, for other threads (metrics)
        self.last_tick = 0.0  # monotonic time of the loop's last iteration (liveness)
        self._stop = threading.Event()
        self._consumer: GroupConsumer | None = None
        self.back_pressure: BackPressure | None = None  # these two once open() has connected
        self.observer: Observer | None = None

    # ---- lifecycle -----------------------------------------------------------------------------
    def observe_with(self, metrics: LoopObserver) -> None:
        """Report batch, commit and latency observations to `metrics`
        (rollout_stream.worker.metrics.LoopMetrics)."""
        self.processor.metrics = metrics
        self.processor.router.track_published = True

    def request_stop(self) -> None:
        self._stop.set()

    def commit_soon(self) -> None:
        """Commit at the next tick instead of the cadence's (e.g. a benchmark that drained its input)."""
        self.processor.cadence.soon()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def ready(self) -> bool:
        """Partitions assigned and every restore done."""
        return self.processor.partitions.ready

    @property
    def instance_id(self) -> str | None:
        return self.claim.instance_id if self.claim is not None else self.config.instance_id

    @property
    def store(self) -> WindowStore:
        return self.processor.store

    @property
    def ledger(self) -> OffsetLedger:
        return self.processor.ledger

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
            # What open() froze is collectable again: a process that goes on after its worker (a test, an
            # embedded stage) keeps nothing past its use, and extensions do not report it leaked at exit.
            gc.unfreeze()
        limit_exceeded = self.processor.router.limit_exceeded
        if limit_exceeded is not None:  # raised after the shutdown committed what came before
            raise DeadLetterLimitExceeded(limit_exceeded, self.config.topics.input,
                                          self.config.topics.dead_letter)

    def open(self) -> bool:
        """Connect, subscribe and get ready to loop; False when stopped before the input topic appeared."""
        cfg = self.config
        refuse_if_heads_in_use(self.client, self.conn.client_id, cfg)  # before anything is published
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
        delivery = open_delivery(cfg, self.client, consumer, client_id=self.conn.client_id,
                                 instance_id=self.instance_id, changelog_topic=self.changelog_topic,
                                 partitions=partitions)
        restorer = Restorer(self.client, consumer, input_topic=cfg.topics.input,
                            changelog_topic=self.changelog_topic, max_record_bytes=cfg.max_record_bytes,
                            clock=self.clock)
        back_pressure = self.back_pressure = BackPressure(
            consumer, cfg.topics.input, max_groups=cfg.max_open_groups, max_bytes=cfg.max_open_bytes)
        consumer.subscribe(cfg.topics.input, self)
        log_event(log, "worker.started", **{k: v for k, v in cfg.effective().items()
                                            if k not in ("topics", "instance_id", "bootstrap_servers")},
                  instance_id=self.instance_id, bootstrap_servers=self.conn.bootstrap_servers,
                  client=self.client.name, input_topic=cfg.topics.input, output_topic=cfg.topics.output,
                  dead_letter_topic=cfg.topics.dead_letter,
                  security=str(self.conn.security),  # masked: no password or key material
                  changelog_topic=delivery.changelog_topic or "-",
                  torch_free_normalization=self.torch_free_normalization,
                  hot_path=compiled.status().describe())
        now = time.monotonic()
        self.processor.start(consumer, delivery, restorer, now, AdmissionResolver(
            self.conn, self.client, admission_topic(cfg.topics.output), cfg.topics.output))
        broker = BrokerWatch(consumer.connection_count, self.conn.bootstrap_servers)
        self.observer = Observer(cfg, self.processor, back_pressure, broker, now)
        # Everything alive now (torch's objects above all) lives as long as the process: leave it out of the
        # collector's full passes, each of which would otherwise stop the loop to scan it.
        gc.freeze()
        return True

    def _await_topic(self, consumer: GroupConsumer, topic: str) -> int:
        """Subscribe only once the topic's partitions are known, or the first assignment can come up empty."""
        return len(wait_for_partitions(consumer.partitions_for_topic, topic, self._stop, log,
                                       hint="create it with `rollout-stream topics create`"))

    # ---- one tick ------------------------------------------------------------------------------
    def step(self) -> None:
        """One iteration: poll, process, pause or resume fetching, report."""
        consumer, processor, back_pressure = self._consumer, self.processor, self.back_pressure
        assert consumer is not None and back_pressure is not None and self.observer is not None
        batch = consumer.poll(processor.cadence.poll_timeout_ms(time.monotonic()) / 1000, POLL_RECORDS)
        self.last_tick = started = time.monotonic()
        mono = processor.process(batch, started, paused=back_pressure.paused)
        if processor.router.limit_exceeded is not None:  # the rest stays unread, for after the fix
            self._stop.set()
        store = processor.store
        back_pressure.check(mono, store.open_count(), store.open_bytes, processor.partitions.assigned)
        self.stats.paused = back_pressure.paused
        self.observer.tick(mono)
        self.snapshot = self.observer.snapshot(self.last_tick)

    def close(self, *, leave: bool = True) -> None:
        """Commit what is resolved, close the clients; with --leave-group-on-stop and `leave`, then leave the
        group at once (stream/worker/leave.py)."""
        processor = self.processor
        log_event(log, "worker.stopping", open_windows=processor.store.open_count())
        if self.observer is not None:
            self.snapshot = self.observer.snapshot(self.last_tick)
        committed = False
        try:
            if processor.delivery is not None:
                processor.commit(timeout=self.config.shutdown_timeout_s)
            committed = True  # or aborted, to be re-read from the last commit; not fenced nor refused
        finally:
            if self._consumer is not None:
                self._consumer.close()
                if leave and committed and self.config.leave_group_on_stop and self.instance_id:
                    leave_group(self.client, self.conn, self.config.group_id, self.instance_id)
            if processor.delivery is not None:
                processor.delivery.close(timeout=self.config.shutdown_timeout_s)
            processor.resolver.close()
            log_event(log, "worker.stopped", open_windows_left_uncommitted=processor.store.open_count(),
                      **self.stats.summary())

    # ---- rebalance (the consumer calls these inside poll): the processor's to handle ------------
    def on_revoked(self, partitions: set[int]) -> None:
        if partitions:
            self.processor.revoke(partitions)

    def on_assigned(self, partitions: set[int]) -> None:
        self.processor.assign(partitions)

    def on_lost(self, partitions: set[int]) -> None:
        self.processor.lose(partitions)
