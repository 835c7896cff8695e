"""The prompt fold (core/prompts.py): every prompt of an epoch ends in exactly one final state, none trains
twice, whatever the interleaving of takes, deliveries, crashes, stale skips and trainer commits."""

from __future__ import annotations

import os
from collections import Counter

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_stream.codec.admission import Dataset, Release, Resolved
from rollout_stream.core.checkpoint import FOLD_VERSION, CheckpointMismatch, dump_fold, load_fold
from rollout_stream.core.prompt_keys import AttemptKey, PromptFence, parse_attempt_key
from rollout_stream.core.prompts import AttemptEnd, PromptLog, PromptState, epoch_order
from tests.core.prompt_world import SOURCE, World

FINAL = {PromptState.TRAINED, PromptState.DEAD_LETTERED, PromptState.FILTERED, PromptState.EXHAUSTED}


def states(world: World) -> dict[tuple[int, int], PromptState]:
    out = {}
    for epoch in range(world.epochs):
        for prompt in range(world.prompts):
            rec = world.fold.prompt(SOURCE, epoch, prompt)
            out[(epoch, prompt)] = PromptState.WAITING if rec is None else rec.state
    return out


def check_settled(world: World) -> None:
    """Every prompt final; trained in the fold iff the trainer really trained it, and then exactly once."""
    for (epoch, prompt), state in states(world).items():
        assert state in FINAL, (epoch, prompt, state)
        truth = world.trained[(SOURCE, epoch, prompt)]
        assert truth <= 1, (epoch, prompt, truth)
        assert (state is PromptState.TRAINED) == (truth == 1), (epoch, prompt, state, truth)
    assert world.fold.duplicates == 0
    assert not world.fold.groups  # the admission fold beneath saw every group consumed or resolved
    total = sum(s.trained + sum(s.dead_lettered.values()) + s.filtered + s.exhausted
                for s in world.fold.status(SOURCE))
    assert total == world.prompts * world.epochs


def test_keys_name_the_attempt() -> None:
    key = AttemptKey("gsm8k-train", 2, 3, 41)
    assert str(key) == "gsm8k-train@2.3/41"
    assert parse_attempt_key(str(key)) == key
    assert parse_attempt_key("run-1/41") is None
    assert parse_attempt_key("41") is None


def test_the_fence_lets_one_attempt_of_a_prompt_train() -> None:
    fence = PromptFence({(SOURCE, 0, 5)})
    assert not fence.admit(f"{SOURCE}@0.2/5")  # trained before the reader resumed
    assert fence.admit(f"{SOURCE}@0.1/6")
    assert not fence.admit(f"{SOURCE}@0.2/6")  # a second attempt of the same prompt
    assert fence.admit(f"{SOURCE}@1.1/6")  # the next epoch's is another prompt
    assert fence.admit("plain/6")
    assert fence.admit(f"{SOURCE}@0.1/6")  # the same group asked again: the same answer
    fence.release(f"{SOURCE}@0.1/6")  # it went stale while it waited
    assert fence.admit(f"{SOURCE}@0.2/6")
    fence.release(f"{SOURCE}@0.1/6")  # not its claim any more: nothing changes
    assert not fence.admit(f"{SOURCE}@0.3/6")


def test_epoch_order_is_a_seeded_permutation() -> None:
    assert sorted(epoch_order(50, 7, 0)) == list(range(50))
    assert epoch_order(50, 7, 0) == epoch_order(50, 7, 0)
    assert epoch_order(50, 7, 0) != epoch_order(50, 7, 1)


def test_takes_follow_the_order_and_the_next_epoch_waits_for_this_one() -> None:
    w = World(prompts=4, epochs=2)
    for _ in range(6):
        w.take(0)
    taken = [(a.epoch, a.prompt) for _, a, _ in w.producers[0].holding]
    order0, order1 = epoch_order(4, 7, 0), epoch_order(4, 7, 1)
    assert taken == [(0, p) for p in order0] + [(1, p) for p in order1[:2]]
    assert [s.in_flight for s in w.fold.status(SOURCE)] == [4, 2]


