"""The producer's side of pacing: ask the admission log for room and wait for its answer.

`AdmissionGate` is what `RolloutProducer(..., max_policy_lag=k, max_unconsumed_groups=n)` uses. `admit`
appends a request to the admission log and waits until the fold (`rollout_stream.core.admission`) decides it;
every paced producer folds the same log, so no two can take the same room, however many there are
(docs/pacing.md). A group's records are sent only after a `Sent` record names its key, and only while this
producer's lease holds (it renews it every second); once they are all acknowledged a `Delivered` record says
the group is whole at the stage. So the log always knows which groups may still reach the trainer: a producer
that goes away leaves groups that can never complete, and they take no place.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import TypedDict

from rollout_stream.clients import Connection
from rollout_stream.codec import Sample
from rollout_stream.codec.admission import (
    AdmissionRecord,
    Cancel,
    Delivered,
    Hello,
    Release,
    Renew,
    Request,
    Sent,
)
from rollout_stream.codec.progress import ProducerProgress
from rollout_stream.core.admission import SUSPECT_MS, AdmissionLog, Decision, Outcome
from rollout_stream.core.pacing import Admission, PacingLimits, next_batch_version
from rollout_stream.errors import ConfigurationError, RuntimeFailure
from rollout_stream.kafka import Client, KafkaFailure, SendFuture, client_for
from rollout_stream.logs import log_event
from rollout_stream.pacing.admission_log import AdmissionFollower, AdmissionWriter, ensure_admission_topic
from rollout_stream.pacing.progress import ProgressWriter, now_ms

__all__ = ["AdmissionGate", "AdmissionRevoked", "PacingError", "PacingStats", "PacingTimeout",
           "WeightsTooOld"]

log = logging.getLogger("rollout_stream.pacing")

RENEW_S = 1.0
# A lease is good until SUSPECT_MS after the renewal that was last acknowledged, by the broker's clock; this
# producer stops sending that much earlier by its own, for the clocks' skew and the renewal's trip.
LEASE_MARGIN_S = 1.0
CANCEL_WAIT_S = 10.0  # how long a timed-out admit waits to learn whether its grant or its cancel came first
# how long a send past the lease (by this producer's clock) waits for a renewal and the log's verdict on it
VERDICT_WAIT_S = 10.0
DELIVERY_CHECK_S = 0.05  # how soon a group whose records are all acknowledged is reported Delivered


class PacingError(RuntimeFailure):
    """A paced producer cannot start a group."""


class PacingTimeout(PacingError, TimeoutError):
    """`admit` waited its whole timeout without room behind the trainer (the message says why)."""


class WeightsTooOld(PacingError, ValueError):
    """The weight version asked for is more than max_policy_lag behind the trainer: waiting cannot help."""


class UnpaceableTrainer(PacingError, ConfigurationError):
    """The trainer group reads with `partition_idle_ms=None`: its merge waits for a group on every partition
    while pacing holds the producers that would put one there, so the two together stop for good."""


class AdmissionRevoked(PacingError):
    """The group's admission ended before its first record was sent (the log ended this producer's lease:
    a long pause, a broker silent for seconds), or it was given back: its place and prompt are the log's
    again. Admit it again."""


@dataclass
class _Group:
    """One of this producer's groups on its way: its records' futures, and whether all are handed over."""

    request: int
    futures: list[SendFuture]
    rollouts: dict[object, tuple[int, int]]  # rollout -> (its samples, seen so far)
    group_size: int | None = None
    whole: bool = False  # every record of it is handed to the client

    def add(self, sample: Sample, future: SendFuture) -> None:
        self.futures.append(future)
        # as `numbered_group` counts rollouts: a sample with neither id is a rollout of its own
        rollout = (sample.rollout_id if sample.rollout_id is not None
                   else sample.index if sample.index is not None else ("sample", len(self.futures)))
        count, seen = self.rollouts.get(rollout, (sample.sibling_count, 0))
        self.rollouts[rollout] = (count, seen + 1)
        self.group_size = sample.group_size
        if self.group_size is not None and len(self.rollouts) >= self.group_size and all(
                seen >= count for count, seen in self.rollouts.values()):
            self.whole = True


class _Who(TypedDict):
    producer: str
    session: str


@dataclass
class PacingStats:
    admitted: int = 0
    waits: int = 0  # admissions that had to wait
    wait_s: float = 0.0  # total time spent waiting in admit
    max_wait_s: float = 0.0
    unpaced_groups: int = 0  # groups sent without an admission


class AdmissionGate:
    """Admission of new prompt groups for one producer, paced to one trainer group."""

    def __init__(self, conn: Connection, *, topic: str, admission_topic: str, progress_topic: str,
                 trainer_group: str, limits: PacingLimits, producer_id: str | None = None,
                 stale_after_s: float = 60.0, client: Client | None = None, source: str | None = None,
                 fold: AdmissionLog | None = None) -> None:
        """`source`: a prompt source's name, which every request takes a prompt of (docs/loop.md); `fold`:
        where the follower starts (a fold loaded from a checkpoint; default: the log's start)."""
        self.topic, self.trainer_group, self.limits = topic, trainer_group, limits
        self.source = source
        self.admission_topic = admission_topic
        self.producer_id = producer_id or f"producer-{uuid.uuid4().hex[:12]}"
        self.session = uuid.uuid4().hex[:12]
        self._me = _Who(producer=self.producer_id, session=self.session)  # who writes each record
        self.stale_after_s = stale_after_s
        self.stats = PacingStats()
        client = client or client_for(conn)
        ensure_admission_topic(conn, admission_topic, client)
        self._lock = threading.RLock()
        self._lease = threading.Condition(self._lock)  # notified when a renewal moves `_valid_until`
        self._tickets: deque[int] = deque()  # admitted requests no group has taken yet, oldest first
        # tickets dropped when the lease ran out (by this producer's clock): the groups that would have
        # taken them are refused
        self._lapsed: deque[int] = deque(maxlen=10_000)
        self._keys: dict[str, int] = {}  # the request each group key took (the newest 10,000)
        self._bound: dict[str, int] = {}  # group keys told which admission they take (`bind`)
        self._naming: set[int] = set()  # tickets a group is being named under (`before_send`)
        self._sending: dict[str, _Group] = {}  # groups named in the log and not yet Delivered
        self._newest: int | None = None
        self._waiting = False
        self._valid_until = 0.0  # monotonic: this producer's lease holds until then
        self._writer = AdmissionWriter(conn, admission_topic, client)
        self._follower = AdmissionFollower(conn, admission_topic, client, fold=fold)
        sent_at = time.monotonic()
        hello = self._writer.send(Hello(**self._me))
        self._renewed(sent_at, hello)
        # A fresh producer knows what the log says (where the trainer is) before its first admit.
        self._follower.wait_folded(hello.get(0).offset, 10.0)
        self._progress = ProgressWriter(conn, progress_topic, heartbeat_s=2.0, client=client,
                                        refresh=self.progress)
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="admission-renew", daemon=True)
        self._renewer.start()

    # ---- the lease -------------------------------------------------------------------------------
    def _renewed(self, sent_at: float, future: SendFuture, timeout: float = 10.0) -> None:
        offset = future.get(timeout).offset
        with self._lock:
            # acknowledged after the lease ran out by this producer's clock (sent late, or the broker was slow
            # to answer): the log may have suspected the session before this renewal reached it
            late = time.monotonic() >= self._valid_until and bool(self._tickets)
        # a late renewal makes the lease good again only once the log has said which admissions it kept:
        # until then a send waits (before_send)
        if late and not self._drop_lapsed(offset):
            return
        with self._lock:
            self._valid_until = max(self._valid_until, sent_at + SUSPECT_MS / 1000 - LEASE_MARGIN_S)
            self._lease.notify_all()

    def _drop_lapsed(self, renewal: int) -> bool:
        """This renewal was acknowledged after the lease ran out by this producer's clock (the process was
        paused or starved, or the broker answered late): the log may have ended admissions it holds, and
        handed their prompts out again. A renewal must not make those good: once the log has folded it, the
        admissions the log no longer holds are dropped, and a group that would have taken one is refused
        (AdmissionRevoked). The log decides, so a renewal that was merely late keeps them all."""
        if not self._follower.wait_folded(renewal, RENEW_S * 2):
            return False  # the fold is catching up after the pause: the next renewal, late too, looks again
        with self._lock:
            asked = list(self._tickets)
        held = self._follower.read(lambda fold: {r for r in asked if _still_held(fold, r, self.session)})
        with self._lock:
            lapsed = [r for r in self._tickets if r in asked and r not in held]
            for request in lapsed:
                self._tickets.remove(request)
                self._lapsed.append(request)
            self._lease.notify_all()
        if lapsed:
            log_event(log, "admission.lapsed", logging.WARNING, topic=self.admission_topic,
                      admissions=len(lapsed), producer=self.producer_id)
        return True

    def _renew(self) -> None:
        """Renew the lease every RENEW_S; between renewals, say which groups are whole at the stage."""
        due = time.monotonic() + RENEW_S
        while not self._stop.wait(DELIVERY_CHECK_S):
            self._deliveries()
            if time.monotonic() < due:
                continue
            due = (sent_at := time.monotonic()) + RENEW_S
            try:
                self._renewed(sent_at, self._writer.send(Renew(**self._me)), timeout=RENEW_S * 2)
            except KafkaFailure as exc:  # the lease runs out unless a later renewal passes
                log_event(log, "admission.renew_failed", logging.WARNING, topic=self.admission_topic,
                          error=f"{type(exc).__name__}: {exc}")

    def _deliveries(self) -> None:
        with self._lock:
            whole = [(k, g) for k, g in self._sending.items() if g.whole]
        if not whole:
            return
        pending = [f for _, g in whole for f in g.futures if not f.done()]
        if pending:  # one short wait serves every delivery report (librdkafka needs a poll)
            try:
                pending[-1].get(0.005)
            except KafkaFailure:
                pass  # failed: looked at below
        for key, group in whole:
            if not all(f.done() for f in group.futures):
                continue
            with self._lock:
                self._sending.pop(key, None)
            if all(f.exception() is None for f in group.futures):
                self._writer.send(Delivered(**self._me, request=group.request))
            # a record that failed never reaches the stage: the group never completes, the stage
            # dead-letters what did arrive (missing members), and the log counts it until then

    # ---- what send() tells the gate -------------------------------------------------------------
    def sending(self) -> threading.RLock:
        """Held while a whole group is sent, so its records go out under one admission."""
        return self._lock

    def before_send(self, key: bytes) -> None:
        """Called before each record is sent: the first record of a new group takes the oldest admission and
        names the group in the log (`Sent`) before anything of it reaches the stage."""
        name = key.decode()
        with self._lock:
            if name in self._keys:
                self._bound.pop(name, None)  # a later part of a group already named
                return
            bound = self._bound.pop(name, None)
            if bound is not None:  # a prompt's group takes its own admission, never another's
                if bound not in self._tickets:
                    if bound in self._lapsed:
                        self._lapsed.remove(bound)
                    raise AdmissionRevoked(f"group {name!r} was bound to admission {bound}, which this "
                                           f"producer no longer holds (sent, given back or lapsed)")
                self._tickets.remove(bound)
                self._tickets.appendleft(bound)
            # a ticket another thread's group is naming (it waits in `_hold`, the lock let go) is taken
            free = [r for r in self._tickets if r not in self._naming]
            if not free and self._lapsed:
                request = self._lapsed.popleft()
                raise AdmissionRevoked(
                    f"the admission of group {name!r} (request {request}) lapsed: this producer's lease on "
                    f"{self.admission_topic} ran out before it was renewed; admit the group again")
            if not free:
                self.stats.unpaced_groups += 1  # sent without admit(): the log does not count it
                self._keys[name] = -1
                return
            request = free[0]
            self._naming.add(request)
            try:
                self._hold(name, request)
                self._writer.append(Sent(**self._me, request=request, key=name))
                self._hold(name, request)  # the append may have waited on the broker past the lease
            finally:
                self._naming.discard(request)
            self._tickets.remove(request)
            self._keys[name] = request
            self._sending[name] = _Group(request, [], {})
            if len(self._keys) > 10_000:
                del self._keys[next(iter(self._keys))]

    def _hold(self, name: str, request: int) -> None:
        """Return once the group `name` may go out under `request`, else raise AdmissionRevoked. Past the
        lease by this producer's clock, a renewal late to be acknowledged is not a revocation: wait (the lock
        let go) for one, and for the log's verdict on the admissions it holds (`_renewed`)."""
        if time.monotonic() >= self._valid_until:
            deadline = time.monotonic() + VERDICT_WAIT_S
            log_event(log, "admission.lease_late", logging.INFO, topic=self.admission_topic,
                      producer=self.producer_id, request=request)
            while time.monotonic() >= self._valid_until and request in self._tickets:
                left = deadline - time.monotonic()
                if left <= 0:  # the broker has not answered for seconds: give it back (the log may hold it)
                    self._tickets.remove(request)
                    self._writer.send(Release(**self._me, requests=[request]))
                    raise AdmissionRevoked(
                        f"the admission of group {name!r} (request {request}) lapsed: no renewal of this "
                        f"producer's lease on {self.admission_topic} was acknowledged in time for "
                        f"{VERDICT_WAIT_S:.0f} s; admit the group again")
                self._lease.wait(min(left, RENEW_S))
        # by the fold as far as it has read: after a late renewal, at least through that renewal
        if request in self._tickets and not self._follower.read(
                lambda fold: _still_held(fold, request, self.session)):
            self._tickets.remove(request)
        if request not in self._tickets:  # the log ended it (or it was given back meanwhile)
            if request in self._lapsed:
                self._lapsed.remove(request)
            raise AdmissionRevoked(
                f"the admission of group {name!r} (request {request}) lapsed: the log ended this producer's "
                f"lease on {self.admission_topic} before a renewal reached it; admit the group again")

    def after_send(self, key: bytes, sample: Sample, future: SendFuture) -> None:
        with self._lock:
            group = self._sending.get(key.decode())
            if group is not None:
                group.add(sample, future)

    def group_sent(self, keys: list[bytes]) -> None:
        """`send_group` handed these groups' records to the client: a group given without its size is whole
        once they are acknowledged (one with its size when its rollouts add up: a call may send a part)."""
        with self._lock:
            for key in keys:
                group = self._sending.get(key.decode())
                if group is not None and group.group_size is None:
                    group.whole = True

    def flushed(self) -> None:
        """Every record handed over so far is acknowledged (or failed): a group sent without its size is
        whole now (one with it is whole when its records add up: a flush can come in the middle of it)."""
        with self._lock:
            for group in self._sending.values():
                if group.group_size is None:
                    group.whole = True
        self._deliveries()

    def bind(self, key: str, request: int) -> None:
        """The group named `key`, when sent, takes the admission of `request` rather than the oldest."""
        with self._lock:
            self._bound[key] = request

    def give_back(self, request: int, error: str | None = None) -> bool:
        """An admission this producer will not use: its place (and a prompt it carries) goes back now.
        `error`: this producer failed while holding it (`Type: message`), which a prompt's attempt counts.
        False: not held (sent, given back or lapsed already)."""
        with self._lock:
            if request in self._lapsed:
                self._lapsed.remove(request)
            if request not in self._tickets:
                return False
            self._tickets.remove(request)
            self._bound = {k: r for k, r in self._bound.items() if r != request}
        self._writer.send(Release(**self._me, requests=[request], error=error))
        return True

    def append(self, record: AdmissionRecord, timeout: float = 10.0) -> int:
        """Append a record of this producer's to the log and wait until the fold has it; its offset."""
        offset = self._writer.append(record)
        self._follower.wait_folded(offset, timeout)
        return offset

    @property
    def follower(self) -> AdmissionFollower:
        return self._follower

    # ---- admission -------------------------------------------------------------------------------
    def _request(self, weight_version: int) -> Request:
        return Request(**self._me, trainer=self.trainer_group,
                       weight_version=weight_version, max_policy_lag=self.limits.max_policy_lag,
                       max_unconsumed_groups=self.limits.max_unconsumed_groups,
                       versions_per_batch=self.limits.versions_per_batch, source=self.source)

    def can_admit(self, weight_version: int) -> bool:
        """Whether a group at `weight_version` would be admitted now (advisory: asks nothing of the log)."""
        request = self._request(weight_version)
        return self._follower.read(lambda fold: fold.admissible(request))

    def admit(self, weight_version: int, timeout: float | None = None) -> Admission:
        """Wait until a group at `weight_version` may start, and hold its place.

        Raises PacingTimeout after `timeout` seconds without room (None: wait forever), WeightsTooOld when the
        trainer's next batch is already too far ahead of the version.
        """
        if self._follower.error is not None:
            error = self._follower.error
            raise PacingError(f"reading {self.admission_topic} failed: {error}") from error
        if self.limits.active and self._follower.read(self._unpaceable):
            raise UnpaceableTrainer(
                f"trainer group {self.trainer_group!r} reads {self.topic!r}'s train data with "
                f"partition_idle_ms=None (its merge waits for a group on every partition), which pacing "
                f"cannot serve: a partition left without a group while pacing holds the producers stops "
                f"both for good. Give its TrainDataReader a partition_idle_ms (the default, 500), or pace no "
                f"producer to it")
        started = time.monotonic()
        try:
            request = self._writer.append(self._request(weight_version))
        except KafkaFailure as exc:
            raise PacingError(f"cannot append to the admission log {self.admission_topic}: {exc}") from exc
        decision = self._follower.wait_for(request, 0.0)
        if decision is None:
            self._set_waiting(True)
            decision = self._follower.wait_for(request, timeout)
        if decision is None:  # out of time: cancel, and see which of the two the log has first
            self._writer.send(Cancel(**self._me, request=request))
            decision = self._follower.wait_for(request, CANCEL_WAIT_S)
        waited = time.monotonic() - started
        self._set_waiting(False)
        if decision is not None and decision.outcome is Outcome.ADMITTED:
            return self._admitted(request, weight_version, waited, decision)
        if waited >= 0.001:
            self._count_wait(waited)
        if decision is None:
            raise PacingTimeout(f"admit on {self.admission_topic}: no decision on request {request} after "
                                f"{waited:.1f}s and a cancel (is the admission log readable?)")
        if decision.outcome is Outcome.TOO_OLD:
            raise WeightsTooOld(self._too_old_message(weight_version))
        if decision.outcome is Outcome.CANCELLED:
            raise PacingTimeout(self._timeout_message(waited))
        raise PacingError(f"request {request} was revoked: this producer's session on {self.admission_topic} "
                          f"ended (another process started with producer id {self.producer_id!r}?)")

    def _unpaceable(self, fold: AdmissionLog) -> bool:
        trainer = fold.trainers.get(self.trainer_group)
        return trainer is not None and trainer.waits_for_every_partition

    def _admitted(self, request: int, weight_version: int, waited: float, decision: Decision) -> Admission:
        with self._lock:
            self._tickets.append(request)
            self.stats.admitted += 1
            if self._newest is None or weight_version > self._newest:
                self._newest = weight_version
        if decision.at > request:
            self._count_wait(waited)
        self._publish()
        return Admission(None, self.outstanding(), None, request)

    def _count_wait(self, seconds: float) -> None:
        with self._lock:
            self.stats.waits += 1
            self.stats.wait_s += seconds
            self.stats.max_wait_s = max(self.stats.max_wait_s, seconds)

    # ---- what is said ------------------------------------------------------------------------------
    def outstanding(self) -> int:
        """This producer's groups the log counts (admitted, and not yet consumed, resolved or released)."""
        def mine(fold: AdmissionLog) -> int:
            return sum(g.producer == self.producer_id for g in fold.groups.values())
        return self._follower.read(mine)

    def _too_old_message(self, weight_version: int) -> str:
        def where(fold: AdmissionLog) -> tuple[int | None, int | None]:
            t = fold.trainers.get(self.trainer_group)
            return (None, None) if t is None else (t.weight_version, next_batch_version(
                t.weight_version, t.batch_version, self.limits.versions_per_batch, any_batch=t.batches > 0))
        version, base = self._follower.read(where)
        return (f"weight version {weight_version} would be {(base or 0) - weight_version} behind trainer "
                f"group {self.trainer_group!r} (version {version}, next batch judged at {base}) even with no "
                f"group ahead, more than max_policy_lag {self.limits.max_policy_lag}: load newer weights")

    def _timeout_message(self, waited: float) -> str:
        def state(fold: AdmissionLog) -> str:
            head = f"admit waited {waited:.1f}s for room behind trainer group {self.trainer_group!r}: "
            t = fold.trainers.get(self.trainer_group)
            if t is None:
                return head + (f"it has said nothing on {self.admission_topic} (is a TrainDataReader with "
                               f"group_id {self.trainer_group!r} running on this train-data topic?)")
            age = (fold.clock_ms - t.updated_ms) / 1000
            ahead = sum(g.trainer == self.trainer_group for g in fold.groups.values())
            where = f"last word {age:.0f}s ago at weight version {t.weight_version}"
            if age > self.stale_after_s:
                return head + f"the trainer is stale ({where}; gone or stuck?)"
            return head + (f"{ahead} group(s) admitted and not yet consumed would put one of them past its "
                           f"bound (max_policy_lag {self.limits.max_policy_lag}, max_unconsumed_groups "
                           f"{self.limits.max_unconsumed_groups}; {where})")
        return self._follower.read(state)

    def _set_waiting(self, waiting: bool) -> None:
        with self._lock:
            if waiting == self._waiting:
                return
            self._waiting = waiting
        self._publish()

    def _publish(self) -> None:
        self._progress.publish(self.progress())

    def progress(self) -> ProducerProgress:
        return ProducerProgress(
            producer_id=self.producer_id, trainer_group=self.trainer_group, topic=self.topic,
            newest_weight_version=self._newest, admitted=self.stats.admitted, outstanding=self.outstanding(),
            waiting=self._waiting, wait_s=round(self.stats.wait_s, 3), updated_ms=now_ms())

    def close(self) -> None:
        """Release what this producer holds: its sent groups still count until the trainer consumes them.
        A second close does nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._renewer.join(timeout=5)
        try:
            self.flushed()
            self._writer.append(Release(**self._me))
        except KafkaFailure as exc:  # the lease then runs out on its own
            log_event(log, "admission.release_failed", logging.WARNING, topic=self.admission_topic,
                      error=f"{type(exc).__name__}: {exc}")
        try:
            self._progress.retire(self.progress())
        finally:
            self._progress.close()
            self._writer.close()
            self._follower.close()


def _still_held(fold: AdmissionLog, request: int, session: str) -> bool:
    group = fold.groups.get(request)
    return group is not None and group.session == session and group.revoked_ms is None
