"""The indexed admission fold (rollout_stream.core.admission) against the scanning one it replaced
(tests/core/admission_reference.py): random logs folded by both give the same decisions at every record and
the same state, order included. The fold is the protocol every party folds identically, so its indexes may
change its cost, never its answers."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

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
from rollout_stream.core.admission import AdmissionLog
from rollout_stream.core.admission_index import Versions
from rollout_stream.core.checkpoint import FOLD_VERSION, dump_fold, load_fold
from rollout_stream.core.prompts import PromptLog
from tests.core.admission_reference import ScanAdmissionLog, ScanPromptLog
from tests.core.test_prompts import STEPS, play

EXAMPLES = int(os.environ.get("ADMISSION_EXAMPLES", "300"))
# short limits, so leases, suspicions and expiries happen within a few records
LIMITS = {"suspect_ms": 100, "lease_ms": 300, "sent_expiry_ms": 1_000}

OP = st.tuples(
    st.sampled_from(["hello", "request", "request", "request", "request", "cancel", "sent", "sent", "sent",
                     "delivered", "delivered", "renew", "renew", "release", "release_all", "resolved", "mark",
                     "mark", "mark", "tick"]),
    st.integers(0, 2),  # producer
    st.integers(0, 1),  # session
    st.integers(0, 10_000),  # which earlier request, key or value
    st.integers(0, 10_000),
    st.sampled_from([0, 0, 1, 10, 50, 100, 150, 300, 1_000, 5_000]),  # log ms since the previous record
)


class Heard:
    """What a fold built on the admission fold hears, in order: revocations and drops."""

    def __init__(self, **limits: int) -> None:
        super().__init__(**limits)  # type: ignore[call-arg]
        self.heard: list[tuple[str, int]] = []

    def _revoked(self, request: int, group: object) -> None:
        self.heard.append(("revoked", request))

    def _dropped(self, request: int, group: object) -> None:
        self.heard.append(("dropped", request))


class HeardIndexed(Heard, AdmissionLog):
    pass


class HeardScanning(Heard, ScanAdmissionLog):
    pass


def state(fold: AdmissionLog, *, decided: bool = True) -> tuple[object, ...]:
    """Everything the fold holds, in its order (`decided`: with the answers it keeps for late waiters)."""
    return (list(fold.groups.items()), list(fold.pending.items()), list(fold.sessions.items()),
            list(fold.trainers.items()), list(fold.by_key.items()), list(fold.unmatched.items()),
            fold.expired, fold.late_delivered, fold.next_offset, fold.clock_ms, fold.snapshot(),
            list(fold.decided.items()) if decided else None)


class Log:
    """Turns ops into records that refer to earlier ones (requests, their keys), as real parties' do: a
    trainer whose version only grows, producers that mostly name their own recent groups."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, str, str]] = []  # offset, producer, session
        self.sent: list[str] = []
        self.versions = [0, 0]
        self.batches = [0, 0]

    def record(self, op: tuple[str, int, int, int, int, int], offset: int) -> AdmissionRecord | None:
        kind, p, s, x, y, _ = op
        producer, session = f"p{p}", f"s{s}"
        recent = self.requests[-6:]
        pick = recent[x % len(recent)] if recent else (0, producer, session)
        other = self.requests[y % len(self.requests)] if self.requests else pick
        by, of = (pick[1], pick[2]) if y % 5 else (producer, session)  # mostly a producer names its own
        sent = self.sent[-8:]
        keys = [sent[(x + i) % len(sent)] for i in range(1 + y % 3)] if sent else []
        keys += [f"k{other[0]}"] if x % 4 == 0 else []
        keys += [f"u{x % 3}"] if x % 7 == 0 else []  # a group never admitted (unpaced)
        t = x % 2
        match kind:
            case "hello":
                return Hello(producer=producer, session=session)
            case "request":
                self.requests.append((offset, producer, session))
                return Request(producer=producer, session=session, trainer=f"t{t}",
                               weight_version=max(0, self.versions[t] - y % 4),
                               max_policy_lag=[None, 0, 1, 2][x % 4],
                               max_unconsumed_groups=[None, 2, 4, 8][y % 4],
                               versions_per_batch=1 + (x // 4) % 2)
            case "cancel":
                return Cancel(producer=by, session=of, request=pick[0])
            case "sent":
                self.sent.append(f"k{pick[0]}")
                return Sent(producer=by, session=of, request=pick[0], key=f"k{pick[0]}")
            case "delivered":
                return Delivered(producer=by, session=of, request=pick[0])
            case "renew":
                return Renew(producer=producer, session=session)
            case "release":
                return Release(producer=by, session=of, requests=[pick[0], other[0]][: 1 + y % 2])
            case "release_all":
                return Release(producer=producer, session=session)
            case "resolved":
                return Resolved(keys=keys, reason="missing_members")
            case "mark":
                batch = self.batches[t]
                self.batches[t] += y % 2
                self.versions[t] += (y // 2) % 2
                return TrainerMark(
                    trainer=f"t{t}", session=f"r{s}",
                    weight_version=None if y % 11 == 0 else self.versions[t],
                    batch_version=[None, self.versions[t]][x % 2], batches=batch, groups_per_batch=1 + y % 3,
                    max_weight_staleness=[None, 0, 1, 2][(x // 3) % 4],
                    consumed={batch: keys} if y % 3 else {}, doomed=keys[:1] if x % 5 == 0 else [],
                    committed_batch=batch - 1 if x % 3 == 0 else None,
                    resumed_from=[None, max(0, batch - 1), batch][y % 3])
        return None  # a record that is not an admission record: only the clock moves


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OP, max_size=200))
def test_the_indexed_fold_decides_and_holds_what_the_scanning_fold_does(ops: list[tuple]) -> None:
    log, new, old = Log(), HeardIndexed(**LIMITS), HeardScanning(**LIMITS)
    clock = 0
    for offset, op in enumerate(ops):
        clock += op[5]
        record = log.record(op, offset)
        if record is None:
            assert new.tick(offset, clock) == old.tick(offset, clock), offset
        else:
            assert new.apply(offset, clock, record) == old.apply(offset, clock, record), (offset, record)
        assert state(new) == state(old), (offset, record)
        assert new.heard == old.heard, (offset, record)


@settings(max_examples=EXAMPLES, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(-3, 12), st.sampled_from([1, 1, -1]),
                              st.none() | st.integers(-4, 14)), max_size=120))
def test_versions_count_what_a_walk_over_the_groups_counts(ops: list[tuple[int, int, int | None]]) -> None:
    versions, groups = Versions(), []
    for w, n, floor in ops:
        if n > 0:
            groups.append(w)
            versions.add(w, 1)
        elif w in groups:
            groups.remove(w)
            versions.add(w, -1)
        live = [g for g in groups if floor is None or g >= floor]
        assert versions.count_from(floor) == len(live)
        assert versions.lowest_from(floor) == min(live, default=None)
        assert versions.highest() == max(groups, default=None)
        assert versions.total == len(groups)


def fold_both(records: list[tuple[int, AdmissionRecord]]) -> HeardIndexed:
    """Fold `records` (log ms since the previous, record) with both folds, comparing at every record."""
    new, old = HeardIndexed(**LIMITS), HeardScanning(**LIMITS)
    clock = 0
    for offset, (after_ms, record) in enumerate(records):
        clock += after_ms
        assert new.apply(offset, clock, record) == old.apply(offset, clock, record), (offset, record)
        assert state(new) == state(old) and new.heard == old.heard, (offset, record)
    return new


def mark(session: str = "r0", v: int = 0, **kw: object) -> TrainerMark:
    return TrainerMark(trainer="t", session=session, weight_version=v, batch_version=None, batches=0,
                       groups_per_batch=1, max_weight_staleness=1, **kw)  # type: ignore[arg-type]


def test_a_group_too_stale_to_train_takes_no_place_in_line() -> None:
    fold = fold_both([
        (0, mark()),
        (0, Request(producer="p", session="s", trainer="t", weight_version=0, max_policy_lag=1,
                    max_unconsumed_groups=None)),
        (0, mark(v=3)),  # the group at 0 is more than max_weight_staleness behind: it never trains
        (0, Request(producer="p", session="s", trainer="t", weight_version=3, max_policy_lag=0,
                    max_unconsumed_groups=None)),  # first in line: judged at 3
    ])
    assert len(fold.groups) == 2


def test_a_trainer_without_a_version_is_assumed_at_the_newest_in_line() -> None:
    unversioned = TrainerMark(trainer="t", session="r0", weight_version=None, batch_version=None, batches=0,
                              groups_per_batch=2, max_weight_staleness=None)
    fold = fold_both([
        (0, unversioned),
        (0, Request(producer="p", session="s", trainer="t", weight_version=5, max_policy_lag=0,
                    max_unconsumed_groups=None)),
        (0, Request(producer="p", session="s", trainer="t", weight_version=3, max_policy_lag=1,
                    max_unconsumed_groups=None)),  # judged at 5 with the group at 5 in line: 2 behind
    ])
    assert list(fold.groups) == [1]


def test_a_group_a_restarted_trainer_reads_again_lapses_if_its_expiry_passed_meanwhile() -> None:
    fold = fold_both([
        (0, mark()),
        (0, Request(producer="p", session="s", trainer="t", weight_version=0, max_policy_lag=None,
                    max_unconsumed_groups=None)),
        (0, Sent(producer="p", session="s", request=1, key="k")),
        (0, Delivered(producer="p", session="s", request=1)),
        (0, mark(consumed={0: ["k"]})),  # in batch 0, not committed
        (2_000, Renew(producer="p", session="s")),  # its sent expiry passes while it is out of line
        (0, mark(session="r1", resumed_from=0)),  # read again: back in line, and lapsed
    ])
    assert fold.expired == 1 and not fold.groups


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OP, max_size=200), cut=st.floats(0, 1))
def test_a_fold_loaded_from_a_checkpoint_rebuilds_its_indexes(ops: list[tuple], cut: float) -> None:
    """Indexes are derived, not state: a fold loaded mid-log goes on exactly as the scanning fold does."""
    log, old = Log(), ScanPromptLog(**LIMITS)
    records = []
    clock = 0
    for offset, op in enumerate(ops):
        clock += op[5]
        records.append((offset, clock, log.record(op, offset)))
    k = int(len(records) * cut)
    head = PromptLog(**LIMITS)
    for offset, ms, record in records[:k]:
        head.tick(offset, ms) if record is None else head.apply(offset, ms, record)
    new = load_fold(dump_fold(head), FOLD_VERSION)
    for offset, ms, record in records:
        if record is None:
            decided = old.tick(offset, ms), new.tick(offset, ms)
        else:
            decided = old.apply(offset, ms, record), new.apply(offset, ms, record)
        if offset >= k:
            assert decided[0] == decided[1], (offset, record)
    assert state(new, decided=False) == state(old, decided=False)  # `decided` is not state


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, prompts=st.integers(1, 6), epochs=st.integers(1, 2))
def test_the_prompt_fold_on_the_indexes_hands_out_what_it_did_on_scans(steps: list[tuple[str, int]],
                                                                     prompts: int, epochs: int) -> None:
    """A prompt fold hears revocations and drops in the order the admission fold makes them: the same
    prompts re-issued in the same order, the same states, whichever fold is beneath."""
    w = play(steps, prompts, epochs)
    w.drain()
    new, old = PromptLog(), ScanPromptLog()
    for offset, ms, record in w.records:
        assert new.apply(offset, ms, record) == old.apply(offset, ms, record), (offset, record)
    assert dump_fold(new) == dump_fold(old) == dump_fold(w.fold)
    assert state(new) == state(old)
