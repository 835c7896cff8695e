"""The offset ledger against its definition: a partition's position to commit is its lowest held offset not
yet resolved, or one past the highest held when all are; never behind what was committed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.core.offsets import OffsetLedger

# Steps on two partitions: hold an offset, resolve one, or commit what is due. Offsets mostly ascend, as a
# consumer hands them out; some go back (a partition read again from its last commit after a restore).
step = st.one_of(
    st.tuples(st.just("hold"), st.integers(0, 1), st.integers(-3, 6)),
    st.tuples(st.just("resolve"), st.integers(0, 1), st.integers(0, 60)),
    st.tuples(st.just("commit"), st.just(0), st.just(0)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(step, max_size=120))
def test_due_positions_follow_the_definition(steps):
    ledger = OffsetLedger()
    held: dict[int, list[int]] = {0: [], 1: []}
    resolved: dict[int, set[int]] = {0: set(), 1: set()}
    committed: dict[int, int] = {}
    cursor = {0: 0, 1: 0}
    for kind, p, n in steps:
        if kind == "hold":
            offset = max(0, cursor[p] + n)  # n < 0: read again from an earlier offset
            cursor[p] = offset + 1
            ledger.hold(p, offset)
            held[p].append(offset)
            resolved[p].discard(offset)
        elif kind == "resolve":
            ledger.resolve(p, (n,))
            if n in held[p]:
                resolved[p].add(n)
        else:
            due = ledger.due()
            expected = {}
            for q in (0, 1):
                if not held[q]:
                    continue
                open_ = [o for o in held[q] if o not in resolved[q]]
                position = min(open_) if open_ else max(held[q]) + 1
                if position > committed.get(q, -1):
                    expected[q] = position
            assert due == expected
            ledger.mark_committed(due)
            committed.update(due)
    for q in (0, 1):
        assert ledger.next_offset(q) == (max(held[q]) + 1 if held[q] else None)


def test_forgetting_a_partition_drops_what_it_held_and_its_commit():
    ledger = OffsetLedger()
    for offset in range(5):
        ledger.hold(0, offset)
    ledger.resolve(0, range(3))
    assert ledger.due() == {0: 3}
    ledger.mark_committed({0: 3})
    ledger.forget(0)
    assert ledger.due() == {} and ledger.next_offset(0) is None
    ledger.hold(0, 2)  # read again from an earlier commit by its next owner
    assert ledger.due() == {0: 2}
