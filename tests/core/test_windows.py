"""The window state machine: completion, every dead-letter reason, late members, duplicates, expiry."""

from __future__ import annotations

import math
from typing import NamedTuple

import pytest

from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import DecodeError, Sample, encode_sample, group_key
from rollout_stream.core import RewardConfig, post_process_rewards
from rollout_stream.core.offsets import OffsetLedger
from rollout_stream.core.records import DeadLettered, DuplicateDropped, InputRecord, Published
from rollout_stream.core.validate import SampleLimits
from rollout_stream.core.windows import WindowConfig, WindowStore

TIMEOUT = 10_000


def rec(
    sample: Sample | bytes, offset: int, ts: int = 1_000, key: bytes | None = None, partition: int = 0
) -> InputRecord:
    value = sample if isinstance(sample, bytes) else encode_sample(sample)
    if key is None and isinstance(sample, Sample) and sample.group_index is not None:
        key = group_key(sample)
    return InputRecord("rollouts", partition, offset, ts, key, value)


def s(
    gi: int = 0, rid: int = 0, reward: float = 1.0, *, size: int | None = 2, sc: int = 1, si: int = 0, **kw
) -> Sample:
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=size, sibling_count=sc,
                  sibling_index=si, **kw)


def store(**kw) -> WindowStore:
    limits = SampleLimits(default_group_size=kw.pop("default_group_size", None))
    return WindowStore(WindowConfig(reward=RewardConfig(), limits=limits, group_timeout_ms=TIMEOUT, **kw))


def feed(st: WindowStore, *records: InputRecord, now: int = 2_000):
    out = []
    for r in records:
        from rollout_stream.codec import decode_sample

        try:
            decoded = decode_sample(r.value)
        except DecodeError as e:
            decoded = e
        out += st.accept(r, decoded, now)
    return out


def test_group_publishes_when_every_rollout_is_complete():
    st = store()
    outs = feed(st, rec(s(rid=0, reward=1.0), 0), rec(s(rid=1, reward=3.0), 1))
    assert len(outs) == 1 and isinstance(outs[0], Published)
    assert outs[0].rewards.rewards == post_process_rewards([s(rid=0, reward=1.0), s(rid=1, reward=3.0)],
                                                           RewardConfig())[1]
    assert st.open_count() == 0


def test_siblings_complete_a_rollout_only_when_all_indices_arrived_and_order_is_deterministic():
    st = store()
    recs = [rec(s(rid=7, reward=2.0, sc=3, si=2), 0), rec(s(rid=8, reward=0.0), 1),
            rec(s(rid=7, reward=2.0, sc=3, si=0), 2)]
    assert feed(st, *recs) == []
    (out,) = feed(st, rec(s(rid=7, reward=2.0, sc=3, si=1), 3))
    assert isinstance(out, Published)
    assert [(m.sample.rollout_id, m.sample.sibling_index) for m in out.members] == [
        (7, 0), (7, 1), (7, 2), (8, 0)
    ]
    assert out.rewards.rewards[0] == out.rewards.rewards[1] == out.rewards.rewards[2]


def test_shared_reward_violation_dead_letters_the_whole_group_with_the_reference_message():
    st = store()
    outs = feed(st, rec(s(rid=11, reward=2.0, sc=2, si=0), 0), rec(s(rid=12, reward=1.0), 1),
                rec(s(rid=11, reward=6.0, sc=2, si=1), 2))
    (out,) = outs
    assert isinstance(out, DeadLettered) and out.reason is R.SHARED_REWARD_VIOLATION
    assert out.message == (
        "all samples in rollout 11 must share one reward; rows [0, 1] have rewards [2.0, 6.0]"
    )
    assert sorted(r.offset for r in out.records) == [0, 1, 2]


def test_one_equals_one_point_zero_for_siblings():
    st = store(default_group_size=1)
    (out,) = feed(
        st,
        rec(s(rid=1, reward=1, size=None, sc=2, si=0), 0),
        rec(s(rid=1, reward=1.0, size=None, sc=2, si=1), 1),
    )
    assert isinstance(out, Published)


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (s(reward=math.nan), "finite"),
        (s(reward=math.inf), "finite"),
        (s(reward=None), "no reward"),
        (s(reward={"acc": 1.0}), "mapping"),
        (s(size=0), "below 1"),
        (s(size=-3), "below 1"),
        (s(size=10**9), "exceeds"),
        (s(sc=0), "sibling_count"),
        (s(sc=2, si=2), "sibling_index"),
        (s(response_length=3, loss_mask=[1, 1]), "loss_mask"),
        (Sample(index=0, reward=1.0, group_size=2), "group_index"),
        (s(size=None), "group_size is unset"),
    ],
)
def test_invalid_samples_are_dead_lettered_with_a_reason(bad, fragment):
    st = store()
    (out,) = feed(st, rec(bad, 0, key=b"0"))
    assert isinstance(out, DeadLettered) and out.reason is R.INVALID_SAMPLE
    assert fragment in out.message