def test_a_dead_producer_s_prompt_is_reissued_first_and_trains_once() -> None:
    w = World(prompts=3)
    w.take(0)
    lost = w.producers[0].holding[0][1]
    w.kill(0)  # its Hello ends the old session: the attempt can never complete
    rec = w.fold.prompt(SOURCE, 0, lost.prompt)
    assert rec is not None and rec.state is PromptState.WAITING
    w.take(1)
    again = w.producers[1].holding[0][1]
    assert (again.prompt, again.attempt) == (lost.prompt, 2)
    w.drain()
    check_settled(w)
    assert w.fold.status(SOURCE)[0].reissued == 1


def test_a_frozen_producer_s_late_group_does_not_train_a_second_copy() -> None:
    w = World(prompts=2, groups_per_batch=1)
    w.take(0)
    first = w.producers[0].holding[0][1]
    w.freeze_mid_send(0)
    w.tick(35_000)  # past its lease: re-issued
    w.take(1)
    assert w.producers[1].holding[0][1].prompt == first.prompt
    w.send(1)
    w.stage_step()
    w.train_batch([])
    w.commit()  # attempt 2 trained
    w.resume(0)  # attempt 1's group completes now, and reaches train-data
    w.stage_step()
    w.train_batch([])  # the fence refuses it
    w.commit()
    w.drain()
    check_settled(w)


def test_stale_skips_and_timeouts_are_reissued_until_exhausted() -> None:
    w = World(prompts=2, max_attempts=3, groups_per_batch=1)  # 2: the epoch stays open, its history kept
    for _ in range(3):
        w.take(0)
        w.send(0)
        w.stage_step()
        w.train_batch([True])  # skipped stale
        w.commit()
    rec = w.fold.prompt(SOURCE, 0, epoch_order(2, 7, 0)[0])
    assert rec is not None and rec.state is PromptState.EXHAUSTED
    assert rec.reason == "prompt_attempts_exhausted"
    assert [a.ended.value if a.ended else None for a in rec.attempts] == ["skipped"] * 3


def test_a_finished_epoch_keeps_each_prompt_s_outcome_and_drops_its_history() -> None:
    w = World(prompts=4, epochs=2, groups_per_batch=1)
    w.take(0)
    w.send(0)
    w.stage_step("shared_reward_violation")
    w.drain()
    check_settled(w)
    epoch = w.fold.sources[SOURCE].epochs[0]
    assert epoch.settled and not epoch.prompts
    assert w.fold.status(SOURCE)[0].dead_lettered == {"shared_reward_violation": 1}
    assert len(w.fold.trained(SOURCE)) == 7


def test_data_reasons_are_final_and_zero_variance_is_filtered() -> None:
    w = World(prompts=3, groups_per_batch=1)
    for verdict in ("shared_reward_violation", "zero_variance", "incomplete_group"):
        w.take(0)
        w.send(0)
        w.stage_step(verdict)
    status = w.fold.status(SOURCE)[0]
    assert status.dead_lettered == {"shared_reward_violation": 1}
    assert status.filtered == 1 and status.waiting == 1 and status.reissued == 1
    w.drain()
    check_settled(w)


def test_refills_count_toward_the_next_committed_batch_that_trains_a_group_of_the_source() -> None:
    """Zero-variance groups settle their prompts as filtered; the next takes are other prompts, so every
    batch holds `groups_per_batch` groups with signal, and each filtered prompt counts as a refill of the
    batch it was replaced in."""
    w = World(prompts=9, groups_per_batch=2)
    for verdicts in (["zero_variance", "publish", "zero_variance", "publish"], ["publish", "publish"],
                     ["zero_variance", "publish", "publish"]):
        for verdict in verdicts:
            w.take(0)
            w.send(0)
            w.stage_step(verdict)
        w.train_batch([])
        w.commit()
    src = w.fold.sources[SOURCE]
    assert w.committed == 3 and sum(w.trained.values()) == 6  # three full batches of groups with signal
    assert src.refills == 3 and src.refills_pending == 0
    assert src.batch_refills == {2: 1, 0: 1, 1: 1}  # batches by refills: one of 2, one of 0, one of 1
    status = w.fold.status(SOURCE)[0]
    assert status.filtered == 3 and status.trained == 6 and status.waiting == 0
    tail = load_fold(dump_fold(w.fold), FOLD_VERSION)  # the counts travel in a checkpoint
    assert tail.sources[SOURCE].batch_refills == src.batch_refills and tail.sources[SOURCE].refills == 3


