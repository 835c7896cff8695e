"""What the worker says about itself, read from its processor after each tick: the snapshot other threads
read (metrics, readiness), each partition's lag, the progress line, the heartbeat file, and whether the
broker can be reached. It only reads the processor: nothing here changes what the worker does."""

from __future__ import annotations

import logging
import os
from typing import Any

from rollout_stream.config import WorkerConfig
from rollout_stream.logs import log_event
from rollout_stream.worker.backpressure import BackPressure
from rollout_stream.worker.broker_watch import BrokerWatch
from rollout_stream.worker.periodic import Every
from rollout_stream.worker.processor import Processor
from rollout_stream.worker.stats import Snapshot

__all__ = ["Observer"]

log = logging.getLogger("rollout_stream.worker")


class Observer:
    def __init__(self, config: WorkerConfig, processor: Processor, back_pressure: BackPressure,
                 broker: BrokerWatch, now: float) -> None:
        self.config, self.processor = config, processor
        self.back_pressure, self.broker = back_pressure, broker
        self._broker = Every(1.0, start=now)
        self._progress = Every(config.progress_interval_s, start=now)
        self._heartbeat = Every(5.0)
        self._progress_base = (now, 0)

    def tick(self, mono: float) -> None:
        """The periodic work of one tick: broker reachability, the progress line, the heartbeat file."""
        if self._broker.due(mono):
            self.broker.check(mono, self.processor.store.open_count())
        if self._progress.due(mono):
            self.progress(mono)
        heartbeat = self.config.heartbeat_file
        if heartbeat and self._heartbeat.due(mono):
            with open(heartbeat, "a"):
                os.utime(heartbeat)

    def snapshot(self, last_tick: float) -> Snapshot:
        """The processor's state now, whole, for other threads to read (one reference swap)."""
        p = self.processor
        store = p.store
        return Snapshot(p.stats, store.open_count(), store.open_bytes, len(store.closed), p.partitions.ready,
                        self.partition_lag(), p.router.dead_letters.ratio, last_tick, len(store.chunks.open))

    def partition_lag(self) -> dict[int, int]:
        """Records between each partition's next offset and its last known high watermark."""
        return {p: max(0, high - pos) for p, (pos, high) in self.processor.positions().items()}

    def expiry_blocked(self) -> str:
        """Partitions with open windows the wall clock may not expire although nothing is left to read there,
        and why: for the progress line (a group that never expires never reaches the dead-letter topic)."""
        if self.back_pressure.paused:
            return "all:paused"
        p = self.processor
        positions, blocked = p.positions(), []
        for partition in sorted({k[0] for k in p.store.open}):
            if partition not in p.partitions.assigned:
                blocked.append(f"{partition}:not_assigned")
            elif p.ledger.next_offset(partition) is None:
                blocked.append(f"{partition}:nothing_read")
            elif partition not in positions:
                blocked.append(f"{partition}:no_watermark")
        return ",".join(blocked)

    def progress(self, mono: float) -> None:
        stats, store = self.processor.stats, self.processor.store
        t0, n0 = self._progress_base
        rate = (stats.samples_published - n0) / max(mono - t0, 1e-9)
        self._progress_base = (mono, stats.samples_published)
        fields: dict[str, Any] = dict(
            groups_published=stats.groups_published,
            groups_uncommitted=self.processor.outcomes.groups_published,  # in the open transaction
            samples_per_s=f"{rate:.1f}",
            dead_lettered=",".join(f"{k}:{v}" for k, v in sorted(stats.dead_lettered.items())) or "0",
            duplicates=stats.duplicates,
            open_windows=store.open_count(),
            open_bytes=store.open_bytes,
            lag=sum(self.partition_lag().values()),
            commits=stats.commits,
        )
        if store.chunks.open:  # values still arriving as chunks: their bytes are in open_bytes
            fields["open_chunked_values"] = len(store.chunks.open)
        if blocked := self.expiry_blocked():
            fields["expiry_blocked"] = blocked
        log_event(log, "progress", **fields)
