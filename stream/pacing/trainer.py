"""The trainer's side of pacing: rank 0 of a TrainDataReader says where its trainer group is.

Its state changes in the trainer's thread (a batch taken, a weight version set, a commit); the record is
written from a thread of its own, so the training loop never waits on Kafka for it and a progress topic
that cannot be written (no ACL) costs one warning, not the training run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable

import msgspec

from codec.progress import TrainerProgress
from core.assembly import AssembledGroup
from stream.clients import Connection
from stream.kafka import KafkaFailure
from stream.logs import log_event
from stream.pacing.progress import ProgressWriter, now_ms

__all__ = ["TrainerProgressPublisher"]

log = logging.getLogger("rollout_stream.pacing")


class TrainerProgressPublisher:
    def __init__(self, conn: Connection, topic: str, group_id: str, *, groups_per_batch: int,
                 max_weight_staleness: int | None, heartbeat_s: float = 5.0) -> None:
        self.conn, self.topic, self.heartbeat_s = conn, topic, heartbeat_s
        self._lock = threading.Lock()
        self._record = TrainerProgress(
            group_id=group_id, weight_version=None, groups_per_batch=groups_per_batch,
            max_weight_staleness=max_weight_staleness, batch=None, batch_version=None, consumed_groups=0,
            skipped_stale_groups=0, consumed_through={}, updated_ms=now_ms())
        self._through: dict[str, dict[int, int]] = {}
        self._lags: dict[int, int] = {}
        self._rate: deque[tuple[float, int]] = deque([(time.monotonic(), 0)])  # (when, accepted tokens)
        self._dirty = threading.Event()
        self._dirty.set()  # the first record says the trainer is there
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"progress-{group_id}", daemon=True)
        self._thread.start()

    @property
    def record(self) -> TrainerProgress:
        return self._record

    def weight_version(self, version: int, skipped_stale: int) -> None:
        self._update(weight_version=version, skipped_stale_groups=skipped_stale)

    def consumed(self, taken: Iterable[AssembledGroup], trained: Iterable[AssembledGroup], batch: int,
                 version: int | None, skipped_stale: int) -> None:
        """Groups taken into batch `batch` (`taken`: trained or skipped; `trained`: those that train), judged
        against `version`."""
        count = 0
        for group in taken:
            count += 1
            for s in group.samples:
                parts = self._through.setdefault(s.source_topic, {})
                if s.source_offset > parts.get(s.source_partition, -1):
                    parts[s.source_partition] = s.source_offset
        groups = tokens = 0
        for group in trained:
            groups += 1
            tokens += sum(len(s.sample.tokens) if s.sample.tokens is not None else 0 for s in group.samples)
            if version is not None and group.oldest_version is not None:
                lag = version - group.oldest_version
                self._lags[lag] = self._lags.get(lag, 0) + 1
        r = self._record
        self._rate.append((time.monotonic(), r.accepted_tokens + tokens))
        while len(self._rate) > 2 and self._rate[-1][0] - self._rate[1][0] >= 60:
            self._rate.popleft()
        (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
        self._update(batch=batch, batch_version=version, consumed_groups=r.consumed_groups + count,
                     skipped_stale_groups=skipped_stale, trained_groups=r.trained_groups + groups,
                     accepted_tokens=r.accepted_tokens + tokens,
                     tokens_per_s=round((n1 - n0) / (t1 - t0), 1) if t1 > t0 else 0.0,
                     lag_counts=dict(self._lags),
                     consumed_through={t: dict(p) for t, p in self._through.items()})

    def doomed(self, through: dict[str, dict[int, int]]) -> None:
        """Queued groups that will be skipped (`core.pacing.doomed_through`): producers may stop counting
        them now, before the batch that skips them completes."""
        merged = {t: dict(p) for t, p in self._through.items()}
        for topic, parts in through.items():
            mine = merged.setdefault(topic, {})
            for p, offset in parts.items():
                if offset > mine.get(p, -1):
                    mine[p] = offset
        if merged != self._record.consumed_through:
            self._update(consumed_through=merged)

    def publish(self) -> None:
        """Write the current state now (e.g. after a commit), not only on the next change."""
        self._update()

    def _update(self, **changes: object) -> None:
        with self._lock:
            self._record = msgspec.structs.replace(self._record, **changes, updated_ms=now_ms())
        self._dirty.set()

    def _run(self) -> None:
        try:
            writer = ProgressWriter(self.conn, self.topic, heartbeat_s=self.heartbeat_s)
        except KafkaFailure as exc:
            log_event(log, "progress.unavailable", logging.WARNING, topic=self.topic,
                      error=f"{type(exc).__name__}: {exc}", effect="paced producers cannot see this trainer")
            return
        try:
            while True:
                self._dirty.wait(0.5)
                stopping = self._stop.is_set()  # what was set before close() is still written
                if self._dirty.is_set():
                    self._dirty.clear()
                    with self._lock:
                        record = self._record
                    writer.publish(record)
                if stopping:
                    break
        except KafkaFailure as exc:
            log_event(log, "progress.write_failed", logging.WARNING, topic=self.topic,
                      error=f"{type(exc).__name__}: {exc}")
        finally:
            writer.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