def test_an_uncommitted_batch_is_not_trained_until_it_is() -> None:
    w = World(prompts=2, groups_per_batch=2)
    for _ in range(2):
        w.take(0)
        w.send(0)
        w.stage_step()
    w.train_batch([])
    assert w.fold.status(SOURCE)[0].trained == 0
    w.restart_trainer()  # killed before its commit: the batch is read again
    assert w.fold.status(SOURCE)[0].trained == 0
    w.train_batch([])
    w.commit()
    assert w.fold.status(SOURCE)[0].trained == 2
    check_settled(w)


VERDICTS = {"stage": "publish", "dead": "invalid_sample", "filter": "zero_variance"}
STEPS = st.lists(st.tuples(
    st.sampled_from(["take", "send", "half", "freeze", "resume", "kill", "stage", "dead", "filter",
                     "train", "stale", "commit", "restart", "tick", "fail", "wait", "stop", "wake"]),
    st.integers(0, 2)), max_size=80)


def play(steps: list[tuple[str, int]], prompts: int, epochs: int) -> World:
    w = World(prompts=prompts, epochs=epochs)
    for action, i in steps:
        match action:
            case "take":
                w.take(i)
            case "wait":
                w.take(i, wait=True)
            case "stop":
                w.freeze(i)
            case "wake":
                w.resume(i, same_session=True)
            case "send":
                w.send(i)
            case "half":
                w.send(i, whole=False)
            case "freeze":
                w.freeze_mid_send(i)
            case "resume":
                w.resume(i)
            case "kill":
                w.kill(i)
            case "fail":
                w.fail(i)
            case "stage" | "dead" | "filter":
                w.stage_step(VERDICTS[action])
            case "train" | "stale":
                w.train_batch([action == "stale"] * w.groups_per_batch)
            case "commit":
                w.commit()
            case "restart":
                w.restart_trainer()
            case "tick":
                w.tick(1000 * (i * 20 + 1))
        counts = Counter(states(w).values())
        assert sum(counts.values()) == prompts * epochs  # exactly one state each, at every step
        check_one_truth(w)
    return w


EXAMPLES = int(os.environ.get("PROMPT_EXAMPLES", "150"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, prompts=st.integers(1, 6), epochs=st.integers(1, 2))
def test_any_interleaving_settles_every_prompt_once(steps: list[tuple[str, int]], prompts: int,
                                                    epochs: int) -> None:
    w = play(steps, prompts, epochs)
    w.drain()
    check_settled(w)


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, prompts=st.integers(1, 6), cut=st.floats(0, 1))
def test_a_fold_loaded_from_a_checkpoint_goes_on_as_the_whole_fold(steps: list[tuple[str, int]],
                                                                    prompts: int, cut: float) -> None:
    w = play(steps, prompts, 2)
    w.drain()
    k = int(len(w.records) * cut)
    head = PromptLog()
    for offset, ms, record in w.records[:k]:
        head.apply(offset, ms, record)
    tail = load_fold(dump_fold(head), FOLD_VERSION)
    for offset, ms, record in w.records[k:]:
        tail.apply(offset, ms, record)
    assert dump_fold(tail) == dump_fold(w.fold)
    assert tail.status(SOURCE) == w.fold.status(SOURCE)


def test_a_checkpoint_of_another_fold_version_is_refused() -> None:
    with pytest.raises(CheckpointMismatch):
        load_fold(dump_fold(PromptLog()), FOLD_VERSION + 1)
    with pytest.raises(CheckpointMismatch):
        load_fold(b"\x01", FOLD_VERSION)


