"""Chunked values in the window store: reassembly in any order with copies, each refusal's reason, expiry,
the bytes they hold, and that every chunk's offset is settled with the value's outcome."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.codec.chunks import CHUNK_HEADER, decode_chunk_header, split
from rollout_stream.codec.headers import REPLAY_ID
from rollout_stream.core.config import RewardConfig
from rollout_stream.core.records import DeadLettered, DuplicateDropped, InputRecord, Outcome, Published
from rollout_stream.core.windows import WindowConfig, WindowStore, chunks_memory_key

TIMEOUT = 10_000
CHUNK = 100


def sample(rid: int, reward: float = 1.0, *, gi: int = 0, size: int = 2, pad: int = 450) -> Sample:
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=size,
                  prompt="p" * pad)


def chunked(s: Sample, first_offset: int, ts: int = 1_000, replay: str = "") -> list[InputRecord]:
    headers: tuple[tuple[str, bytes], ...] = ((REPLAY_ID, replay.encode()),) if replay else ()
    return [InputRecord("rollouts", 0, first_offset + i, ts, group_key(s), part,
                        (*headers, (CHUNK_HEADER, header)))
            for i, (header, part) in enumerate(split(encode_sample(s), CHUNK))]


def store(max_group_bytes: int = 1 << 30) -> WindowStore:
    return WindowStore(WindowConfig(reward=RewardConfig(), group_timeout_ms=TIMEOUT,
                                    max_group_bytes=max_group_bytes))


def take(st: WindowStore, records: list[InputRecord], now: int = 2_000) -> list[Outcome]:
    return [o for r in records for o in st.take(r, now)]


def settled(outcomes: list[Outcome]) -> list[int]:
    return sorted(o for out in outcomes for r in out.records for o in r.offsets)


def test_a_group_of_chunked_samples_publishes_the_whole_values_and_settles_every_chunk() -> None:
    st = store()
    a, b = chunked(sample(0, 1.0), 0), chunked(sample(1, 3.0), 10)
    n = len(a)
    assert n > 3 and st.take(a[0], 2_000) == [] and st.open_bytes == CHUNK
    (out,) = take(st, a[1:] + b)
    assert isinstance(out, Published)
    assert [m.record.value for m in out.members] == [encode_sample(sample(0, 1.0)),
                                                     encode_sample(sample(1, 3.0))]
    assert [m.record.offset for m in out.members] == [0, 10]
    assert all(CHUNK_HEADER not in dict(m.record.headers) for m in out.members)
    assert settled([out]) == list(range(n)) + list(range(10, 10 + len(b)))
    assert st.open_bytes == 0 and not st.chunks.open


def test_chunks_in_any_order_with_copies_reassemble_once() -> None:
    st = store()
    a, b = chunked(sample(0), 0), chunked(sample(1, 2.0), 10)
    order = a + b + a[:3] + b[2:]
    random.Random(5).shuffle(order)
    outs = take(st, order)
    published = [o for o in outs if isinstance(o, Published)]
    assert len(published) == 1 and {o.record.offset for o in outs if isinstance(o, DuplicateDropped)}
    assert all(isinstance(o, Published | DuplicateDropped) for o in outs)


def test_chunks_that_never_all_arrive_are_dead_lettered_at_the_deadline_and_late_ones_follow() -> None:
    st = store()
    a = chunked(sample(0), 0)
    assert take(st, a[:4]) == [] and st.open_bytes == 4 * CHUNK
    assert st.expire(1_000 + TIMEOUT, {0}) == []
    (out,) = st.expire(1_001 + TIMEOUT, {0})
    assert isinstance(out, DeadLettered) and out.reason is R.INCOMPLETE_CHUNKS
    assert f"4 of {len(a)} chunks" in out.message and settled([out]) == [0, 1, 2, 3]
    assert st.open_bytes == 0
    (late,) = take(st, a[4:5], now=20_000)
    assert isinstance(late, DeadLettered) and late.reason is R.INCOMPLETE_CHUNKS and late.straggler
    (copy,) = take(st, a[:1], now=20_000)
    assert isinstance(copy, DuplicateDropped)


def test_a_chunk_written_after_its_values_deadline_closes_it_whatever_the_clock() -> None:
    st = store()
    a = chunked(sample(0), 0)
    take(st, a[:2])
    late = InputRecord(a[2].topic, 0, 2, 1_000 + TIMEOUT + 1, a[2].key, a[2].value, a[2].headers)
    first, second = st.take(late, 2_000)
    assert isinstance(first, DeadLettered) and first.reason is R.INCOMPLETE_CHUNKS and not first.straggler
    assert isinstance(second, DeadLettered) and second.straggler and settled([first, second]) == [0, 1, 2]


def test_bytes_that_do_not_match_the_digest_are_dead_lettered() -> None:
    st = store()
    a = chunked(sample(0), 0)
    bad = InputRecord(a[3].topic, 0, 3, 1_000, a[3].key, a[3].value[:-1] + b"!", a[3].headers)
    (out,) = take(st, [*a[:3], bad, *a[4:]])
    assert isinstance(out, DeadLettered) and out.reason is R.CHUNK_DIGEST_MISMATCH
    assert settled([out]) == list(range(len(a))) and st.open_bytes == 0


def test_two_different_chunks_in_one_slot_conflict() -> None:
    st = store()
    a = chunked(sample(0), 0)
    other = InputRecord(a[1].topic, 0, 9, 1_000, a[1].key, b"x" * CHUNK, a[1].headers)
    (out,) = take(st, [a[0], a[1], other])
    assert isinstance(out, DeadLettered) and out.reason is R.CHUNK_CONFLICT and settled([out]) == [0, 1, 9]
    (straggler,) = take(st, a[2:3])
    assert straggler.reason is R.CHUNK_CONFLICT and straggler.straggler


def test_a_value_larger_than_the_group_cap_is_refused_at_its_first_chunk() -> None:
    st = store(max_group_bytes=300)
    a = chunked(sample(0), 0)
    (out,) = take(st, a[:1])
    assert isinstance(out, DeadLettered) and out.reason is R.GROUP_TOO_LARGE and st.open_bytes == 0


def test_an_unreadable_chunk_header_is_a_decode_error() -> None:
    st = store()
    (out,) = st.take(InputRecord("rollouts", 0, 0, 1_000, b"k", b"v", ((CHUNK_HEADER, b"\xc1"),)), 2_000)
    assert isinstance(out, DeadLettered) and out.reason is R.DECODE_ERROR and CHUNK_HEADER in out.message


def test_a_replayed_value_reassembles_apart_from_its_original() -> None:
    st = store()
    a = chunked(sample(0), 0)
    take(st, a[:5])
    replayed = chunked(sample(0), 20, replay="r1")
    assert take(st, replayed[:5]) == [] and len(st.chunks.open) == 2


def test_a_refused_value_is_in_the_closed_memory_the_changelog_keeps() -> None:
    st = store()
    a = chunked(sample(0), 0)
    take(st, a[:2])
    st.expire(1_001 + TIMEOUT, {0})
    changes = st.drain_changes()
    (wkey,) = [k for k in changes if k[1].startswith("\x00chunks/")]
    assert wkey == chunks_memory_key((0, decode_chunk_header(a[0].headers[-1][1]).digest, ""))
    assert changes[wkey].reason is R.INCOMPLETE_CHUNKS


def test_a_partition_dropped_forgets_its_chunks_and_their_bytes() -> None:
    st = store()
    take(st, chunked(sample(0), 0)[:3])
    st.drop_partition(0)
    assert st.open_bytes == 0 and not st.chunks.open


@settings(max_examples=60, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(min_value=1, max_value=4),
       st.lists(st.integers(min_value=0, max_value=3), max_size=6))
def test_any_arrival_order_publishes_every_group_once_and_settles_every_offset(
        rng: random.Random, groups: int, copies: list[int]) -> None:
    """Chunks of several groups' samples, interleaved and partly copied (a producer's retry), resolve every
    offset exactly as the same groups sent whole would."""
    st = store()
    records: list[InputRecord] = []
    for g in range(groups):
        for rid in range(2):
            records += chunked(sample(rid, float(rid + g), gi=g), 100 * (2 * g + rid))
    records += [records[i % len(records)] for i in copies]
    rng.shuffle(records)
    outs = take(st, records)
    published = [o for o in outs if isinstance(o, Published)]
    assert sorted(o.group_key for o in published) == sorted(f"{g}" for g in range(groups))
    assert not [o for o in outs if isinstance(o, DeadLettered)]
    assert set(settled(outs)) == {r.offset for r in records} and st.open_bytes == 0


def test_a_stray_chunk_claiming_a_whole_value_is_refused_alone_and_the_value_stays_whole() -> None:
    st = store()
    a = chunked(sample(0, 1.0), 0)
    assert take(st, a) == []  # whole, waiting in its group's window
    stray = InputRecord(a[0].topic, 0, 9, 1_000, a[0].key, b"y" * CHUNK, a[0].headers)
    (out,) = take(st, [stray])
    assert isinstance(out, DeadLettered) and out.reason is R.CHUNK_CONFLICT and not out.straggler
    assert settled([out]) == [9] and st.open_count() == 1
    (copy,) = take(st, a[2:3])  # a copy of one of the value's own chunks: dropped
    assert isinstance(copy, DuplicateDropped)
    (done,) = take(st, chunked(sample(1, 2.0), 20))
    assert isinstance(done, Published) and settled([done])[:len(a)] == list(range(len(a)))


def test_a_whole_value_is_remembered_with_its_first_offset_for_a_restore() -> None:
    st = store()
    a = chunked(sample(0), 5)
    take(st, a)
    (entry,) = [c for k, c in st.drain_changes().items() if k[1].startswith("\x00chunks/")]
    assert entry.reason is None and entry.first_offset == 5
