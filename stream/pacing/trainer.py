"""The trainer's side of pacing: rank 0 of a TrainDataReader says where its trainer group is.

Two records: a `TrainerMark` on the admission log (the groups it consumed, by key and batch, and its
versions: what the admission rule folds) and a `TrainerProgress` on the progress topic (what `lag` and the
metrics show). Its state changes in the trainer's thread (a batch taken, a weight version set, a commit);
both are written from a thread of its own, so the training loop never waits on Kafka for them and a topic
that cannot be written (no ACL) costs one warning, not the training run.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping

import msgspec

from rollout_stream.clients import Connection
from rollout_stream.codec.admission import TrainerMark
from rollout_stream.codec.progress import TrainerProgress
from rollout_stream.core.assembly import AssembledGroup
from rollout_stream.kafka import Client, KafkaFailure
from rollout_stream.logs import log_event
from rollout_stream.pacing.admission_log import AdmissionWriter, ensure_admission_topic
from rollout_stream.pacing.progress import ProgressWriter, now_ms

__all__ = ["TrainerProgressPublisher"]

log = logging.getLogger("rollout_stream.pacing")

MARK_EVERY_S = 1.0  # a mark at least this often: the admission log's clock, by which leases run out
MARK_BATCHES = 64  # uncommitted batches a mark lists at most (earlier marks listed the older ones)


class TrainerProgressPublisher:
    def __init__(self, conn: Connection, topic: str, group_id: str, *, groups_per_batch: int,
                 max_weight_staleness: int | None, heartbeat_s: float = 5.0,
                 admission_topic: str | None = None, client: Client | None = None,
                 waits_for_every_partition: bool = False) -> None:
        """Rank 0's reports for paced producers and `lag`: progress records on `topic` and marks on
        `admission_topic`, written by a thread; `client`: the seam's client (default: the connection's);
        `waits_for_every_partition`: the reader's `partition_idle_ms` is None (paced producers refuse it)."""
        self.conn, self.topic, self.heartbeat_s, self.client = conn, topic, heartbeat_s, client
        self.admission_topic = admission_topic
        self._mark = TrainerMark(trainer=group_id, session=uuid.uuid4().hex[:12], weight_version=None,
                                 batch_version=None, batches=0, groups_per_batch=groups_per_batch,
                                 max_weight_staleness=max_weight_staleness,
                                 waits_for_every_partition=waits_for_every_partition)
        self._resumed = False  # no mark before the reader knows where it resumed: the first one says it
        self._marked_through = -1  # the highest batch a written mark listed
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

    def resumed(self, next_batch: int) -> None:
        """The reader resumed; its next batch has index `next_batch` (what it had not committed before
        counts again for paced producers)."""
        with self._lock:
            self._mark = msgspec.structs.replace(self._mark, batches=next_batch, resumed_from=next_batch,
                                                 committed_batch=next_batch)
            self._resumed = True
        self._dirty.set()

    def weight_version(self, version: int, skipped_stale: int) -> None:
        with self._lock:
            self._mark = msgspec.structs.replace(self._mark, weight_version=version)
        self._update(weight_version=version, skipped_stale_groups=skipped_stale)

    def consumed(self, taken: Iterable[AssembledGroup], trained: Iterable[AssembledGroup], batch: int,
                 version: int | None, skipped_stale: int,
                 excluded: Mapping[str, tuple[int, int]] | None = None) -> None:
        """Groups taken into batch `batch` (`taken`: trained or skipped; `trained`: those that train), judged
        against `version`; `excluded`: per group key that trains, the rollouts and loss tokens staleness by
        rollout or token left out of it."""
        count = 0
        keys = []
        for group in taken:
            count += 1
            keys.append(group.key)
            for s in group.samples:
                parts = self._through.setdefault(s.source_topic, {})
                if s.source_offset > parts.get(s.source_partition, -1):
                    parts[s.source_partition] = s.source_offset
        groups = tokens = 0
        trained_keys: set[str] = set()
        for group in trained:
            groups += 1
            trained_keys.add(group.key)
            tokens += sum(len(s.sample.tokens) if s.sample.tokens is not None else 0 for s in group.samples)
            if version is not None and group.oldest_version is not None:
                lag = version - group.oldest_version
                self._lags[lag] = self._lags.get(lag, 0) + 1
        with self._lock:
            consumed = {**self._mark.consumed, batch: keys}
            if len(consumed) > MARK_BATCHES:
                consumed = dict(sorted(consumed.items())[-MARK_BATCHES:])
            # the prompt fold (docs/loop.md) re-issues a prompt whose group a committed batch skipped
            skipped = {b: k for b, k in self._mark.skipped.items() if b in consumed}
            if missed := [k for k in keys if k not in trained_keys]:
                skipped[batch] = missed
            left_out = {b: k for b, k in self._mark.excluded.items() if b in consumed}
            if excluded:  # groups that train, by the reader's word
                left_out[batch] = {k: [r, t] for k, (r, t) in excluded.items()}
            done = set(keys)
            self._mark = msgspec.structs.replace(
                self._mark, consumed=consumed, skipped=skipped, excluded=left_out, batches=batch + 1,
                batch_version=version, doomed=[k for k in self._mark.doomed if k not in done])
        r = self._record
        self._rate.append((time.monotonic(), r.accepted_tokens + tokens))
        while len(self._rate) > 2 and self._rate[-1][0] - self._rate[1][0] >= 60:
            self._rate.popleft()
        (t0, n0), (t1, n1) = self._rate[0], self._rate[-1]
        rollouts_out = sum(r_ for r_, _ in (excluded or {}).values())
        tokens_out = sum(t for _, t in (excluded or {}).values())
        self._update(batch=batch, batch_version=version, consumed_groups=r.consumed_groups + count,
                     skipped_stale_groups=skipped_stale, trained_groups=r.trained_groups + groups,
                     stale_rollouts=r.stale_rollouts + rollouts_out, stale_tokens=r.stale_tokens + tokens_out,
                     accepted_tokens=r.accepted_tokens + tokens,
                     tokens_per_s=round((n1 - n0) / (t1 - t0), 1) if t1 > t0 else 0.0,
                     lag_counts=dict(self._lags),
                     consumed_through={t: dict(p) for t, p in self._through.items()})

    def doomed(self, through: dict[str, dict[int, int]], keys: Iterable[str] = ()) -> None:
        """Queued groups that will be skipped (`rollout_stream.core.pacing.doomed_through`; `keys`: every one
        of them): producers may stop counting them now, before the batch that skips them completes."""
        with self._lock:
            known = set(self._mark.doomed)
            fresh = [k for k in keys if k not in known]
            if fresh:
                self._mark = msgspec.structs.replace(self._mark, doomed=[*self._mark.doomed, *fresh])
                self._dirty.set()
        merged = {t: dict(p) for t, p in self._through.items()}
        for topic, parts in through.items():
            mine = merged.setdefault(topic, {})
            for p, offset in parts.items():
                if offset > mine.get(p, -1):
                    mine[p] = offset
        if merged != self._record.consumed_through:
            self._update(consumed_through=merged)

    def publish(self, committed_batch: int | None = None) -> None:
        """Write the current state now (e.g. after a commit: batches before `committed_batch` are committed),
        not only on the next change."""
        if committed_batch is not None:
            with self._lock:
                # a batch no mark has listed yet stays listed: the fold learns its keys with the commit
                keep = min(committed_batch, self._marked_through + 1)
                consumed = {b: k for b, k in self._mark.consumed.items() if b >= keep}
                skipped = {b: k for b, k in self._mark.skipped.items() if b >= keep}
                self._mark = msgspec.structs.replace(self._mark, consumed=consumed, skipped=skipped,
                                                     committed_batch=committed_batch)
        self._update()

    def _update(self, **changes: object) -> None:
        with self._lock:
            self._record = msgspec.structs.replace(self._record, **changes, updated_ms=now_ms())
        self._dirty.set()

    def _run(self) -> None:
        writer: ProgressWriter | None = None
        try:
            writer = ProgressWriter(self.conn, self.topic, heartbeat_s=self.heartbeat_s, client=self.client)
        except KafkaFailure as exc:
            log_event(log, "progress.unavailable", logging.WARNING, topic=self.topic,
                      error=f"{type(exc).__name__}: {exc}", effect="`lag` and the metrics cannot show it")
        marks = self._mark_writer()
        last_mark = retry_marks = 0.0
        try:
            while True:
                self._dirty.wait(min(0.5, MARK_EVERY_S))
                stopping = self._stop.is_set()  # what was set before close() is still written
                dirty = self._dirty.is_set()
                if dirty:
                    self._dirty.clear()
                    with self._lock:
                        record = self._record
                    if writer is not None:
                        writer.publish(record)
                if marks is None and self.admission_topic is not None and time.monotonic() >= retry_marks:
                    retry_marks = time.monotonic() + 5.0
                    marks = self._mark_writer()
                if marks is not None and (dirty or time.monotonic() - last_mark >= MARK_EVERY_S):
                    with self._lock:
                        mark = self._mark if self._resumed else None
                    if mark is not None:
                        last_mark = time.monotonic()
                        try:
                            marks.send(mark)
                            with self._lock:
                                self._marked_through = max(self._marked_through, *mark.consumed, -1)
                        except KafkaFailure as exc:  # cumulative: the next mark says it again
                            log_event(log, "admission.mark_failed", logging.WARNING,
                                      topic=self.admission_topic, error=f"{type(exc).__name__}: {exc}")
                if stopping:
                    break
        except KafkaFailure as exc:
            log_event(log, "progress.write_failed", logging.WARNING, topic=self.topic,
                      error=f"{type(exc).__name__}: {exc}")
        finally:
            if writer is not None:
                writer.close()
            if marks is not None:
                marks.close()

    def _mark_writer(self) -> AdmissionWriter | None:
        if self.admission_topic is None:
            return None
        try:
            ensure_admission_topic(self.conn, self.admission_topic, self.client)
            return AdmissionWriter(self.conn, self.admission_topic, self.client)
        except KafkaFailure as exc:
            log_event(log, "admission.unavailable", logging.WARNING, topic=self.admission_topic,
                      error=f"{type(exc).__name__}: {exc}",
                      effect="paced producers cannot see this trainer; trying again in 5 s")
            return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