@pytest.mark.parametrize("reason", ["incomplete_chunks", "incomplete_group"])
def test_timeouts_count_as_attempts(reason: str) -> None:
    w = World(prompts=1, max_attempts=2)
    for _ in range(2):
        w.take(0)
        w.send(0)
        w.stage_step(reason)
    rec = w.fold.prompt(SOURCE, 0, 0)
    assert rec is not None and rec.state is PromptState.EXHAUSTED


def test_the_prompt_fold_decides_every_admission_as_the_admission_fold_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The admission tests, run again on PromptLog: a prompt fold adds to the rule and never changes it."""
    import inspect

    import tests.core.test_admission as admission_tests

    monkeypatch.setattr(admission_tests, "AdmissionLog", PromptLog)
    ran = 0
    for name, test in vars(admission_tests).items():
        if not name.startswith("test_") or not callable(test):
            continue
        if inspect.signature(test).parameters and not hasattr(test, "hypothesis"):
            continue  # parametrized by pytest: its cases run in its own module
        test()
        ran += 1
    assert ran >= 15


def test_an_exhausted_prompt_waits_for_its_dead_letter_record_until_a_marker_says_it_is_written() -> None:
    """The fold lists an exhausted prompt as unrecorded, with its attempts (kept though its epoch settles),
    until the first `prompt_attempts_exhausted` marker naming its last attempt; a later marker is a no-op."""
    w = World(prompts=1, max_attempts=2, groups_per_batch=1)
    for _ in range(2):
        w.take(0)
        w.kill(0)  # its lease ends: an attempt without a result
    status = w.fold.status(SOURCE)[0]
    assert status.exhausted == 1
    [x] = w.fold.unrecorded(SOURCE)
    assert (x.epoch, x.prompt) == (0, 0) and [a.ended for a in x.attempts] == [AttemptEnd.LEASE] * 2
    assert w.fold.sources[SOURCE].epochs[0].settled  # the epoch forgot the attempts; x has them
    tail = load_fold(dump_fold(w.fold), FOLD_VERSION)
    assert [(y.epoch, y.prompt, len(y.attempts)) for y in tail.unrecorded(SOURCE)] == [(0, 0, 2)]
    w.log(Resolved(keys=[f"{SOURCE}@0.2/0"], reason="prompt_attempts_exhausted"))
    w.log(Resolved(keys=[f"{SOURCE}@0.2/0"], reason="prompt_attempts_exhausted"))  # a second: nothing
    assert w.fold.unrecorded(SOURCE) == [] and w.fold.sources[SOURCE].recorded == 1
    assert w.fold.status(SOURCE)[0].exhausted == 1  # the marker changes no state


def check_one_truth(w: World) -> None:
    """Trained and exhausted exclude each other in every view: the fold's state, `status`, the dead-letter
    records due or written (unrecorded, recorded) and the trainer's truth."""
    listed = {(x.epoch, x.prompt) for x in w.fold.unrecorded(SOURCE)}
    for (epoch, prompt), state in states(w).items():
        truth = w.trained[(SOURCE, epoch, prompt)]
        if (epoch, prompt) in listed:
            assert state is PromptState.EXHAUSTED and truth == 0, (epoch, prompt, state, truth)
        if state is PromptState.EXHAUSTED:
            assert truth == 0, (epoch, prompt)
    assert w.fold.late_trained == 0
    src = w.fold.sources[SOURCE]
    exhausted = sum(s.exhausted for s in w.fold.status(SOURCE))
    assert exhausted == src.recorded + len(src.unrecorded)


def late_group_world(max_attempts: int) -> World:
    """Prompt 0 (of 2) handed out `max_attempts` times; its first attempt half sent, then its process frozen
    past its lease; every later attempt killed before sending."""
    w = World(prompts=2, max_attempts=max_attempts, groups_per_batch=1)
    w.take(0)
    assert w.producers[0].holding[0][1].prompt == epoch_order(2, 7, 0)[0]
    w.freeze_mid_send(0)
    w.tick(31_000)
    for _ in range(max_attempts - 1):
        w.take(1)
        w.kill(1)
    return w


