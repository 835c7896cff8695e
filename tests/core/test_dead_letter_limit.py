"""rollout_stream.core.dead_letter_limit: the sliding window of resolved records and when it says stop."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.core.dead_letter_limit import MAX_WINDOW, DeadLetterLimit, DeadLetterWindow, LimitExceeded


def feed(window: DeadLetterWindow, outcomes: list[tuple[str | None, int]]) -> list[LimitExceeded | None]:
    return [window.published(n) if reason is None else window.dead_lettered_as(reason, n)
            for reason, n in outcomes]


@pytest.mark.parametrize(
    ("max_ratio", "size", "outcomes", "stops_at"),
    [
        # not judged until the window is full, however bad the start
        (0.4, 10, [("decode_error", 9)], None),
        (0.4, 10, [("decode_error", 9), (None, 1)], 1),
        # exactly the bound is not more than the bound
        (0.5, 10, [(None, 5), ("late_member", 5)], None),
        (0.5, 10, [(None, 5), ("late_member", 5), ("late_member", 1)], 2),
        # 0: the first dead-letter in a full window stops; 1: nothing ever stops
        (0.0, 4, [(None, 4), ("invalid_sample", 1)], 1),
        (0.0, 4, [("invalid_sample", 1), (None, 4)], None),  # slid out before the window was judged bad
        (1.0, 4, [("invalid_sample", 100)], None),
        # old dead-letters slide out: a bad start followed by a healthy stream never stops
        (0.4, 10, [("incomplete_group", 3), (None, 100), ("incomplete_group", 3)], None),
        # one group larger than the window counts only its newest records
        (0.4, 10, [(None, 8), ("shared_reward_violation", 48)], 1),
    ],
)
def test_stops_only_on_a_full_window_above_the_bound(max_ratio, size, outcomes, stops_at):
    verdicts = feed(DeadLetterWindow(DeadLetterLimit(max_ratio, size)), outcomes)
    first = next((i for i, v in enumerate(verdicts) if v is not None), None)
    assert first == stops_at


def test_the_verdict_names_counts_and_reasons_most_frequent_first():
    window = DeadLetterWindow(DeadLetterLimit(0.4, 20))
    feed(window, [(None, 8), ("late_member", 2), ("invalid_sample", 9)])
    verdict = window.dead_lettered_as("decode_error", 1)
    assert verdict is not None
    assert (verdict.dead_lettered, verdict.resolved, verdict.ratio) == (12, 20, 0.6)
    assert verdict.by_reason == (("invalid_sample", 9), ("late_member", 2), ("decode_error", 1))
    assert verdict.describe() == (
        "12 of the last 20 resolved input records were dead-lettered "
        "(60.0%: invalid_sample 9, late_member 2, decode_error 1), more than the limit of 40%"
    )


def test_a_partly_slid_out_run_keeps_its_remainder():
    window = DeadLetterWindow(DeadLetterLimit(1.0, 10))
    feed(window, [("late_member", 6), (None, 7)])
    assert (window.resolved, window.dead_lettered, window.ratio) == (10, 3, 0.3)


def test_empty_window_and_zero_sized_outcomes():
    window = DeadLetterWindow(DeadLetterLimit(0.0, 1))
    assert window.ratio == 0.0
    assert window.dead_lettered_as("decode_error", 0) is None
    assert window.resolved == 0


@pytest.mark.parametrize(
    ("max_ratio", "size", "message"),
    [
        (-0.1, 10, "max_ratio must be between 0 and 1, got -0.1"),
        (1.5, 10, "max_ratio must be between 0 and 1, got 1.5"),
        (float("nan"), 10, "max_ratio must be between 0 and 1, got nan"),
        (0.4, 0, f"window must be between 1 and {MAX_WINDOW}, got 0"),
        (0.4, MAX_WINDOW + 1, f"window must be between 1 and {MAX_WINDOW}, got {MAX_WINDOW + 1}"),
    ],
)
def test_limits_out_of_range_are_refused(max_ratio, size, message):
    with pytest.raises(ValueError) as info:
        DeadLetterLimit(max_ratio, size)
    assert str(info.value) == message


def test_enabled_unless_the_bound_is_everything():
    assert DeadLetterLimit().enabled and DeadLetterLimit(0.0).enabled
    assert not DeadLetterLimit(1.0).enabled


REASONS = st.sampled_from([None, None, "decode_error", "invalid_sample", "late_member"])
OUTCOMES = st.lists(st.tuples(REASONS, st.integers(0, 30)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(outcomes=OUTCOMES, size=st.integers(1, 50), max_ratio=st.floats(0.0, 1.0))
def test_matches_a_record_by_record_model(outcomes, size, max_ratio):
    """The window equals the last `size` records of the flat sequence; it stops exactly when that is full
    and more than max_ratio of it is dead-lettered."""
    window = DeadLetterWindow(DeadLetterLimit(max_ratio, size))
    records: list[str | None] = []
    for reason, n in outcomes:
        verdict = window.published(n) if reason is None else window.dead_lettered_as(reason, n)
        records.extend([reason] * n)
        last = records[-size:]
        bad = Counter(r for r in last if r is not None)
        assert (window.resolved, window.dead_lettered) == (len(last), sum(bad.values()))
        should_stop = n > 0 and len(last) == size and sum(bad.values()) > max_ratio * size
        assert (verdict is not None) == should_stop
        if verdict is not None:
            assert dict(verdict.by_reason) == dict(bad)
            assert verdict.ratio > max_ratio


@settings(max_examples=200, deadline=None)
@given(outcomes=OUTCOMES, size=st.integers(1, 50))
def test_a_window_with_no_dead_letter_never_stops_even_at_bound_zero(outcomes, size):
    window = DeadLetterWindow(DeadLetterLimit(0.0, size))
    assert all(window.published(n) is None for _reason, n in outcomes)


@settings(max_examples=200, deadline=None)
@given(outcomes=OUTCOMES, size=st.integers(1, 50))
def test_memory_is_bounded_by_the_window(outcomes, size):
    window = DeadLetterWindow(DeadLetterLimit(0.5, size))
    feed(window, outcomes)
    assert window.resolved <= size
    assert len(window._runs) <= size
    assert sum(run.count for run in window._runs) == window.resolved
