"""The admission fold as it was before its indexes: every record scans every group, session and key.

A straight copy of the scan-based rule (`rollout_stream.core.admission`, before the time-ordered indexes), for
differential tests: the indexed fold must decide and hold exactly what this one does, record by record. It
subclasses the real fold only so a prompt fold can sit on top of it (`ScanPromptLog`); it overrides every
method that reads or changes the groups, sessions or keys, and never touches the indexes.
"""

from __future__ import annotations

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
from rollout_stream.core.admission import (
    AdmissionLog,
    AdmissionSnapshot,
    Decision,
    Outcome,
    _Group,
    _Pending,
    _Session,
    _Trainer,
)
from rollout_stream.core.prompts import PromptLog


class ScanAdmissionLog(AdmissionLog):
    def apply(self, offset: int, log_ms: int, record: AdmissionRecord) -> list[Decision]:
        if offset < self.next_offset:
            return []
        self.next_offset = offset + 1
        self.clock_ms = max(self.clock_ms, log_ms)
        decisions: list[Decision] = []
        self._record(offset, log_ms, record, decisions)
        self._expire(offset, decisions)
        self._scan(offset, decisions)
        for d in decisions:
            self.decided[d.request] = d
        if len(self.decided) > 100_000:
            for key in list(self.decided)[: len(self.decided) // 2]:
                del self.decided[key]
        return decisions

    def tick(self, offset: int, log_ms: int) -> list[Decision]:
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
                self.by_key[record.key] = record.request
                early = self.unmatched.pop(record.key, None)
                if early is not None:
                    self._consumed(early[0], record.key, early[1])
        elif isinstance(record, Delivered):
            self._renew(record.producer, record.session)
            group = self.groups.get(record.request)
            if group is not None and group.session == record.session:
                group.delivered = True
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
                        del self.groups[request]
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
        if current is None or current.session != session:
            return False
        current.renewed_ms = self.clock_ms
        return True

    def _end_session(self, producer: str, offset: int, out: list[Decision], *, forget_unsent: bool) -> None:
        ended = self.sessions.pop(producer)
        for request, p in list(self.pending.items()):
            if p.request.producer == producer and p.request.session == ended.session:
                del self.pending[request]
                out.append(Decision(request, Outcome.REVOKED, offset))
        for request, group in list(self.groups.items()):
            if group.producer == producer and group.session == ended.session and not group.delivered:
                if forget_unsent:
                    del self.groups[request]
                    self._dropped(request, group)
                elif group.revoked_ms is None:
                    group.revoked_ms, group.forget_at_ms = self.clock_ms, ended.renewed_ms + self.lease_ms
                    self._revoked(request, group)

    def _mark(self, mark: TrainerMark) -> None:
        t = self.trainers.get(mark.trainer)
        if t is None or t.session != mark.session:
            old = t
            t = self.trainers[mark.trainer] = _Trainer(mark.session, mark.weight_version, mark.batch_version,
                                                       mark.batches, mark.groups_per_batch,
                                                       mark.max_weight_staleness, self.clock_ms)
            if old is not None:
                resumed = mark.resumed_from if mark.resumed_from is not None else -1
                for batch, groups in old.uncommitted.items():
                    if batch >= resumed or batch == -1:
                        self.groups.update(groups)
        t.weight_version, t.batch_version = mark.weight_version, mark.batch_version
        t.batches, t.groups_per_batch = mark.batches, max(1, mark.groups_per_batch)
        t.max_weight_staleness, t.updated_ms = mark.max_weight_staleness, self.clock_ms
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
        request = self.by_key.get(key)
        t = self.trainers.get(trainer) if trainer is not None else None
        group = self.groups.pop(request, None) if request is not None else None
        if group is None and t is not None and request is not None and batch != -1:
            group = t.uncommitted.get(-1, {}).pop(request, None)
        if group is None:
            if request is None:
                self.unmatched[key] = (trainer or "", batch, self.clock_ms)
            return
        assert request is not None
        if batch is None or t is None:
            self.by_key.pop(key, None)
            return
        t.uncommitted.setdefault(batch, {})[request] = group

    def _expire(self, offset: int, out: list[Decision]) -> None:
        for key in [k for k, (_, _, ms) in self.unmatched.items() if self.clock_ms - ms >= self.lease_ms]:
            del self.unmatched[key]
        suspected = {(p, s.session): s.renewed_ms for p, s in self.sessions.items()
                     if self.clock_ms - s.renewed_ms >= self.suspect_ms}
        for request, group in list(self.groups.items()):
            renewed = suspected.get((group.producer, group.session))
            if group.revoked_ms is None and not group.delivered and renewed is not None:
                group.revoked_ms, group.forget_at_ms = self.clock_ms, renewed + self.lease_ms
                self._revoked(request, group)
            lapsed = group.sent and self.clock_ms - group.sent_ms >= self.sent_expiry_ms
            if lapsed or (group.revoked_ms is not None and self.clock_ms >= group.forget_at_ms):
                del self.groups[request]
                self.expired += lapsed
                if group.key is not None:
                    self.by_key.pop(group.key, None)
                self._dropped(request, group)
        for producer, s in list(self.sessions.items()):
            if self.clock_ms - s.renewed_ms >= self.lease_ms:
                self._end_session(producer, offset, out, forget_unsent=False)

    def _scan(self, offset: int, out: list[Decision]) -> None:
        for request, p in list(self.pending.items()):
            r = p.request
            if self._too_old(r):
                del self.pending[request]
                out.append(Decision(request, Outcome.TOO_OLD, offset))
            elif self.admissible(r) and self._granted(request, r):
                del self.pending[request]
                self.groups[request] = _Group(r.trainer, r.producer, r.session, r.weight_version,
                                              r.max_policy_lag, r.versions_per_batch)
                out.append(Decision(request, Outcome.ADMITTED, offset))

    def admissible(self, r: Request) -> bool:
        t = self.trainers.get(r.trainer)
        mine = [g for g in self.groups.values() if g.trainer == r.trainer]
        if r.max_unconsumed_groups is not None and len(mine) >= r.max_unconsumed_groups:
            return False
        if t is None:
            return r.max_policy_lag is None
        new = _Group(r.trainer, r.producer, r.session, r.weight_version, r.max_policy_lag,
                     r.versions_per_batch, sent=True)
        live = [g for g in mine if not self._never_trains(g, t)] + [new]
        behind = (len(live) - 1) // t.groups_per_batch
        start = max(g.weight_version for g in live)
        for g in live:
            if g.max_policy_lag is None:
                continue
            vpb = g.versions_per_batch
            past = self._base(t, vpb, start) - g.weight_version > g.max_policy_lag
            if g is not new and t.weight_version is not None and past:
                continue  # past its bound at the next batch already: nothing admitted can help it
            if self._base(t, vpb, start) + behind * vpb - g.weight_version > g.max_policy_lag:
                return False
        return True

    def _never_trains(self, group: _Group, t: _Trainer) -> bool:
        if group.revoked_ms is not None:
            return True
        s, v = t.max_weight_staleness, t.weight_version
        return s is not None and v is not None and v - group.weight_version > s

    def snapshot(self) -> AdmissionSnapshot:
        outstanding: dict[str, int] = {}
        for g in self.groups.values():
            outstanding[g.trainer] = outstanding.get(g.trainer, 0) + 1
        oldest = min((p.log_ms for p in self.pending.values()), default=None)
        return AdmissionSnapshot(
            folded_through=self.next_offset - 1,
            clock_ms=self.clock_ms,
            pending=len(self.pending),
            oldest_pending_ms=None if oldest is None else self.clock_ms - oldest,
            outstanding=outstanding,
            unsent=sum(not g.delivered for g in self.groups.values()),
            sessions={p: "suspected" if self.clock_ms - s.renewed_ms >= self.suspect_ms else "ok"
                      for p, s in self.sessions.items()},
            trainer_mark_age_ms={name: self.clock_ms - t.updated_ms for name, t in self.trainers.items()},
        )


class ScanPromptLog(PromptLog, ScanAdmissionLog):
    """The prompt fold on the scanning admission fold."""