@pytest.mark.parametrize("max_attempts", [1, 2])
def test_a_prompt_whose_lapsed_group_may_still_train_is_not_exhausted_until_it_cannot(
        max_attempts: int) -> None:
    """Its attempts are spent, but the frozen process's sent group may still arrive: the prompt stays in
    flight (no dead-letter record due); the group arrives and trains, and the prompt is trained, never
    exhausted."""
    w = late_group_world(max_attempts)
    prompt = epoch_order(2, 7, 0)[0]
    rec = w.fold.prompt(SOURCE, 0, prompt)
    assert rec is not None and rec.state is PromptState.IN_FLIGHT
    assert [a.ended for a in rec.attempts] == [AttemptEnd.LEASE] * max_attempts
    assert w.fold.unrecorded(SOURCE) == [] and w.fold.status(SOURCE)[0].exhausted == 0
    check_one_truth(w)
    w.resume(0)  # the rest of its group arrives; it trains
    w.stage_step()
    w.train_batch([])
    w.commit()
    rec = w.fold.prompt(SOURCE, 0, prompt)
    assert rec is not None and rec.state is PromptState.TRAINED
    assert w.fold.unrecorded(SOURCE) == [] and w.fold.late_trained == 0
    status = w.fold.status(SOURCE)[0]
    assert (status.trained, status.exhausted) == (1, 0)
    check_one_truth(w)
    w.drain()
    check_settled(w)
    check_one_truth(w)


@pytest.mark.parametrize("fate", ["incomplete_group", "stale"])
def test_a_lapsed_group_that_cannot_train_exhausts_its_prompt_once(fate: str) -> None:
    w = late_group_world(2)
    prompt = epoch_order(2, 7, 0)[0]
    if fate == "stale":
        w.resume(0)
        w.stage_step()
        w.train_batch([True])
        w.commit()
    else:
        w.kill(0)  # its half group never completes: the stage times it out
        w.stage_step()
    rec = w.fold.prompt(SOURCE, 0, prompt)
    assert rec is not None and rec.state is PromptState.EXHAUSTED
    [x] = w.fold.unrecorded(SOURCE)
    assert (x.epoch, x.prompt) == (0, prompt)
    check_one_truth(w)
    w.drain()
    check_settled(w)
    check_one_truth(w)


def test_a_lapsed_group_that_never_comes_back_exhausts_its_prompt_at_the_sent_expiry() -> None:
    w = late_group_world(1)
    prompt = epoch_order(2, 7, 0)[0]
    w.tick(14 * 60_000)
    assert w.fold.unrecorded(SOURCE) == []
    w.tick(60_000)
    [x] = w.fold.unrecorded(SOURCE)
    assert x.prompt == prompt
    tail = load_fold(dump_fold(w.fold), FOLD_VERSION)
    assert tail.status(SOURCE) == w.fold.status(SOURCE)


@pytest.mark.parametrize("same_session", [False, True])
def test_a_freeze_spends_only_the_attempts_that_lapsed(same_session: bool) -> None:
    """A process holding both prompts, with two more takes waiting, is frozen past its lease: its waiting
    takes are handed nothing while its lease is out, so each prompt is charged the one attempt that lapsed
    and goes to the other processes (or, were they idle, to the frozen one once it renews)."""
    w = World(prompts=2, max_attempts=2, groups_per_batch=1)
    w.take(0)
    w.take(0)
    w.take(0, wait=True)
    w.take(0, wait=True)
    assert len(w.producers[0].holding) == 2 and len(w.producers[0].waiting) == 2
    w.freeze(0)
    w.tick(5_000)  # past its lease (3 s), its session not ended (30 s)
    for prompt in range(2):
        rec = w.fold.prompt(SOURCE, 0, prompt)
        assert rec is not None and rec.state is PromptState.WAITING
        assert [a.ended for a in rec.attempts] == [AttemptEnd.LEASE]
    assert len(w.producers[0].waiting) == 2  # asked, granted nothing
    if same_session:
        w.resume(0, same_session=True)  # it renews: now its waiting takes get the prompts, as attempt 2
        taker = 0
    else:
        w.take(1)
        w.take(2)
        taker = 1
    granted = [h[1] for p in w.producers if not p.frozen for h in p.holding]
    assert sorted((a.prompt, a.attempt) for a in granted) == [(0, 2), (1, 2)]
    assert w.producers[taker].holding
    for i, p in enumerate(w.producers):
        while p.holding and not p.frozen:
            w.send(i)
    while w.stage:
        w.stage_step()
    while w.train_data:
        w.train_batch([])
    w.commit()
    status = w.fold.status(SOURCE)[0]
    assert (status.trained, status.exhausted, status.reissued) == (2, 0, 2)
    w.drain()
    check_settled(w)
    check_one_truth(w)