def test_key_must_be_the_group_key():
    st = store()
    (out,) = feed(st, rec(s(), 0, key=b"other"))
    assert out.reason is R.INVALID_SAMPLE and "group key" in out.message


def test_invalid_member_rejects_the_open_group_and_tags_later_members_with_the_same_reason():
    st = store()
    assert feed(st, rec(s(rid=0), 0)) == []
    (out,) = feed(st, rec(s(rid=1, reward=math.nan, size=3), 1))
    assert out.reason is R.INVALID_SAMPLE and [r.offset for r in out.records] == [0, 1]
    (later,) = feed(st, rec(s(rid=2, size=3), 2, ts=1_500))
    assert later.reason is R.INVALID_SAMPLE


def test_invalid_first_member_still_rejects_the_whole_group():
    st = store()
    (first,) = feed(st, rec(s(rid=0, reward=math.nan), 0))
    (second,) = feed(st, rec(s(rid=1), 1))
    assert first.reason is R.INVALID_SAMPLE and second.reason is R.INVALID_SAMPLE


def test_members_disagreeing_on_group_size_are_invalid():
    st = store()
    feed(st, rec(s(rid=0, size=3), 0))
    (out,) = feed(st, rec(s(rid=1, size=4), 1))
    assert out.reason is R.INVALID_SAMPLE and "group_size" in out.message


def test_identical_duplicate_is_dropped_open_and_after_close():
    st = store()
    a = rec(s(rid=0), 0)
    assert feed(st, a) == []
    (dup,) = feed(st, rec(s(rid=0), 1))
    assert isinstance(dup, DuplicateDropped)
    (pub,) = feed(st, rec(s(rid=1), 2))
    assert isinstance(pub, Published)
    (dup2,) = feed(st, rec(s(rid=1), 3))
    assert isinstance(dup2, DuplicateDropped)


def test_conflicting_duplicate_rejects_the_group():
    st = store()
    feed(st, rec(s(rid=0, prompt="a", size=3), 0))
    (out,) = feed(st, rec(s(rid=0, prompt="b", size=3), 1))
    assert out.reason is R.CONFLICTING_DUPLICATE and len(out.records) == 2


def test_timeout_dead_letters_incomplete_group_only_in_caught_up_partitions_and_late_members_follow():
    st = store()
    feed(st, rec(s(rid=0), 0, ts=1_000))
    # backlog not read: no wall-clock expiry
    assert st.expire(now_ms=1_000 + TIMEOUT + 1, partitions=set()) == []
    assert st.expire(now_ms=1_000 + TIMEOUT, partitions={0}) == []
    (out,) = st.expire(now_ms=1_000 + TIMEOUT + 1, partitions={0})
    assert out.reason is R.INCOMPLETE_GROUP and "1 of 2 rollouts" in out.message
    (late,) = feed(st, rec(s(rid=1), 1, ts=2_000))
    assert late.reason is R.LATE_MEMBER


def test_member_written_after_the_deadline_closes_the_group_by_event_time():
    st = store()
    feed(st, rec(s(rid=0), 0, ts=1_000))
    incomplete, late = feed(st, rec(s(rid=1), 1, ts=1_000 + TIMEOUT + 1))
    assert incomplete.reason is R.INCOMPLETE_GROUP and late.reason is R.LATE_MEMBER


def test_member_of_a_published_group_is_late():
    st = store()
    feed(st, rec(s(rid=0), 0), rec(s(rid=1), 1))
    (out,) = feed(st, rec(s(rid=2), 2))
    assert out.reason is R.LATE_MEMBER and "published" in out.message


def test_rejected_group_members_after_the_deadline_are_late():
    st = store()
    feed(st, rec(s(rid=0, reward=math.nan), 0, ts=1_000))
    (out,) = feed(st, rec(s(rid=1), 1, ts=1_000 + TIMEOUT + 5))
    assert out.reason is R.LATE_MEMBER


def test_more_rollouts_than_group_size_is_invalid():
    st = store()
    feed(st, rec(s(rid=0, sc=2, si=0), 0), rec(s(rid=1), 1))
    (out,) = feed(st, rec(s(rid=2), 2))
    assert out.reason is R.INVALID_SAMPLE and "more rollouts" in out.message


