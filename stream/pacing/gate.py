"""The producer's side of pacing: count its groups until the trainer consumed them, and wait for room.

`AdmissionGate` is what `RolloutProducer(..., max_policy_lag=k, max_unconsumed_groups=n)` uses. It reads
the trainer's progress from a `ProgressBoard`, counts this producer's groups exactly (`core.pacing` rule),
adds the outstanding counts other paced producers of the same trainer group published, and applies
`core.pacing.admission` (docs/pacing.md).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field

from codec.progress import ProducerProgress, TrainerProgress
from core.pacing import Admission, PacingLimits, admission, is_consumed, next_batch_version
from stream.clients import Connection
from stream.errors import RuntimeFailure
from stream.kafka import KafkaFailure, SendFuture
from stream.pacing.progress import ProgressBoard, ProgressWriter, now_ms

__all__ = ["AdmissionGate", "PacingError", "PacingStats", "PacingTimeout", "WeightsTooOld"]


class PacingError(RuntimeFailure):
    """A paced producer cannot start a group."""


class PacingTimeout(PacingError, TimeoutError):
    """`admit` waited its whole timeout without room behind the trainer (the message says why)."""


class WeightsTooOld(PacingError, ValueError):
    """The weight version asked for is more than max_policy_lag behind the trainer: waiting cannot help."""


@dataclass
class PacingStats:
    admitted: int = 0
    waits: int = 0  # admissions that had to wait
    wait_s: float = 0.0  # total time spent waiting in admit
    max_wait_s: float = 0.0


@dataclass
class _Group:
    """One of this producer's groups: its records' futures, then where the last one landed."""

    futures: list[SendFuture] = field(default_factory=list)  # sent, not yet looked at
    partition: int | None = None
    high: int = -1  # the highest offset written so far

    @property
    def last_offset(self) -> int | None:
        """Where its last record landed, once every record sent so far is written."""
        return None if self.futures or self.high < 0 else self.high


class AdmissionGate:
    """Admission of new prompt groups for one producer, paced to one trainer group."""

    def __init__(self, conn: Connection, *, topic: str, progress_topic: str, trainer_group: str,
                 limits: PacingLimits, producer_id: str | None = None, stale_after_s: float = 60.0,
                 heartbeat_s: float = 2.0) -> None:
        self.topic, self.trainer_group, self.limits = topic, trainer_group, limits
        self.progress_topic = progress_topic
        self.producer_id = producer_id or f"producer-{uuid.uuid4().hex[:12]}"
        self.stale_after_s = stale_after_s
        self.stats = PacingStats()
        self._lock = threading.RLock()
        self._groups: dict[bytes, _Group] = {}
        self._started = 0  # distinct groups sent since this producer started
        self._through: dict[int, int] = {}  # the trainer's consumed watermark, never moving back
        self._newest: int | None = None
        self._waiting = False
        self._writer = ProgressWriter(conn, progress_topic, heartbeat_s=heartbeat_s,  # creates the topic
                                      refresh=self.progress)
        self._board = ProgressBoard(conn, progress_topic)
        self._board.wait_caught_up(10.0)  # a fresh producer knows where the trainer is before its first admit

    # ---- what send() tells the gate -------------------------------------------------------------
    def sending(self) -> threading.RLock:
        """Held while a whole group is sent: a count taken between two of its records judged the group by
        the first one's offset and let it count as consumed a batch early (docs/pacing.md)."""
        return self._lock

    def sent(self, key: bytes, future: SendFuture) -> None:
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group()
                self._started += 1
            group.futures.append(future)  # its end is unknown again until this one is written

    # ---- the count -------------------------------------------------------------------------------
    def _trainer(self) -> TrainerProgress | None:
        trainer = self._board.trainer(self.trainer_group)
        if trainer is not None:
            for p, offset in trainer.consumed_through.get(self.topic, {}).items():
                if offset > self._through.get(p, -1):
                    self._through[p] = offset
        return trainer

    def own_outstanding(self) -> int:
        """This producer's groups admitted and not yet consumed: sent ones until the trainer's watermark
        passes their last record, plus those admitted and not sent yet."""
        with self._lock:
            self._trainer()
            poked = False
            for key, group in list(self._groups.items()):
                if group.futures:
                    pending = [f for f in group.futures if not f.done()]
                    if pending and not poked:
                        poked = True  # one short wait serves every delivery report (librdkafka needs a poll)
                        try:
                            pending[-1].get(0.005)
                        except KafkaFailure:
                            pass  # not acknowledged yet, or failed: looked at below
                    if not all(f.done() for f in group.futures):
                        continue
                    written = [f.get(0) for f in group.futures if f.exception() is None]
                    if not written and group.high < 0:  # every send failed: flush() raises it; nothing
                        del self._groups[key]  # will be consumed
                        continue
                    if written:
                        group.partition = written[0].partition
                        group.high = max(group.high, max(w.offset for w in written))
                    group.futures = []
                if is_consumed(group.partition, group.last_offset, self._through):
                    del self._groups[key]
            generating = max(0, self.stats.admitted - self._started)
            return len(self._groups) + generating

    def others_outstanding(self) -> int:
        """What the other live paced producers of this trainer group last published."""
        cutoff = now_ms() - self.stale_after_s * 1000
        return sum(p.outstanding for p in self._board.producers()
                   if p.trainer_group == self.trainer_group and p.producer_id != self.producer_id
                   and p.updated_ms >= cutoff)

    def decide(self, weight_version: int) -> tuple[Admission, TrainerProgress | None]:
        with self._lock:
            trainer = self._trainer()
            unconsumed = self.own_outstanding() + self.others_outstanding()
            decision = admission(
                weight_version,
                next_version=None if trainer is None else next_batch_version(
                    trainer.weight_version, trainer.batch_version, self.limits.versions_per_batch,
                    any_batch=trainer.batch is not None, start=weight_version),
                groups_per_batch=trainer.groups_per_batch if trainer is not None else 1,
                unconsumed=unconsumed, limits=self.limits, trainer_known=trainer is not None)
            return decision, trainer

    # ---- admission -------------------------------------------------------------------------------
    def can_admit(self, weight_version: int) -> bool:
        """Whether a group at `weight_version` may start now (does not count it: call `admit`)."""
        return self.decide(weight_version)[0].admitted

    def admit(self, weight_version: int, timeout: float | None = None) -> Admission:
        """Wait until a group at `weight_version` may start and count it as started.

        Raises PacingTimeout after `timeout` seconds without room (None: wait forever), WeightsTooOld at
        once when the version is too old even with nothing ahead of it.
        """
        if self._board.error is not None:
            error = self._board.error
            raise PacingError(f"reading {self.progress_topic} failed: {error}") from error
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        seen = self._board.updates
        waited = False
        while True:
            with self._lock:  # decided and counted at once: two threads cannot take the same room
                decision, trainer = self.decide(weight_version)
                if decision.admitted:
                    self._count_admitted(weight_version, time.monotonic() - started if waited else None)
                    return decision
            bound = self.limits.max_policy_lag
            base = None if trainer is None else next_batch_version(
                trainer.weight_version, trainer.batch_version, self.limits.versions_per_batch)
            if base is not None and bound is not None and base - weight_version > bound:
                # The next batch alone is judged too far ahead, and versions only move on: no wait helps.
                assert trainer is not None
                self._set_waiting(False)
                if waited:
                    self._count_wait(time.monotonic() - started)
                raise WeightsTooOld(
                    f"weight version {weight_version} would be {base - weight_version} behind trainer group "
                    f"{self.trainer_group!r} (version {trainer.weight_version}, next batch judged at "
                    f"{base}) even with no group ahead, more than max_policy_lag {bound}: load newer weights")
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                self._set_waiting(False)
                self._count_wait(now - started)
                raise PacingTimeout(self._timeout_message(decision, trainer, now - started))
            if not waited:
                waited = True
                self._set_waiting(True)
            # Own groups complete without a board update (acknowledgements): look again at least every 0.1 s.
            step = 0.1 if deadline is None else max(0.0, min(0.1, deadline - now))
            seen = self._board.wait_for_change(seen, step)

    def _count_admitted(self, weight_version: int, waited_s: float | None) -> None:
        self.stats.admitted += 1
        if self._newest is None or weight_version > self._newest:
            self._newest = weight_version
        if waited_s is not None:
            self._count_wait(waited_s)
        self._waiting = False
        self._publish()

    def _count_wait(self, seconds: float) -> None:
        self.stats.waits += 1
        self.stats.wait_s += seconds
        self.stats.max_wait_s = max(self.stats.max_wait_s, seconds)

    def _timeout_message(self, decision: Admission, trainer: TrainerProgress | None, waited: float) -> str:
        head = f"admit waited {waited:.1f}s for room behind trainer group {self.trainer_group!r}: "
        if trainer is None:
            return head + (f"it has published no progress on {self.progress_topic} (is a TrainDataReader "
                           f"with group_id {self.trainer_group!r} running on this train-data topic?)")
        age = (now_ms() - trainer.updated_ms) / 1000
        where = (f"last progress {age:.0f}s ago at weight version {trainer.weight_version}, "
                 f"{trainer.consumed_groups} group(s) consumed")
        if age > self.stale_after_s:
            return head + f"the trainer is stale ({where}; gone or stuck?)"
        return head + f"{decision.explain(self.limits)} ({where})"

    def _set_waiting(self, waiting: bool) -> None:
        with self._lock:
            if waiting != self._waiting:
                self._waiting = waiting
                self._publish()

    def _publish(self) -> None:
        self._writer.publish(self.progress())

    def progress(self) -> ProducerProgress:
        with self._lock:
            return ProducerProgress(
                producer_id=self.producer_id, trainer_group=self.trainer_group, topic=self.topic,
                newest_weight_version=self._newest, admitted=self.stats.admitted,
                outstanding=self.own_outstanding(), waiting=self._waiting, wait_s=round(self.stats.wait_s, 3),
                updated_ms=now_ms())

    def close(self) -> None:
        try:
            self._writer.retire(self.progress())
        finally:
            self._writer.close()
            self._board.close()