def test_a_frozen_process_s_waiting_takes_are_ended_with_its_session() -> None:
    w = World(prompts=1, max_attempts=2, groups_per_batch=1)
    w.take(0)
    w.take(0, wait=True)
    w.freeze(0)
    w.tick(31_000)  # its session ends: the waiting take is revoked, nothing charged for it
    assert w.producers[0].waiting == [] or w.fold.decided[w.producers[0].waiting[0]] is not None
    rec = w.fold.prompt(SOURCE, 0, 0)
    assert rec is not None and rec.state is PromptState.WAITING
    assert [a.ended for a in rec.attempts] == [AttemptEnd.LEASE]
    w.drain()
    check_settled(w)


def test_a_poison_row_fails_its_attempts_and_is_exhausted_with_its_errors_while_the_run_goes_on() -> None:
    """A row every process raises on: each failure ends its attempt as failed (counted, its error kept),
    the prompt comes back after other re-issues, and after `max_attempts` it is exhausted and listed for its
    dead-letter record with every attempt's error; the other prompts train."""
    w = World(prompts=3, max_attempts=3, groups_per_batch=1)
    poison = epoch_order(3, 7, 0)[0]
    for n in range(3):
        w.take(0)
        held = w.producers[0].holding[0][1]
        assert (held.prompt, held.attempt) == (poison, n + 1)  # a crash-looping process takes it first
        w.fail(0, f"KeyError: 'answer' (run {n})")
        w.kill(0)  # and restarts
    rec = w.fold.prompt(SOURCE, 0, poison)
    assert rec is not None and rec.state is PromptState.EXHAUSTED
    assert [(a.ended, a.error) for a in rec.attempts] == [
        (AttemptEnd.FAILED, f"KeyError: 'answer' (run {n})") for n in range(3)]
    [x] = w.fold.unrecorded(SOURCE)
    assert [a.error for a in x.attempts] == [f"KeyError: 'answer' (run {n})" for n in range(3)]
    assert w.fold.status(SOURCE)[0].reissued_by == {"failed": 2}
    w.take(0)
    assert w.producers[0].holding[0][1].prompt != poison  # the next take hands out another prompt
    w.drain()
    check_settled(w)
    assert w.fold.status(SOURCE)[0].trained == 2 and w.fold.status(SOURCE)[0].exhausted == 1


def test_a_failed_prompt_comes_back_after_the_prompts_re_issued_before_it() -> None:
    w = World(prompts=3, groups_per_batch=1)
    w.take(0)
    w.take(1)
    first, second = w.producers[0].holding[0][1], w.producers[1].holding[0][1]
    w.kill(1)  # its lease ends first: re-issued first
    w.fail(0)
    w.take(2)
    w.take(2)
    assert [a.prompt for _, a, _ in w.producers[2].holding] == [second.prompt, first.prompt]


