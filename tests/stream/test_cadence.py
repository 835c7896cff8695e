"""The commit cadence shared by the worker and the benchmark's passthrough."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stream.cadence import POLL_MS, CommitCadence


def test_due_by_interval_or_by_records():
    c = CommitCadence(interval_s=0.1, max_records=3)
    c.committed(10.0)
    assert not c.due(10.05)
    assert c.due(10.11)
    c.uncommitted = 3
    assert c.due(10.01)
    c.committed(10.02)
    assert c.uncommitted == 0 and not c.due(10.03)
    c.soon()
    assert c.due(10.03) and c.poll_timeout_ms(10.03) == 0


def test_poll_waits_a_full_poll_only_with_nothing_to_commit():
    c = CommitCadence(interval_s=0.1, max_records=1000)
    c.committed(5.0)
    assert c.poll_timeout_ms(5.01) == POLL_MS  # nothing read since the commit
    c.uncommitted = 1
    assert c.poll_timeout_ms(5.01) == 90  # a finished group waits for the commit, not for the poll
    assert c.poll_timeout_ms(5.2) == 0


@given(interval=st.floats(0.001, 10), since=st.floats(0, 20), uncommitted=st.integers(0, 10))
def test_a_poll_never_outlasts_a_due_commit(interval, since, uncommitted):
    c = CommitCadence(interval_s=interval, max_records=1 << 30, last=100.0, uncommitted=uncommitted)
    now = 100.0 + since
    timeout = c.poll_timeout_ms(now)
    assert 0 <= timeout <= POLL_MS
    if uncommitted:
        # the poll returns by the time the commit is due (rounded up to the next millisecond)
        assert now + timeout / 1000 <= max(now, 100.0 + interval) + 0.001
