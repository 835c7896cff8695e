"""The admission rule of pacing (core/pacing.py): tables and properties, no broker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.core.collate import is_stale_version
from rollout_stream.core.pacing import (
    PacingLimits,
    Refusal,
    admission,
    doomed_through,
    is_consumed,
    next_batch_version,
    predicted_lag,
)


@pytest.mark.parametrize("now,batch_version,step,expected", [
    (None, None, 1, None),  # no version: nothing is ever stale
    (5, None, 1, 5),  # no batch yet: the first is judged at the version set now
    (5, 5, 1, 6),  # the step of the last batch is still running: the next batch sees its version
    (6, 5, 1, 6),  # the step is done and set
    (9, 5, 1, 9),  # the trainer moved further than one per batch: what it says wins
    (5, 5, 0, 5),  # versions that do not move per batch
])
def test_next_batch_version(now, batch_version, step, expected):
    assert next_batch_version(now, batch_version, step) == expected


def test_a_trainer_without_a_version_is_assumed_to_start_at_the_producers():
    assert next_batch_version(None, None, start=3) == 3  # nothing taken yet: the first batch, at w
    assert next_batch_version(None, None, start=3, any_batch=True) == 4  # first version after a step
    assert next_batch_version(None, None, 2, start=3, any_batch=True) == 5
    assert next_batch_version(7, None, start=3) == 7  # a version set wins


@pytest.mark.parametrize("w,next_version,u,gpb,expected_lag,refused", [
    (4, 5, 0, 4, 1, None),  # the next batch, one version ahead: lag 1
    (4, 5, 3, 4, 1, None),  # still fits in the next batch
    (4, 5, 4, 4, 2, Refusal.POLICY_LAG),  # one batch later: lag 2
    (5, 5, 7, 4, 1, None),  # current weights may have a batch queued ahead
    (5, 5, 8, 4, 2, Refusal.POLICY_LAG),
    (0, None, 100, 4, None, Refusal.UNCONSUMED),  # no lag can be predicted: only the count applies
    (0, None, 15, 4, None, None),
])
def test_admission_table(w, next_version, u, gpb, expected_lag, refused):
    limits = PacingLimits(max_policy_lag=1, max_unconsumed_groups=16)
    decision = admission(w, next_version=next_version, groups_per_batch=gpb, unconsumed=u, limits=limits)
    assert decision.predicted_lag == expected_lag
    assert decision.refused is refused
    assert decision.admitted == (refused is None)
    assert ("admitted" == decision.explain(limits)) == decision.admitted


def test_a_policy_lag_bound_waits_for_the_trainer_to_say_where_it_is():
    lag_bound = PacingLimits(max_policy_lag=2, max_unconsumed_groups=8)
    waiting = admission(0, next_version=None, groups_per_batch=1, unconsumed=0, limits=lag_bound,
                        trainer_known=False)
    assert waiting.refused is Refusal.NO_TRAINER and "no progress" in waiting.explain(lag_bound)
    count_only = PacingLimits(max_unconsumed_groups=8)
    assert admission(0, next_version=None, groups_per_batch=1, unconsumed=7, limits=count_only,
                     trainer_known=False).admitted


def test_limits_are_validated_and_off_by_default():
    assert not PacingLimits().active
    off = PacingLimits()
    assert admission(0, next_version=100, groups_per_batch=1, unconsumed=10**6, limits=off).admitted
    with pytest.raises(ValueError):
        PacingLimits(max_policy_lag=-1)
    with pytest.raises(ValueError):
        PacingLimits(max_unconsumed_groups=0)
    with pytest.raises(ValueError):
        predicted_lag(0, 1, 0, 0)


@settings(max_examples=300, deadline=None)
@given(k=st.integers(0, 4), staleness_slack=st.integers(0, 3), gpb=st.integers(1, 8),
       now=st.integers(0, 50), running=st.booleans(), w_back=st.integers(0, 6), u=st.integers(0, 64))
def test_an_admitted_group_consumed_in_order_is_never_stale(k, staleness_slack, gpb, now, running, w_back,
                                                            u):
    """Replay the trainer: it takes `gpb` groups per batch and moves one version per step. A group admitted
    with `u` groups ahead of it, all consumed first, is judged no later than the rule predicts, so with
    max_weight_staleness >= max_policy_lag the reader never skips it."""
    w = now - w_back
    batch_version = now if running else now - 1  # the last batch's step is still running, or done
    limits = PacingLimits(max_policy_lag=k)
    decision = admission(w, next_version=next_batch_version(now, batch_version), groups_per_batch=gpb,
                         unconsumed=u, limits=limits)
    # The version judging the batch that holds the group: the next batch is judged after the running
    # step sets its version (now + 1 if it runs, else now); the group is u // gpb batches after it.
    judged = (now + 1 if running else now) + u // gpb
    lag = judged - w
    assert decision.predicted_lag is not None and decision.predicted_lag >= lag
    if decision.admitted:
        assert not is_stale_version(w, judged, k + staleness_slack)
    else:
        assert decision.refused is Refusal.POLICY_LAG and lag >= 0


@settings(max_examples=200, deadline=None)
@given(u=st.integers(0, 100), n=st.integers(1, 100))
def test_the_unconsumed_bound_is_a_strict_count(u, n):
    decision = admission(0, next_version=None, groups_per_batch=1, unconsumed=u,
                         limits=PacingLimits(max_unconsumed_groups=n))
    assert decision.admitted == (u < n)


def test_doomed_through_stops_at_the_first_group_of_a_partition_that_may_still_train():
    queued = [
        ([("r", 0, 3), ("r", 0, 5)], True),  # stale
        ([("r", 1, 2)], False),  # may train: partition 1's run ends here
        ([("r", 0, 8)], True),  # stale
        ([("r", 1, 9)], True),  # stale, behind a group of its partition that may train
        ([("r", 0, 12)], False),
        ([("r", 0, 15)], True),  # behind the group at 12
        ([("x", 0, 1)], True),  # another source topic
    ]
    assert doomed_through(queued) == {"r": {0: 8}, "x": {0: 1}}
    assert doomed_through([]) == {}
    assert doomed_through([([("r", 0, 1)], False)]) == {}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.booleans()), max_size=30))
def test_doomed_through_never_passes_a_group_that_may_train(groups):
    """Groups in one source partition queue in offset order; no group that may train is ever at or below the
    watermark of its partition."""
    queued = [([("r", p, i)], doomed) for i, (p, doomed) in enumerate(groups)]
    through = doomed_through(queued).get("r", {})
    for i, (p, doomed) in enumerate(groups):
        if not doomed:
            assert through.get(p, -1) < i


@pytest.mark.parametrize("partition,last,through,expected", [
    (0, 10, {0: 10}, True),
    (0, 10, {0: 9}, False),
    (0, 10, {1: 50}, False),  # another partition says nothing of this one
    (0, None, {0: 50}, False),  # not acknowledged yet: cannot be consumed
    (None, None, {}, False),
])
def test_is_consumed(partition, last, through, expected):
    assert is_consumed(partition, last, through) is expected