def test_a_give_back_stays_free_and_a_failure_after_sending_leaves_the_attempt_to_its_group() -> None:
    w = World(prompts=2, max_attempts=1, groups_per_batch=1)
    w.take(0)
    request, key, _ = w.producers[0].holding.pop(0)
    w.log(Release(producer="p0", session=w.producers[0].sid, requests=[request]))  # give_back
    rec = w.fold.prompt(SOURCE, 0, key.prompt)
    assert rec is not None and rec.state is PromptState.WAITING
    assert rec.attempts[0].ended is AttemptEnd.RELEASED
    w.take(0)
    request, key, _ = w.producers[0].holding[0]
    w.send(0)
    # raised after its group went out: the group may still train, so the attempt goes on, the error kept
    w.log(Release(producer="p0", session=w.producers[0].sid, requests=[request], error="OSError: disk full"))
    rec = w.fold.prompt(SOURCE, 0, key.prompt)
    assert rec is not None and rec.state is PromptState.IN_FLIGHT
    assert (rec.attempts[-1].ended, rec.attempts[-1].error) == (None, "OSError: disk full")
    w.stage_step()
    w.train_batch([])
    w.commit()
    assert rec.state is PromptState.TRAINED


def test_a_failure_written_by_another_session_is_not_this_attempt_s() -> None:
    w = World(prompts=1)
    w.take(0)
    request, key, _ = w.producers[0].holding[0]
    w.log(Release(producer="p0", session="someone-else", requests=[request], error="KeyError: 'x'"))
    rec = w.fold.prompt(SOURCE, 0, key.prompt)
    assert rec is not None and rec.state is PromptState.IN_FLIGHT and rec.attempts[0].error is None


def test_a_failed_attempt_s_error_travels_in_a_checkpoint() -> None:
    w = World(prompts=2)
    w.take(0)
    w.fail(0, "ValueError: bad row")
    tail = load_fold(dump_fold(w.fold), FOLD_VERSION)
    rec = tail.prompt(SOURCE, 0, epoch_order(2, 7, 0)[0])
    assert rec is not None and rec.attempts[0].error == "ValueError: bad row"
    assert rec.attempts[0].ended is AttemptEnd.FAILED


def test_a_group_trained_in_part_trains_its_prompt_and_says_what_was_left_out() -> None:
    """Staleness by rollout or token: a group that trains any rollout trains its prompt; the rollouts and
    loss tokens left out stay on its attempt and count per epoch, through a checkpoint and a trainer's
    restart (what it had not committed is read and judged again)."""
    w = World(prompts=5, groups_per_batch=2)  # one prompt never taken: the epoch stays open, attempts kept
    for _ in range(4):
        w.take(0)
    for _ in range(4):
        w.send(0)
    while w.stage:
        w.stage_step()
    first, second = w.train_data[0], w.train_data[2]
    w.train_batch([], left_out={0: (1, 40)})
    w.commit()
    w.train_batch([], left_out={0: (3, 120)})
    w.restart_trainer()  # the uncommitted batch's exclusions are not counted
    w.train_batch([], left_out={0: (2, 80)})
    w.commit()
    for tail in (w.fold, load_fold(dump_fold(w.fold), FOLD_VERSION)):
        [epoch] = tail.status(SOURCE)
        assert (epoch.trained, epoch.partial, epoch.excluded_rollouts, epoch.excluded_tokens) == \
            (4, 2, 3, 120)
        for key, parts in ((first, (1, 40)), (second, (2, 80))):
            parsed = parse_attempt_key(key)
            assert parsed is not None
            rec = tail.prompt(SOURCE, 0, parsed.prompt)
            assert rec is not None and rec.state is PromptState.TRAINED
            assert (rec.attempts[-1].excluded_rollouts, rec.attempts[-1].excluded_tokens) == parts
        assert tail.excluded == {}


@pytest.mark.parametrize("bad", [{"epochs": 0}, {"epochs": -1}, {"prompts": 0}, {"max_attempts": 0}])
def test_a_declaration_nothing_can_be_taken_from_is_ignored_so_the_corrected_one_stands(
        bad: dict[str, int]) -> None:
    """A process of an older version wrote it (today's refuses such settings before writing): a process
    with the corrected settings is not refused over it."""
    fold = PromptLog()
    good = Dataset(source=SOURCE, prompts=4, fingerprint="f", epochs=1)
    fold.apply(0, 0, msgspec.structs.replace(good, **bad))
    assert SOURCE not in fold.sources
    fold.apply(1, 0, good)
    assert fold.sources[SOURCE].dataset == good and fold.sources[SOURCE].refused == 0