def test_decode_error_is_that_record_only():
    st = store()
    feed(st, rec(s(rid=0), 0))
    (out,) = feed(st, rec(b"\xc1 not msgpack", 1, key=b"0"))
    assert out.reason is R.DECODE_ERROR and len(out.records) == 1
    (pub,) = feed(st, rec(s(rid=1), 2))
    assert isinstance(pub, Published)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"", "empty value (0 bytes)"),
        (b"\x01\x02garbage", "not a MessagePack rollout sample: Expected `object`, got `int`"),
        (b"\xc1", "not a MessagePack rollout sample: MessagePack data is malformed: invalid opcode '\\xc1' "
                  "(byte 0)"),
        (encode_sample(s())[:-3], "not a MessagePack rollout sample: Input data was truncated"),
        (b"\x81\xabgroup_index\xa1x", "Expected `int | null`, got `str` - at `$.group_index`"),  # names it
        (None, "record has no value (tombstone)"),
    ],
    ids=["empty", "garbage", "not-msgpack", "truncated", "bad-field", "tombstone"],
)
def test_a_decode_error_says_what_the_value_was(value, message):
    (out,) = store().take(InputRecord("rollouts", 0, 5, 1_000, b"0", value), 2_000)
    assert out.reason is R.DECODE_ERROR and out.message == message


def test_group_size_fallback_from_stage_setting():
    st = store(default_group_size=3)
    outs = feed(st, *(rec(s(rid=i, size=None, reward=float(i)), i) for i in range(3)))
    assert isinstance(outs[-1], Published) and outs[-1].rewards.rollout_count == 3


def test_partitions_keep_separate_windows_and_drop_partition_forgets():
    st = store()
    feed(st, rec(s(rid=0), 0, partition=0), rec(s(gi=1, rid=0), 0, partition=1))
    st.drop_partition(0)
    assert st.open_count() == 1 and st.open_bytes > 0
    st.drop_partition(1)
    assert st.open_count() == 0 and st.open_bytes == 0


def test_closed_memory_is_bounded():
    st = store(max_closed_groups=5)
    for g in range(20):
        feed(st, rec(s(gi=g, rid=0, size=1), g))
    assert len(st.closed) == 5


def test_group_larger_than_the_byte_cap_is_dead_lettered_whole():
    first = rec(s(rid=0, size=3, prompt="x" * 150), 0)
    assert first.value is not None
    st = store(max_group_bytes=len(first.value) + 100)  # room for one such record, not two
    feed(st, first)
    (out,) = feed(st, rec(s(rid=1, size=3, prompt="y" * 150), 1))
    assert out.reason is R.GROUP_TOO_LARGE and len(out.records) == 2 and st.open_bytes == 0


def test_replayed_records_are_windowed_apart_from_their_closed_original():
    st = store()
    feed(st, rec(s(rid=0), 0, ts=1_000))
    (inc,) = st.expire(now_ms=1_000 + TIMEOUT + 1, partitions={0})
    assert inc.reason is R.INCOMPLETE_GROUP
    (late,) = feed(st, rec(s(rid=1), 1, ts=50_000))
    assert late.reason is R.LATE_MEMBER
    replay = (("x-replay-id", b"r1"), ("x-replay-count", b"1"))
    a = InputRecord("rollouts", 0, 2, 60_000, b"0", encode_sample(s(rid=0)), replay)
    b = InputRecord("rollouts", 0, 3, 60_000, b"0", encode_sample(s(rid=1)), replay)
    assert feed(st, a) == []
    (pub,) = feed(st, b)
    assert isinstance(pub, Published) and [m.record.offset for m in pub.members] == [2, 3]


def test_changes_journal_closed_groups_and_forgetting():
    st = store(max_closed_groups=1)
    feed(st, rec(s(gi=0, rid=0, size=1), 0), rec(s(gi=1, rid=0, size=1), 1))
    changes = st.drain_changes()
    assert changes[(0, "0", "")] is None and changes[(0, "1", "")].reason is None
    assert st.drain_changes() == {}


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (s(tokens=[1, 2], response_length=3, loss_mask=[1, 1, 1]), "exceeds"),
        (
            s(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], rollout_log_probs=[-1.0]),
            "rollout_log_probs",
        ),
    ],
)
def test_array_lengths_must_agree_with_response_length(bad, fragment):
    (out,) = feed(store(), rec(bad, 0))
    assert out.reason is R.INVALID_SAMPLE and fragment in out.message


