"""The admission log's rule (rollout_stream.core.admission): decisions from the log alone, and the bound it
proves: with `max_policy_lag == max_weight_staleness`, no admitted group is ever skipped as stale, whatever
the number of producers, the order the pipeline delivers groups in, or how late the trainer's marks come."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.codec.admission import (
    Cancel,
    Delivered,
    Hello,
    Release,
    Renew,
    Request,
    Resolved,
    Sent,
    TrainerMark,
    decode_admission,
    encode_admission,
)
from rollout_stream.core.admission import AdmissionLog, Outcome


class Log:
    """A log and its fold, as every party sees it: offsets in order, a clock that only moves forward."""

    def __init__(self, **kw) -> None:
        self.fold = AdmissionLog(**kw)
        self.records: list[tuple[int, object]] = []
        self.clock = 0
        self.decided: dict[int, Outcome] = {}

    def append(self, record, after_ms: int = 10) -> int:
        self.clock += after_ms
        offset = len(self.records)
        self.records.append((self.clock, record))
        for d in self.fold.apply(offset, self.clock, record):
            assert d.request not in self.decided, "a request is decided once"
            self.decided[d.request] = d.outcome
        return offset

    def sent(self, *requests: int, producer: str = "p", session: str = "s1", whole: bool = True) -> list[str]:
        """Each group named (`Sent`) and, `whole`, all its records acknowledged (`Delivered`); the keys."""
        for r in requests:
            self.append(Sent(producer=producer, session=session, request=r, key=f"k{r}"))
            if whole:
                self.append(Delivered(producer=producer, session=session, request=r))
        return [f"k{r}" for r in requests]


def mark(trainer="t", session="r1", v=0, b=None, batches=0, g=2, s=1, **kw) -> TrainerMark:
    return TrainerMark(trainer=trainer, session=session, weight_version=v, batch_version=b, batches=batches,
                       groups_per_batch=g, max_weight_staleness=s, **kw)


def request(producer="p", session="s1", w=0, k=1, n=None, trainer="t") -> Request:
    return Request(producer=producer, session=session, trainer=trainer, weight_version=w, max_policy_lag=k,
                   max_unconsumed_groups=n)


def test_every_record_survives_the_wire():
    records = [Hello(producer="p", session="s"), request(), Cancel(producer="p", session="s", request=3),
               Sent(producer="p", session="s", request=3, key="run/3"),
               Delivered(producer="p", session="s", request=3), Renew(producer="p", session="s"),
               Release(producer="p", session="s", requests=[1, 2]), Release(producer="p", session="s"),
               Resolved(keys=["run/4"], reason="shared_reward_violation"),
               mark(consumed={0: ["run/1", "run/2"]}, doomed=["run/5"])]
    for r in records:
        assert decode_admission(encode_admission(r)) == r
    with pytest.raises(msgspec.DecodeError):
        decode_admission(b"\xc1")


def test_nothing_under_a_policy_lag_bound_is_admitted_before_the_trainer_has_said_where_it_is():
    log = Log()
    r = log.append(request())
    assert r not in log.decided
    log.append(mark())
    assert log.decided[r] is Outcome.ADMITTED


def test_the_bound_holds_for_every_group_ahead_not_only_the_new_one():
    # k=1, g=2: the next batch is judged at 0 at most, the one after at 1.
    log = Log()
    log.append(mark(v=0, g=2, s=1))
    first = [log.append(request(w=0)) for _ in range(4)]
    assert [log.decided.get(r) for r in first] == [Outcome.ADMITTED] * 4
    # A fifth group at w=1 would itself be judged in time (third batch, version 2), but it could be consumed
    # before one of the four and push that one into the third batch: it waits.
    fifth = log.append(request(w=1))
    assert fifth not in log.decided
    log.append(mark(v=0, b=0, batches=1, consumed={0: log.sent(*first[:2])}))
    assert fifth not in log.decided  # still three places for two w=0 groups and it
    log.append(mark(v=1, b=1, batches=2, consumed={1: log.sent(*first[2:])}))
    assert log.decided[fifth] is Outcome.ADMITTED


def test_a_request_the_next_batch_is_already_too_new_for_is_refused_for_good():
    log = Log()
    log.append(mark(v=5))
    r = log.append(request(w=3, k=1))
    assert log.decided[r] is Outcome.TOO_OLD


def test_max_unconsumed_groups_counts_groups_that_will_never_train():
    log = Log()
    log.append(mark(v=3, s=1))
    stale = log.append(request(w=3, k=None, n=2))
    log.append(mark(v=6, s=1))  # the trainer moved on: the group is certain to be skipped
    second = log.append(request(w=6, k=None, n=2))
    third = log.append(request(w=6, k=None, n=2))
    assert log.decided[stale] is Outcome.ADMITTED and log.decided[second] is Outcome.ADMITTED
    assert third not in log.decided  # two outstanding, however sure one is to be skipped
    log.append(mark(v=6, b=6, batches=1, consumed={0: log.sent(stale)}))
    assert log.decided[third] is Outcome.ADMITTED


def test_a_cancel_before_the_grant_wins_and_one_after_it_changes_nothing():
    log = Log()
    waiting = log.append(request())
    log.append(Cancel(producer="p", session="s1", request=waiting))
    assert log.decided[waiting] is Outcome.CANCELLED
    log.append(mark())
    granted = log.append(request())
    log.append(Cancel(producer="p", session="s1", request=granted))
    assert log.decided[granted] is Outcome.ADMITTED and granted in log.fold.groups


def test_a_restarted_producer_loses_its_waiting_requests_and_its_unsent_groups_take_no_place():
    log = Log()
    log.append(mark(v=0, g=1, s=0))
    sent, unsent = log.append(request(w=0, k=0)), None
    log.sent(sent)
    waiting = log.append(request(w=0, k=0))
    assert waiting not in log.decided  # k=0, g=1: one group ahead is already one batch too many
    log.append(Hello(producer="p", session="s2"))
    assert log.decided[waiting] is Outcome.REVOKED
    assert log.fold.groups[sent].revoked_ms is None  # sent: it may still train, it keeps its place
    del unsent


def test_a_session_that_stops_renewing_gives_up_its_unsent_places_at_once():
    log = Log(suspect_ms=3_000, lease_ms=30_000)
    log.append(mark(v=0, g=1, s=0))
    held = log.append(request(producer="dead", session="d", w=0, k=0))
    blocked = log.append(request(producer="live", session="l", w=0, k=0))
    assert blocked not in log.decided  # k=0, g=1: one group ahead is one batch too many
    log.append(Renew(producer="live", session="l"), after_ms=2_000)
    assert blocked not in log.decided
    log.append(Renew(producer="live", session="l"), after_ms=1_000)  # 3 s without a word from "dead"
    assert log.decided[blocked] is Outcome.ADMITTED
    assert log.fold.groups[held].revoked_ms is not None
    log.sent(held, producer="dead", session="d")  # back too late: counted, never trusted
    assert log.fold.late_delivered == 1 and log.fold.groups[held].revoked_ms is not None


def test_a_revoked_group_counts_toward_max_unconsumed_groups_until_the_lease_runs_out():
    log = Log(suspect_ms=3_000, lease_ms=30_000)
    log.append(mark(v=0, g=1, s=0))
    held = log.append(request(producer="dead", session="d", k=None, n=2))
    mine = log.append(request(producer="live", session="l", k=None, n=2))
    waiting = log.append(request(producer="live", session="l", k=None, n=2))
    assert log.decided[held] is log.decided[mine] is Outcome.ADMITTED and waiting not in log.decided
    log.append(Renew(producer="live", session="l"), after_ms=5_000)
    assert waiting not in log.decided  # revoked, it may still have been delivered: it counts
    log.append(Renew(producer="live", session="l"), after_ms=25_000)  # 30 s since "dead" last renewed
    assert log.decided[waiting] is Outcome.ADMITTED and held not in log.fold.groups
    assert "dead" not in log.fold.sessions


def test_a_restarted_trainer_counts_again_what_it_had_not_committed():
    log = Log()
    log.append(mark(v=0, g=1, s=1))
    a, b = log.append(request(w=0, k=None, n=2)), log.append(request(w=0, k=None, n=2))
    ka, kb = log.sent(a, b)
    log.append(mark(v=1, b=0, batches=2, consumed={0: [ka], 1: [kb]}, committed_batch=1))
    assert not log.fold.groups
    log.append(mark(session="r2", v=1, b=0, batches=1, resumed_from=1))
    assert set(log.fold.groups) == {b}  # batch 1 is read again; batch 0 was committed


def test_resolved_and_released_groups_stop_counting():
    log = Log()
    log.append(mark())
    a, b = log.append(request(k=None, n=2)), log.append(request(k=None, n=2))
    log.append(Resolved(keys=log.sent(a), reason="missing_members"))
    log.append(Release(producer="p", session="s1", requests=[b]))
    assert not log.fold.groups


def test_a_record_folded_twice_changes_nothing():
    log = Log()
    log.append(mark())
    r = log.append(request())
    assert log.fold.apply(r, log.clock, request()) == []
    assert list(log.fold.groups) == [r]


# ---- the bound, over random deployments ---------------------------------------------------------
@dataclass
class Producer:
    name: str
    session: str
    alive: bool = True
    admitted: list[int] = field(default_factory=list)  # granted, not yet sent
    waiting: list[int] = field(default_factory=list)


@dataclass
class Trainer:
    """What a TrainDataReader does, with marks that reach the log late and coalesced."""

    g: int
    staleness: int
    version: int = 0
    batch_version: int | None = None
    batches: int = 0
    consumed: dict[int, list[str]] = field(default_factory=dict)  # not yet in a mark


ACTIONS = ("request", "request", "request", "send", "send", "batch", "mark", "mark", "renew", "tick", "kill")


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), producers=st.integers(1, 8), g=st.integers(1, 4),
       staleness=st.integers(0, 2), steps=st.integers(50, 400))
def test_no_admitted_group_is_ever_judged_stale(seed, producers, g, staleness, steps):
    simulate(seed, producers, g, staleness, steps, chaos=True)


def test_the_simulated_deployment_trains_while_it_checks():
    trained = [simulate(seed, 8, 4, 1, 2_000, chaos=False) for seed in range(5)]
    assert min(trained) >= 60, trained  # the bound above is checked on many groups, not on none


def simulate(seed: int, producers: int, g: int, staleness: int, steps: int, *, chaos: bool) -> int:
    """Random requests, sends, batches and late marks (`chaos`: also pauses of seconds, kills and
    restarts); returns how many groups the trainer judged."""
    rng = random.Random(seed)
    actions = ACTIONS if chaos else tuple(a for a in ACTIONS if a not in ("tick", "kill"))
    log = Log(suspect_ms=3_000, lease_ms=30_000)
    trainer = Trainer(g=g, staleness=staleness)
    ps = [Producer(f"p{i}", f"p{i}-1") for i in range(producers)]
    weight: dict[int, int] = {}
    pool: list[int] = []  # sent groups, in no particular order: the pipeline may reorder anything
    judged = 0

    def mark_now() -> None:
        log.append(TrainerMark(trainer="t", session="r", weight_version=trainer.version,
                               batch_version=trainer.batch_version, batches=trainer.batches,
                               groups_per_batch=g, max_weight_staleness=staleness, consumed=trainer.consumed),
                   after_ms=rng.randrange(0, 50))
        trainer.consumed = {}

    def settle() -> None:
        for p in ps:
            for r in [r for r in p.waiting if r in log.decided]:
                p.waiting.remove(r)
                if log.decided[r] is Outcome.ADMITTED:
                    p.admitted.append(r)

    mark_now()
    for _ in range(steps):
        action = rng.choice(actions)
        p = rng.choice(ps)
        if action == "request" and p.alive:
            known = log.fold.trainers["t"].weight_version or 0
            w = max(0, known - rng.randrange(0, 2))  # a producer's weights may lag the trainer's
            r = log.append(request(producer=p.name, session=p.session, w=w, k=staleness, n=4 * g),
                           after_ms=rng.randrange(0, 100))
            weight[r] = w
            p.waiting.append(r)
        elif action == "send" and p.alive and p.admitted:
            r = p.admitted.pop(rng.randrange(len(p.admitted)))
            if log.fold.groups.get(r) is not None and log.fold.groups[r].revoked_ms is None:
                pool.append(r)  # a live producer sends only while its lease holds
                log.append(Sent(producer=p.name, session=p.session, request=r, key=f"k{r}"),
                           after_ms=rng.randrange(0, 50))
                log.append(Delivered(producer=p.name, session=p.session, request=r),
                           after_ms=rng.randrange(0, 50))
        elif action == "batch" and len(pool) >= g:
            rng.shuffle(pool)
            taken, pool[:] = pool[:g], pool[g:]
            for r in taken:  # the reader judges the batch at the version set when it completes
                assert trainer.version - weight[r] <= staleness, (
                    f"admitted group {r} (w={weight[r]}) judged at {trainer.version}")
                judged += 1
            trainer.consumed.setdefault(trainer.batches, []).extend(f"k{r}" for r in taken)
            trainer.batch_version, trainer.batches = trainer.version, trainer.batches + 1
            trainer.version += 1  # one step, one version (versions_per_batch = 1)
        elif action == "mark":
            mark_now()
        elif action == "renew" and p.alive:
            for q in ps:
                if q.alive:
                    log.append(Renew(producer=q.name, session=q.session), after_ms=rng.randrange(0, 300))
        elif action == "tick":
            pause = rng.choice([500, 2_000, 4_000])  # the next record comes this much later
            word = Renew(producer=p.name, session=p.session) if p.alive else Hello(producer="x", session="x")
            log.append(word, after_ms=pause)
        elif action == "kill" and p.alive and rng.random() < 0.3:
            p.alive = False  # its unsent groups never arrive; a restart is a new session
            p.admitted.clear()
            p.waiting.clear()
            if rng.random() < 0.5:
                p.session, p.alive = p.session + "+", True
                log.append(Hello(producer=p.name, session=p.session))
        settle()
    return judged


def test_with_a_trainer_consuming_every_request_is_answered():
    log = Log()
    g, version, batch = 2, 0, 0
    log.append(mark(v=0, g=g, s=1))
    asked = [log.append(request(producer=f"p{i % 3}", session=f"s{i % 3}", w=0, k=1)) for i in range(12)]
    pool = [r for r in asked if log.decided.get(r) is Outcome.ADMITTED]
    assert len(pool) == 2 * g
    while len([r for r in asked if r in log.decided]) < len(asked):
        taken, pool = pool[:g], pool[g:]
        assert len(taken) == g
        keys = [log.sent(r, producer=f"p{asked.index(r) % 3}", session=f"s{asked.index(r) % 3}")[0]
                for r in taken]
        log.append(mark(v=version, b=version, batches=batch + 1, g=g, s=1, consumed={batch: keys}))
        batch += 1
        version += 1
        log.append(mark(v=version, b=version - 1, batches=batch, g=g, s=1))
        pool += [r for r in asked if log.decided.get(r) is Outcome.ADMITTED and r not in pool
                 and r in log.fold.groups]
    assert {log.decided[r] for r in asked} <= {Outcome.ADMITTED, Outcome.TOO_OLD}


def test_a_group_consumed_or_resolved_before_its_sent_record_is_matched_when_that_comes():
    log = Log()
    log.append(mark(g=1))
    a, b = log.append(request(k=None, n=2)), log.append(request(k=None, n=2))
    log.append(mark(g=1, b=0, batches=1, consumed={0: [f"k{a}"]}))
    log.append(Resolved(keys=[f"k{b}"], reason="missing_members"))
    assert set(log.fold.groups) == {a, b}  # nothing names them yet
    log.sent(a, b)
    assert not log.fold.groups and not log.fold.unmatched


def test_keys_nobody_asked_for_are_forgotten_after_a_lease():
    log = Log(lease_ms=30_000)
    log.append(mark(g=1, b=0, batches=1, consumed={0: ["unpaced/1"]}))
    assert "unpaced/1" in log.fold.unmatched
    log.append(mark(g=1, b=0, batches=1), after_ms=30_000)
    assert not log.fold.unmatched


def test_a_sent_group_nobody_consumes_or_resolves_is_given_up_on_after_the_expiry():
    log = Log(sent_expiry_ms=600_000)
    log.append(mark(g=1))
    lost = log.append(request(k=None, n=1))
    log.sent(lost)
    waiting = log.append(request(k=None, n=1))
    log.append(Renew(producer="p", session="s1"), after_ms=599_000)
    assert waiting not in log.decided
    log.append(Renew(producer="p", session="s1"), after_ms=1_000)
    assert log.decided[waiting] is Outcome.ADMITTED and log.fold.expired == 1


def test_a_group_half_sent_when_its_producer_went_away_takes_no_place_but_counts():
    log = Log(suspect_ms=3_000)
    log.append(mark(v=0, g=1, s=0))
    half = log.append(request(producer="dead", session="d", w=0, k=0, n=2))
    log.sent(half, producer="dead", session="d", whole=False)  # its first records left, then it was killed
    blocked = log.append(request(producer="live", session="l", w=0, k=0, n=2))
    assert blocked not in log.decided
    log.append(Renew(producer="live", session="l"), after_ms=3_000)
    assert log.decided[blocked] is Outcome.ADMITTED  # it can never complete: it is in H
    third = log.append(request(producer="live", session="l", w=0, k=None, n=2))
    assert third not in log.decided  # ... and still counts toward n until the stage resolves it
    log.append(Resolved(keys=[f"k{half}"], reason="missing_members"))
    assert half not in log.fold.groups and log.fold.snapshot().outstanding == {"t": 1}


@pytest.mark.parametrize("staleness", [None, 3])
def test_a_group_already_past_its_bound_no_longer_holds_admissions_back(staleness):
    # Groups nobody admitted here (a late twin, an unpaced producer) fill the trainer's batches while an
    # admitted group waits: it falls past its own bound. Versions only move on, so it never comes back
    # within it; without a staleness bound it never joins H either. It must not stop every admission
    # (the trainer, one group short of a batch, would wait for good).
    log = Log()
    log.append(mark(v=0, g=2, s=staleness))
    behind = log.append(request(w=0, k=2))
    assert log.decided[behind] is Outcome.ADMITTED
    for batch in range(3):
        log.append(mark(v=batch + 1, b=batch, batches=batch + 1, g=2, s=staleness,
                        consumed={batch: [f"other{batch}.{i}" for i in range(2)]}))
    fresh = log.append(request(w=3, k=2))
    assert log.decided[fresh] is Outcome.ADMITTED
    # the late group still takes its place in line: the others' bounds count it
    more = [log.append(request(w=3, k=0)) for _ in range(2)]
    assert [log.decided.get(r) for r in more] == [None, None]
