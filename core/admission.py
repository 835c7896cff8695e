"""The admission log's rule, pure: every party folds the same records in the same order and reaches the
same decision on every request (docs/pacing.md).

A paced producer appends a `Request` and waits until the fold decides it. A request is admitted when,
with it added, **every** outstanding group that can still train is judged within its own `k`:

    for all i in (O \\ H) + {R}:   base_i + ((|O \\ H| + 1 - 1) // g) * vpb_i - w_i <= k_i

O: the trainer's outstanding groups (admitted, not yet consumed, dead-lettered or released); H: those
certain never to train (the trainer's version is already more than `max_weight_staleness` past them, or
undelivered groups of a session that stopped renewing); g: groups per batch; base_i: the highest version the
trainer's next batch can be judged at (`rollout_stream.core.pacing.next_batch_version`). The worst place any
group of O \\ H can take is behind all the others, `(|O \\ H| - 1) // g` batches after the next one; checking
it for every group, not only the new one, is what makes the bound hold whatever order the groups are consumed
in, however many producers ask and whenever their answers arrive. A batch moves base by at most vpb and
consumes g groups, so it never makes the left side grow. With `k <= max_weight_staleness`, no admitted group
is skipped as stale.

Time is the log's own (`log_ms`, broker LogAppendTime): a session not renewed for `suspect_ms` has its
undelivered groups counted in H (they can never complete), and after `lease_ms` they are forgotten.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from rollout_stream.codec.admission import (
    AdmissionRecord,
    Cancel,
    Delivered,
    Hello,
    Release,
    Renew,
    Request,
    Resolved,
    Sent,
    TrainerMark,
)
from rollout_stream.core.admission_index import GroupIndex
from rollout_stream.core.pacing import next_batch_version

__all__ = ["AdmissionLog", "AdmissionSnapshot", "AdmittedGroup", "Decision", "Outcome"]

SUSPECT_MS = 3_000
LEASE_MS = 30_000
# A sent group neither consumed nor resolved after this long is given up on (`expired`): its `Resolved` was
# lost (the stage stopped between its commit and that record) or the pipeline has stalled for minutes.
SENT_EXPIRY_MS = 15 * 60_000


class Outcome(Enum):
    ADMITTED = "admitted"
    TOO_OLD = "too_old"  # the trainer's next batch is already more than k versions past it: final
    CANCELLED = "cancelled"  # the producer's Cancel came before any grant
    REVOKED = "revoked"  # its session ended (restarted, closed, lease expired) before it was decided


@dataclass(frozen=True, slots=True)
class Decision:
    request: int  # the request's offset: the admitted group's id
    outcome: Outcome
    at: int  # the offset of the record whose fold decided it


@dataclass(slots=True)
class _Group:
    trainer: str
    producer: str
    session: str
    weight_version: int
    max_policy_lag: int | None
    versions_per_batch: int
    sent: bool = False
    sent_ms: int = 0
    delivered: bool = False  # whole at the stage: it can train even if its producer goes away
    key: str | None = None  # its group key, once sent
    # log time its session stopped renewing (or restarted) while it was undelivered: from then on it is in H
    # for good, even if the session comes back, and it is forgotten when the lease runs out
    revoked_ms: int | None = None
    forget_at_ms: int = 0  # when revoked: `lease_ms` after its session last renewed


AdmittedGroup = _Group  # what a fold built on this one is told of a group


@dataclass(slots=True)
class _Pending:
    request: Request
    log_ms: int


@dataclass(slots=True)
class _Trainer:
    session: str
    weight_version: int | None
    batch_version: int | None
    batches: int
    groups_per_batch: int
    max_weight_staleness: int | None
    updated_ms: int
    # groups consumed in batches the trainer has not committed (-1: doomed, not in a batch yet): a restarted
    # reader reads them again, so they count again
    uncommitted: dict[int, dict[int, _Group]] = field(default_factory=dict)
    waits_for_every_partition: bool = False  # its reader's `partition_idle_ms=None` (paced producers refuse)


@dataclass(slots=True)
class _Session:
    session: str
    renewed_ms: int


@dataclass(frozen=True, slots=True)
class AdmissionSnapshot:
    """What `rollout-stream lag` and the metrics show of the log."""

    folded_through: int  # the last offset folded (-1: none)
    clock_ms: int
    pending: int
    oldest_pending_ms: int | None  # by the log's clock
    outstanding: dict[str, int]  # per trainer group
    unsent: int  # admitted groups not yet whole at the stage
    sessions: dict[str, str]  # producer -> "ok" | "suspected"
    trainer_mark_age_ms: dict[str, int]


class AdmissionLog:
    """The fold. `apply` each record of the log in offset order; it returns the requests it decided."""

    def __init__(self, suspect_ms: int = SUSPECT_MS, lease_ms: int = LEASE_MS,
                 sent_expiry_ms: int = SENT_EXPIRY_MS) -> None:
        if not 0 < suspect_ms <= lease_ms <= sent_expiry_ms:
            raise ValueError(f"need 0 < suspect_ms <= lease_ms <= sent_expiry_ms, got {suspect_ms}, "
                             f"{lease_ms} and {sent_expiry_ms}")
        self.suspect_ms, self.lease_ms, self.sent_expiry_ms = suspect_ms, lease_ms, sent_expiry_ms
        self.expired = 0  # sent groups given up on (SENT_EXPIRY_MS)
        self.next_offset = 0
        self.clock_ms = 0
        self.groups: dict[int, _Group] = {}
        self.pending: dict[int, _Pending] = {}  # in offset order
        self.sessions: dict[str, _Session] = {}  # by producer id: its current session
        self.trainers: dict[str, _Trainer] = {}
        self.decided: dict[int, Decision] = {}  # the newest decisions, for a waiter that reads them late
        self.late_delivered = 0  # groups delivered after they were revoked: they may train unaccounted
        self.by_key: dict[str, int] = {}  # a sent group's request, by group key
        # keys the trainer consumed (batch index, -1: doomed) or the stage resolved (None) before their
        # `Sent` was folded, with the log time: matched when it is, forgotten after a lease (unpaced groups)
        self.unmatched: dict[str, tuple[str, int | None, int]] = {}
        self.reindex()

    def reindex(self) -> None:
        """Rebuild the indexes from the state (after loading it): they are derived, never state
        (rollout_stream.core.admission_index)."""
        self._index = GroupIndex()
        self._renewals: deque[tuple[int, str, str]] = deque()  # (renewed ms, producer, session), oldest first
        self._suspected: dict[str, None] = {}  # producers whose session has not renewed for `suspect_ms`
        self._unmatched_at: deque[tuple[int, str]] = deque()  # (log ms, key), oldest first
        for request, group in self.groups.items():
            self._index.place(request)
            self._index.count(request, group, 1)
            self._schedule(request, group)
        for producer, s in sorted(self.sessions.items(), key=lambda item: item[1].renewed_ms):
            self._renewals.append((s.renewed_ms, producer, s.session))
        for key, (_, _, ms) in sorted(self.unmatched.items(), key=lambda item: item[1][2]):
            self._unmatched_at.append((ms, key))

    # ---- the fold ------------------------------------------------------------------------------
    def apply(self, offset: int, log_ms: int, record: AdmissionRecord) -> list[Decision]:
        if offset < self.next_offset:
            return []  # folded already (a follower re-reading after a reconnect)
        self.next_offset = offset + 1
        self.clock_ms = max(self.clock_ms, log_ms)
        decisions: list[Decision] = []
        self._record(offset, log_ms, record, decisions)
        self._expire(offset, decisions)
        self._scan(offset, decisions)
        for d in decisions:
            self.decided[d.request] = d
        if len(self.decided) > 100_000:  # bounded: waiters read their answer within seconds
            for key in list(self.decided)[: len(self.decided) // 2]:
                del self.decided[key]
        return decisions

    def tick(self, offset: int, log_ms: int) -> list[Decision]:
        """A record that is not an admission record (undecodable): only the clock moves."""
        if offset < self.next_offset:
            return []
        self.next_offset = offset + 1
        self.clock_ms = max(self.clock_ms, log_ms)
        decisions: list[Decision] = []
        self._expire(offset, decisions)
        self._scan(offset, decisions)
        for d in decisions:
            self.decided[d.request] = d
        return decisions

    def _record(self, offset: int, log_ms: int, record: AdmissionRecord, out: list[Decision]) -> None:
        if isinstance(record, Hello):
            current = self.sessions.get(record.producer)
            if current is not None and current.session != record.session:
                self._end_session(record.producer, offset, out, forget_unsent=False)
            self.sessions[record.producer] = _Session(record.session, self.clock_ms)
            self._renewed(record.producer, record.session)
        elif isinstance(record, Request):
            if not self._renew(record.producer, record.session, implicit=True):
                out.append(Decision(offset, Outcome.REVOKED, offset))
                return
            self.pending[offset] = _Pending(record, log_ms)
        elif isinstance(record, Cancel):
            if self.pending.pop(record.request, None) is not None:
                out.append(Decision(record.request, Outcome.CANCELLED, offset))
        elif isinstance(record, Sent):
            self._renew(record.producer, record.session)
            group = self.groups.get(record.request)
            if group is not None and group.session == record.session and not group.sent:
                group.sent, group.key, group.sent_ms = True, record.key, self.clock_ms
                self._index.schedule(group.sent_ms + self.sent_expiry_ms, record.request)
                self.by_key[record.key] = record.request
                early = self.unmatched.pop(record.key, None)
                if early is not None:
                    self._consumed(early[0], record.key, early[1])
        elif isinstance(record, Delivered):
            self._renew(record.producer, record.session)
            group = self.groups.get(record.request)
            if group is not None and group.session == record.session:
                if not group.delivered:
                    self._index.count(record.request, group, -1)
                    group.delivered = True
                    self._index.count(record.request, group, 1)
                self.late_delivered += group.revoked_ms is not None
        elif isinstance(record, Renew):
            self._renew(record.producer, record.session)
        elif isinstance(record, Release):
            if record.requests is None:
                current = self.sessions.get(record.producer)
                if current is not None and current.session == record.session:
                    self._end_session(record.producer, offset, out, forget_unsent=True)
            else:
                for request in record.requests:
                    group = self.groups.get(request)
                    if group is not None and group.session == record.session and not group.sent:
                        self._remove(request)
                        self._dropped(request, group)
        elif isinstance(record, Resolved):
            for key in record.keys:
                self._consumed(None, key, None)
        elif isinstance(record, TrainerMark):
            self._mark(record)

    def _renew(self, producer: str, session: str, *, implicit: bool = False) -> bool:
        current = self.sessions.get(producer)
        if current is None and implicit:
            self.sessions[producer] = current = _Session(session, self.clock_ms)
            self._renewed(producer, session)
        if current is None or current.session != session:
            return False
        if current.renewed_ms != self.clock_ms:
            current.renewed_ms = self.clock_ms
            self._renewed(producer, session)
        self._suspected.pop(producer, None)
        return True

    def _renewed(self, producer: str, session: str) -> None:
        self._renewals.append((self.clock_ms, producer, session))
        self._suspected.pop(producer, None)

    def _end_session(self, producer: str, offset: int, out: list[Decision], *, forget_unsent: bool) -> None:
        """Its pending requests are revoked. Its undelivered groups are forgotten when it closed (`Release`:
        it sent nothing more) or revoked when it went away (in H: they can never complete). Delivered groups
        may still train: they stay."""
        ended = self.sessions.pop(producer)
        self._suspected.pop(producer, None)
        for request, p in list(self.pending.items()):
            if p.request.producer == producer and p.request.session == ended.session:
                del self.pending[request]
                out.append(Decision(request, Outcome.REVOKED, offset))
        for request in self._index.in_order(self._index.undelivered.get((producer, ended.session), {})):
            group = self.groups[request]
            if forget_unsent:
                self._remove(request)
                self._dropped(request, group)
            elif group.revoked_ms is None:
                self._revoke(request, group, ended.renewed_ms + self.lease_ms)

    def _mark(self, mark: TrainerMark) -> None:
        t = self.trainers.get(mark.trainer)
        if t is None or t.session != mark.session:
            old = t
            t = self.trainers[mark.trainer] = _Trainer(mark.session, mark.weight_version, mark.batch_version,
                                                       mark.batches, mark.groups_per_batch,
                                                       mark.max_weight_staleness, self.clock_ms)
            if old is not None:  # a restarted reader reads again what its predecessor had not committed
                resumed = mark.resumed_from if mark.resumed_from is not None else -1
                for batch, groups in old.uncommitted.items():
                    if batch >= resumed or batch == -1:
                        for request, group in groups.items():
                            self._insert(request, group)
        t.weight_version, t.batch_version = mark.weight_version, mark.batch_version
        t.batches, t.groups_per_batch = mark.batches, max(1, mark.groups_per_batch)
        t.max_weight_staleness, t.updated_ms = mark.max_weight_staleness, self.clock_ms
        t.waits_for_every_partition = mark.waits_for_every_partition
        for batch, keys in mark.consumed.items():
            for key in keys:
                self._consumed(mark.trainer, key, batch)
        for key in mark.doomed:
            self._consumed(mark.trainer, key, -1)
        if mark.committed_batch is not None:
            for batch in [b for b in t.uncommitted if 0 <= b < mark.committed_batch]:
                for group in t.uncommitted.pop(batch).values():
                    if group.key is not None:
                        self.by_key.pop(group.key, None)

    def _consumed(self, trainer: str | None, key: str, batch: int | None) -> None:
        """The group keyed `key` was taken into `batch` of `trainer` (-1: doomed; None: resolved by the
        stage). It stops counting; one the trainer has not committed is kept in case it restarts."""
        request = self.by_key.get(key)
        t = self.trainers.get(trainer) if trainer is not None else None
        group = self._remove(request) if request is not None else None
        if group is None and t is not None and request is not None and batch != -1:
            group = t.uncommitted.get(-1, {}).pop(request, None)  # doomed first, now in its batch
        if group is None:
            if request is None:
                self.unmatched[key] = (trainer or "", batch, self.clock_ms)
                self._unmatched_at.append((self.clock_ms, key))
            return
        assert request is not None
        if batch is None or t is None:
            self.by_key.pop(key, None)
            return
        t.uncommitted.setdefault(batch, {})[request] = group

    def _expire(self, offset: int, out: list[Decision]) -> None:
        """What the log's clock ends: unmatched keys after a lease, the undelivered groups of a session
        silent for `suspect_ms` (revoked), sent groups past the expiry and revoked ones past their lease
        (forgotten), sessions silent for a lease (ended). Only what the indexes say is due is looked at."""
        clock = self.clock_ms
        while self._unmatched_at and clock - self._unmatched_at[0][0] >= self.lease_ms:
            ms, key = self._unmatched_at.popleft()
            entry = self.unmatched.get(key)
            if entry is not None and entry[2] == ms:  # else matched since, or consumed again later
                del self.unmatched[key]
        while self._renewals and clock - self._renewals[0][0] >= self.suspect_ms:
            ms, producer, session = self._renewals.popleft()
            s = self.sessions.get(producer)
            if s is not None and s.session == session and s.renewed_ms == ms:  # else renewed or ended since
                self._suspected[producer] = None
        due = {request for request in self._index.due(clock) if request in self.groups}
        for producer in self._suspected:
            due.update(self._index.unrevoked.get((producer, self.sessions[producer].session), ()))
        for request in self._index.in_order(due):
            group = self.groups[request]
            s = self.sessions.get(group.producer)
            if (group.revoked_ms is None and not group.delivered and s is not None
                    and s.session == group.session and group.producer in self._suspected):
                self._revoke(request, group, s.renewed_ms + self.lease_ms)
            lapsed = group.sent and clock - group.sent_ms >= self.sent_expiry_ms
            if lapsed or (group.revoked_ms is not None and clock >= group.forget_at_ms):
                self._remove(request)
                self.expired += lapsed
                if group.key is not None:
                    self.by_key.pop(group.key, None)
                self._dropped(request, group)
        ended = [p for p in self._suspected if clock - self.sessions[p].renewed_ms >= self.lease_ms]
        if len(ended) > 1:
            place = {p: i for i, p in enumerate(self.sessions)}
            ended.sort(key=place.__getitem__)
        for producer in ended:
            self._end_session(producer, offset, out, forget_unsent=False)

    # ---- the groups, indexed --------------------------------------------------------------------
    def _insert(self, request: int, group: _Group) -> None:
        """`groups[request] = group` (a request already there keeps its place)."""
        old = self.groups.get(request)
        if old is not None:
            self._index.count(request, old, -1)
        self._index.place(request)
        self.groups[request] = group
        self._index.count(request, group, 1)
        self._schedule(request, group)  # due again if it was due while out of `groups` (an uncommitted batch)

    def _remove(self, request: int) -> _Group | None:
        group = self.groups.pop(request, None)
        if group is not None:
            self._index.count(request, group, -1)
            self._index.leave(request)
        return group

    def _revoke(self, request: int, group: _Group, forget_at_ms: int) -> None:
        self._index.count(request, group, -1)
        group.revoked_ms, group.forget_at_ms = self.clock_ms, forget_at_ms
        self._index.count(request, group, 1)
        self._index.schedule(forget_at_ms, request)
        self._revoked(request, group)

    def _schedule(self, request: int, group: _Group) -> None:
        if group.sent:
            self._index.schedule(group.sent_ms + self.sent_expiry_ms, request)
        if group.revoked_ms is not None:
            self._index.schedule(group.forget_at_ms, request)

    def _scan(self, offset: int, out: list[Decision]) -> None:
        for request, p in list(self.pending.items()):
            r = p.request
            if self._too_old(r):
                del self.pending[request]
                out.append(Decision(request, Outcome.TOO_OLD, offset))
            elif self.admissible(r) and self._granted(request, r):
                del self.pending[request]
                self._insert(request, _Group(r.trainer, r.producer, r.session, r.weight_version,
                                             r.max_policy_lag, r.versions_per_batch))
                out.append(Decision(request, Outcome.ADMITTED, offset))

    # ---- what a fold built on this one hears (rollout_stream.core.prompts)
    # -------------------------------------
    def _granted(self, request: int, r: Request) -> bool:
        """`r` is admissible: may it be admitted now? (False: it stays pending, asked again later)"""
        return True

    def _revoked(self, request: int, group: _Group) -> None:
        """`group` can no longer complete: its session stopped renewing before it was delivered."""

    def _dropped(self, request: int, group: _Group) -> None:
        """`group` stops counting without being consumed or resolved: released, forgotten or expired."""

    # ---- the rule ------------------------------------------------------------------------------
    def _base(self, t: _Trainer, vpb: int, start: int) -> int:
        base = next_batch_version(t.weight_version, t.batch_version, vpb, any_batch=t.batches > 0,
                                  start=start)
        assert base is not None  # start is given
        return base

    def _too_old(self, r: Request) -> bool:
        t = self.trainers.get(r.trainer)
        if t is None or r.max_policy_lag is None or t.weight_version is None:
            return False
        return self._base(t, r.versions_per_batch, r.weight_version) - r.weight_version > r.max_policy_lag

    def admissible(self, r: Request) -> bool:
        """The rule for `r`, from the trainer's outstanding groups counted by weight version and bound (a
        record's cost does not grow with the backlog). H: the revoked groups (not counted) and those more
        than `max_weight_staleness` behind the trainer (below `floor`)."""
        t = self.trainers.get(r.trainer)
        if (r.max_unconsumed_groups is not None
                and self._index.outstanding.get(r.trainer, 0) >= r.max_unconsumed_groups):
            return False
        if t is None:
            return r.max_policy_lag is None
        bounds = self._index.bounds.get(r.trainer, {})
        if r.max_policy_lag is None and not bounds:
            return True  # no group in line has a bound to break
        s, v = t.max_weight_staleness, t.weight_version
        floor = v - s if s is not None and v is not None else None  # below it a group never trains (H)
        weights = self._index.weights.get(r.trainer)
        live = 1 + (weights.count_from(floor) if weights is not None else 0)  # with the new group
        newest = weights.highest() if weights is not None else None
        start = r.weight_version if newest is None or (floor is not None and newest < floor) else max(
            newest, r.weight_version)  # a trainer without a version yet: assumed at the newest
        behind = (live - 1) // t.groups_per_batch  # batches after the next one, for the last in line
        # per bound, its oldest group that can still train within it is the one closest to breaking it. One
        # already past it at the next batch (a batch trained groups not admitted here) stays past it, as
        # versions only move on: holding admissions back cannot help it, and without a staleness bound it
        # never joins H, so it would stop every admission for good. It still takes its place in `live`.
        checks = [(w, vpb, lag) for (vpb, lag), versions in bounds.items()
                  if (w := versions.lowest_from(self._within(t, vpb, lag, start, floor))) is not None]
        if r.max_policy_lag is not None:
            checks.append((r.weight_version, r.versions_per_batch, r.max_policy_lag))
        return all(self._base(t, vpb, start) + behind * vpb - w <= lag for w, vpb, lag in checks)

    def _within(self, t: _Trainer, vpb: int, lag: int, start: int, floor: int | None) -> int | None:
        """The lowest version a group under bound (`vpb`, `lag`) can have and still train within it (and
        outside H); None: any (a trainer without a version yet is assumed at the newest: none is past)."""
        if t.weight_version is None:
            return floor
        lowest = self._base(t, vpb, start) - lag
        return lowest if floor is None else max(lowest, floor)

    # ---- what is shown -------------------------------------------------------------------------
    def snapshot(self) -> AdmissionSnapshot:
        oldest = min((p.log_ms for p in self.pending.values()), default=None)
        return AdmissionSnapshot(
            folded_through=self.next_offset - 1,
            clock_ms=self.clock_ms,
            pending=len(self.pending),
            oldest_pending_ms=None if oldest is None else self.clock_ms - oldest,
            outstanding=dict(self._index.outstanding),
            unsent=sum(len(requests) for requests in self._index.undelivered.values()),
            sessions={p: "suspected" if self.clock_ms - s.renewed_ms >= self.suspect_ms else "ok"
                      for p, s in self.sessions.items()},
            trainer_mark_age_ms={name: self.clock_ms - t.updated_ms for name, t in self.trainers.items()},
        )