def test_copy_of_a_row_without_rollout_identity_is_a_duplicate_not_a_new_rollout():
    st = store()
    row = Sample(group_index=0, reward=1.0, group_size=2)  # no rollout_id, no index: each row its own rollout
    outs = feed(st, rec(row, 0), rec(row, 1))
    assert [type(o) for o in outs] == [DuplicateDropped] and st.open_count() == 1
    outs = feed(st, rec(Sample(group_index=0, reward=0.0, group_size=2), 2))
    assert [type(o) for o in outs] == [Published] and [r.offset for r in outs[0].records] == [0, 2]


def test_sibling_slots_keep_order_and_copies_of_any_sibling_are_dropped():
    st = store()
    a2, a0, a1 = (rec(s(rid=5, sc=3, si=i), i) for i in (2, 0, 1))
    assert feed(st, a2, a0) == []
    outs = feed(st, rec(s(rid=5, sc=3, si=2), 9))
    assert [type(o) for o in outs] == [DuplicateDropped]
    outs = feed(st, a1, rec(s(rid=6), 3))
    assert [type(o) for o in outs] == [Published]
    assert [m.sample.sibling_index for m in outs[0].members] == [0, 1, 2, 0]


@pytest.mark.parametrize("algorithm", ["blake2b-128", "xxh3-128"])
def test_closed_groups_restored_from_a_changelog_recognise_copies_with_their_own_digest(algorithm):
    from rollout_stream.core.digest import digest_with
    from rollout_stream.core.windows import ClosedGroup

    member = rec(s(rid=0), 0)
    restored = ClosedGroup(
        None, "", 10_000, 1_000, (digest_with(algorithm, member.value),), algorithm
    )
    st = store()
    st.restore_closed((0, "0", ""), restored)
    assert [type(o) for o in feed(st, rec(s(rid=0), 5))] == [DuplicateDropped]
    late = feed(st, rec(s(rid=1), 6))
    assert [o.reason for o in late] == [R.LATE_MEMBER]


def test_closed_group_from_an_unknown_digest_algorithm_never_drops_a_record():
    from rollout_stream.core.windows import ClosedGroup

    st = store()
    st.restore_closed((0, "0", ""), ClosedGroup(None, "", 10_000, 1_000, (b"x" * 16,), "sha3-512"))
    assert [o.reason for o in feed(st, rec(s(rid=0), 5))] == [R.LATE_MEMBER]


def test_closed_group_memory_is_left_out_of_the_garbage_collectors_passes():
    import gc

    st = store()
    for rid in range(2):
        feed(st, rec(s(rid=rid), rid))
    (closed,) = st.closed.values()
    gc.collect()  # the collector stops tracking a tuple of bytes the first time it looks at it
    # 200,000 remembered groups are walked by no full collection (121 ms each when they were)
    assert not gc.is_tracked(closed)
    assert not gc.is_tracked(closed.digests)
    assert len(closed.digests) == 2


class _Consumed(NamedTuple):
    """A record as the Kafka seam hands it out."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] | None


def test_a_poll_batch_is_taken_until_each_decision_as_one_take_per_record_would():
    samples = [s(gi=g, rid=r, reward=float(r)) for g in range(4) for r in range(2)]
    samples.insert(3, s(gi=9, rid=0, reward=math.nan))  # dead-lettered on its own
    consumed = [_Consumed("rollouts", 1, 40 + i, 1_000, group_key(x), encode_sample(x), None)
                for i, x in enumerate(samples)]
    consumed.append(_Consumed("rollouts", 1, 60, 1_000, b"k", None, [("h", b"v")]))  # a tombstone
    one_by_one = store()
    expected = [o for c in consumed for o in one_by_one.take(InputRecord(
        c.topic, c.partition, c.offset, c.timestamp, c.key, c.value, tuple(c.headers or ())), 2_000)]
    batched, ledger = store(), OffsetLedger()
    runs, outcomes, at = [], [], 0
    while at < len(consumed):
        at, decided = batched.take_batch(consumed, at, 2_000, ledger)
        runs.append((at, [type(o).__name__ for o in decided]))
        outcomes += decided
    assert runs == [(2, ["Published"]), (4, ["DeadLettered"]), (5, ["Published"]), (7, ["Published"]),
                    (9, ["Published"]), (10, ["DeadLettered"])]
    assert outcomes == expected
    assert ledger.next_offset(1) == 61 and ledger.due() == {1: 40}  # each held, none resolved yet
