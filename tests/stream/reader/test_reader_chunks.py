"""TrainDataReader and chunked train records (codec/chunks.py): reassembled into the same groups and batches
as unchunked ones, every chunk's offset held until its value is consumed (commit and resume), the open
bytes capped, incomplete and corrupt sets dropped and counted. Pure properties first, then the reader on
the in-memory Kafka seam."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_stream.reader.train_data as reader_module
from rollout_stream.codec import TrainSample, encode_train_sample
from rollout_stream.codec.chunks import CHUNK_HEADER, decode_chunk_header, split
from rollout_stream.core.assembly import GroupMerger, Mark, ReadMarks
from rollout_stream.kafka import TopicPartition
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.names import rank_group_id
from rollout_stream.reader import Batch, ChunkLimitError, ReaderStats, TrainDataReader
from rollout_stream.reader.assembler import GroupAssembler
from tests.stream.reader.test_reader import interleave, make_group, train_sample

Headers = tuple[tuple[str, bytes], ...]
Item = tuple[bytes, Headers, int]  # value, headers, timestamp
Records = dict[int, list[tuple[int, int, bytes, Headers]]]  # partition → [(offset, ts, value, headers)]


def split_index(headers: Headers) -> int:
    return decode_chunk_header(dict(headers)[CHUNK_HEADER]).index


def chunked(value: bytes, chunk_bytes: int) -> list[tuple[bytes, Headers]]:
    """The chunk records of `value`, as the stage writes them: (slice, headers with the x-chunk header)."""
    return [(part, ((CHUNK_HEADER, header),)) for header, part in split(value, chunk_bytes)]


# ---- pure: the reader's assembly over simulated partitions ---------------------------------------
def simulated(rng: random.Random, *, partitions: int = 3, groups: int = 10,
              chunk_share: float = 0.5) -> tuple[Records, Records]:
    """The same groups written plainly and with some values chunked: (plain, chunked). In the chunked
    topic a value's last chunk stands where its plain record stands, its earlier chunks among the few
    records before it (so chunks of neighbouring values interleave), all with that record's timestamp."""
    per: dict[int, list[list[bytes]]] = defaultdict(list)
    for g in range(groups):
        per[rng.randrange(partitions)].append([encode_train_sample(s) for s in make_group(g, rng)])
    plain: Records = {}
    chunks: Records = {}
    for p in range(partitions):
        values: list[bytes] = interleave(per[p], rng)
        if rng.random() < 0.3:
            values.insert(rng.randrange(len(values) + 1), b"\xc1garbage")
        ts, stamped = rng.randint(0, 50), []
        for v in values:
            stamped.append((v, ts))
            ts += rng.choice([0, 0, 1, 7])
        flat: list[Item] = []
        for v, t in stamped:
            if len(v) > 64 and rng.random() < chunk_share:
                parts = chunked(v, rng.choice([40, 100, 250, max(1, len(v) // 2)]))
                for value, headers in parts[:-1]:
                    flat.insert(rng.randint(max(0, len(flat) - 4), len(flat)), (value, headers, t))
                flat.append((parts[-1][0], parts[-1][1], t))
            else:
                flat.append((v, (), t))
        plain[p] = with_offsets([(v, (), t) for v, t in stamped], rng)
        chunks[p] = with_offsets(flat, rng)
    return plain, chunks


def with_offsets(items: Sequence[Item], rng: random.Random) -> list[tuple[int, int, bytes, Headers]]:
    offset, out = rng.randint(0, 5), []
    for value, headers, ts in items:
        out.append((offset, ts, value, headers))
        offset += rng.choice([1, 1, 1, 2])  # gaps: transaction markers
    return out


Emitted = list[tuple[tuple[str, int, tuple[int, ...], tuple[bytes, ...]], dict[int, Mark]]]


def run(records: Records, rng: random.Random, *, resume: dict[int, Mark] | None = None,
        stop_after: int | None = None, stats: ReaderStats | None = None) -> Emitted:
    """What a reader emits when the partitions arrive in random poll chunks: [((key, partition, offsets,
    sample bytes), snapshot after it)]; at the end, incomplete chunked values expire as in the reader."""
    resume = resume or {}
    marks, stats = ReadMarks(), stats if stats is not None else ReaderStats()
    cursors: dict[int, int] = {}
    for p, recs in records.items():
        start = resume[p].offset if p in resume else (recs[0][0] if recs else 0)
        marks.start(p, start, resume.get(p))
        cursors[p] = next((i for i, r in enumerate(recs) if r[0] >= start), len(recs))
    assembler = GroupAssembler(marks, stats)
    merger = GroupMerger(sorted(records), idle_ms=0)
    out: Emitted = []
    while True:
        live = [p for p in records if cursors[p] < len(records[p])]
        if live:
            p = rng.choice(live)
            n = rng.randint(1, 4)
            for offset, ts, value, headers in records[p][cursors[p]: cursors[p] + n]:
                if p in resume and resume[p].skips(offset):
                    marks.read(p, offset, hold=False)
                    continue
                group = assembler.accept(p, offset, ts, value, headers)
                if group is not None:
                    merger.push(group)
            cursors[p] += n
        else:
            assembler.expire_chunks(10**15, lambda q: cursors[q] >= len(records[q]))
        while (group := merger.pop(10**15, lambda q: cursors[q] >= len(records[q]))) is not None:
            marks.release(group.partition, group.offsets)
            samples = tuple(encode_train_sample(s) for s in group.samples)
            out.append(((group.key, group.partition, group.offsets, samples), marks.snapshot()))
            if stop_after is not None and len(out) >= stop_after:
                return out
        if not live:
            assert not assembler.chunks.open and assembler.chunks.open_bytes == 0
            return out


def through_metadata(snapshot: dict[int, Mark], batch: int = 7) -> dict[int, Mark]:
    return {p: Mark.parse(m.offset, m.metadata(batch))[1] for p, m in snapshot.items()}


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_chunked_values_make_the_same_groups_in_the_same_order_as_plain_records(seed):
    rng = random.Random(seed)
    plain, chunks = simulated(rng)
    stats = ReaderStats()
    expected = [(key, samples) for (key, _, _, samples), _ in run(plain, random.Random(seed + 1))]
    got = run(chunks, random.Random(seed + 2), stats=stats)
    assert [(key, samples) for (key, _, _, samples), _ in got] == expected  # re-encoded: bit-identical
    assert len(expected) == 10
    # every record but the garbage belongs to its group's offsets, each chunk record included
    grouped = {(p, o) for p, recs in chunks.items() for o, _, v, _ in recs if v != b"\xc1garbage"}
    assert grouped == {(p, o) for (_, p, offs, _), _ in got for o in offs}
    assert stats.chunked_values == sum(1 for recs in chunks.values() for _, _, _, h in recs
                                       if h and split_index(h) == 0)
    assert stats.incomplete_chunked_values == stats.corrupt_chunked_values == 0
    assert stats.records == sum(len(r) for r in chunks.values())
    final = got[-1][1]
    assert all(not m.keep for m in final.values())  # all consumed: nothing held, commits at the read end


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 10), st.integers(0, 10))
def test_restarting_from_any_snapshot_recollects_the_chunks_of_values_not_yet_consumed(seed, first, second):
    rng = random.Random(seed)
    _, chunks = simulated(rng, chunk_share=0.8)
    full = [g for g, _ in run(chunks, random.Random(seed + 1))]
    k = min(first, len(full))
    if k:
        snapshot = run(chunks, random.Random(seed + 2), stop_after=k)[-1][1]
        for p, mark in snapshot.items():  # a record of a group not yet consumed is never committed past
            for _, q, offsets, _ in full[k:]:
                if q == p:
                    assert all(o in mark.keep for o in offsets if o < mark.end)
                    assert all(o >= mark.offset for o in offsets)
        resumed = run(chunks, random.Random(seed + 3), resume=through_metadata(snapshot))
        assert [g for g, _ in resumed] == full[k:]  # and no chunk set left open (asserted in run)
        j = min(second, len(resumed))
        if j:
            again = run(chunks, random.Random(seed + 4), resume=through_metadata(resumed[j - 1][1]))
            assert [g for g, _ in again] == full[k + j:]


def feed(assembler: GroupAssembler, partition: int, records: Sequence[tuple[int, int, bytes, Headers]]
         ) -> list[Any]:
    return [g for o, ts, v, h in records if (g := assembler.accept(partition, o, ts, v, h)) is not None]


def test_a_value_cut_by_where_reading_started_is_held_then_dropped_and_released_once_read_to_the_end():
    rng = random.Random(3)
    v = encode_train_sample(train_sample(1, 100, rollouts=1, samples=1))
    (c0, h0), (c1, h1) = chunked(v, len(v) // 2 + 1)
    later = [encode_train_sample(s) for s in make_group(2, rng)]
    marks, stats = ReadMarks(), ReaderStats()
    marks.start(0, 11, Mark(11, 11))  # e.g. a commit whose metadata was truncated: chunk 0 was at 10
    assembler = GroupAssembler(marks, stats, chunk_timeout_s=1.0)
    assert feed(assembler, 0, [(11, 5000, c1, h1)]) == []
    assert marks.snapshot()[0] == Mark(11, 12, frozenset({11}))  # held while it may still complete
    groups = feed(assembler, 0, [(12 + i, 5000, value, ()) for i, value in enumerate(later)])
    assert len(groups) == 1
    assembler.expire_chunks(5500, lambda p: True)  # before its timeout: kept
    assert assembler.chunks.open
    assembler.expire_chunks(7000, lambda p: False)  # the partition may hold more: kept
    assert assembler.chunks.open
    assembler.expire_chunks(7000, lambda p: True)
    assert not assembler.chunks.open and assembler.chunks.open_bytes == 0
    assert stats.incomplete_chunked_values == 1
    marks.release(0, groups[0].offsets)
    end = 12 + len(later)
    assert marks.snapshot()[0] == Mark(end, end)  # nothing held: the commit moves past the dropped chunk
    # its chunk 0 written again later (a republication) is a fresh start, not a completion
    assert feed(assembler, 0, [(end, 9000, c0, h0)]) == [] and assembler.chunks.open


def test_corrupt_chunks_are_dropped_counted_and_released():
    value = encode_train_sample(train_sample(1, 100, rollouts=1, samples=1))
    parts = chunked(value, 100)
    bad = [(p[:-1] + bytes([p[-1] ^ 1]) if i == 1 else p, h) for i, (p, h) in enumerate(parts)]
    marks, stats = ReadMarks(), ReaderStats()
    marks.start(0, 0)
    assembler = GroupAssembler(marks, stats)
    assert feed(assembler, 0, [(i, 1, p, h) for i, (p, h) in enumerate(bad)]) == []
    assert stats.corrupt_chunked_values == 1 and not assembler.chunks.open
    assert marks.snapshot()[0] == Mark(len(bad), len(bad))
    # a copy of a held chunk is dropped alone; the value completes once
    n = len(parts)
    records = [(n + i, 1, p, h) for i, (p, h) in enumerate(parts)]
    records.insert(1, (2 * n, 1, *parts[0]))
    records = [(i + n, 1, p, h) for i, (_, _, p, h) in enumerate(records)]
    groups = feed(assembler, 0, records)
    assert len(groups) == 1 and stats.duplicate_records == 1 and stats.chunked_values == 1
    assert encode_train_sample(groups[0].samples[0]) == value
    assert set(groups[0].offsets) == {o for o, *_ in records} - {n + 1}


def test_open_chunk_bytes_are_capped_with_a_typed_error():
    values = [encode_train_sample(train_sample(1, 100 + r, rollouts=2, samples=2, tokens=200))
              for r in (0, 1)]
    a, b = (chunked(v, 300) for v in values)
    marks, stats = ReadMarks(), ReaderStats()
    marks.start(0, 0)
    cap = len(values[0]) + 300
    assembler = GroupAssembler(marks, stats, max_open_chunk_bytes=cap)
    assert len(a) >= 4 and len(b) >= 4
    feed(assembler, 0, [(i, 1, *part) for i, part in enumerate(a[:-1])])  # one value open: under the cap
    assert assembler.chunks.open_bytes <= cap
    with pytest.raises(ChunkLimitError, match="over max_open_chunk_bytes"):
        feed(assembler, 0, [(10 + i, 1, *part) for i, part in enumerate(b[:-1])])
    small = GroupAssembler(marks, ReaderStats(), max_open_chunk_bytes=len(values[0]) - 1)
    with pytest.raises(ChunkLimitError, match="larger than max_open_chunk_bytes"):
        feed(small, 0, [(10, 1, *a[0])])


# ---- the reader on the in-memory seam --------------------------------------------------------------
class _Client:
    """The memory cluster's client, its consumers polling at most `max_poll_records` records."""

    def __init__(self, cluster: MemoryCluster, max_poll_records: int) -> None:
        self.client, self.max_poll_records = cluster.client(), max_poll_records

    def assigned_consumer(self, **kw: Any) -> Any:
        return self.client.assigned_consumer(max_poll_records=self.max_poll_records, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.fixture(params=[500, 1], ids=["polls", "one-record-polls"])
def cluster(request, monkeypatch) -> MemoryCluster:
    c = MemoryCluster()
    for topic in ("plain", "chunked"):
        c.create_topic(topic, 1)
    monkeypatch.setattr(reader_module, "client_for", lambda conn: _Client(c, request.param))
    return c


def write(cluster: MemoryCluster, topic: str, items: Sequence[tuple[str, bytes, Headers]],
          transactions: int = 1) -> None:
    """(key, value, headers) in this order, in `transactions` consecutive transactions."""
    producer = cluster.client().producer(transactional_id=f"writer-{topic}")
    producer.init_transactions()
    size = -(-len(items) // transactions)
    for i in range(0, len(items), size):
        producer.begin_transaction()
        for key, value, headers in items[i:i + size]:
            producer.send(topic, value, key.encode(), headers=headers)
        producer.commit_transaction()
    producer.close()


def open_reader(topic: str, **kw: Any) -> TrainDataReader:
    kw.setdefault("groups_per_batch", 1)
    return TrainDataReader("memory:9092", topic, "trainer", publish_progress=False, partition_idle_ms=50,
                           **kw)


def take(reader: TrainDataReader, n: int) -> list[Batch]:
    out = []
    for _ in range(n):
        batch = reader.next_batch(10.0)
        assert batch is not None, f"batch {len(out)} of {n} did not arrive"
        out.append(batch)
    return out


def same_batches(a: Sequence[Batch], b: Sequence[Batch]) -> None:
    assert [[g.key for g in x.groups] for x in a] == [[g.key for g in x.groups] for x in b]
    for x, y in zip(a, b, strict=True):
        assert [encode_train_sample(s) for s in x.samples] == [encode_train_sample(s) for s in y.samples]
        for name in ("tokens", "attention_mask", "loss_mask", "rollout_log_probs", "rewards",
                     "response_index"):
            assert torch.equal(getattr(x, name), getattr(y, name)), name


def big(g: int, rid: int, samples: int = 2) -> TrainSample:
    return train_sample(g, rid, rollouts=samples, samples=samples, tokens=400)


def test_reader_yields_chunked_train_records_as_the_same_batches_as_plain_ones(cluster):
    groups = [[big(g, g * 100 + r) for r in range(2)] for g in range(4)]
    plain = [(s.group_key, encode_train_sample(s), ()) for grp in groups for s in grp]
    # group 1: both values chunked, their chunks interleaved; group 2: one chunked value among plain ones
    v10, v11 = (chunked(encode_train_sample(s), 500) for s in groups[1])
    assert len(v10) >= 3 and len(v11) >= 3
    mixed: list[tuple[str, bytes, Headers]] = [plain[0], plain[1]]
    for i in range(max(len(v10), len(v11))):
        mixed += [("r/1", *c[i]) for c in (v10, v11) if i < len(c)]
    mixed += [("r/2", *c) for c in chunked(plain[4][1], 700)] + [plain[5], plain[6], plain[7]]
    write(cluster, "plain", plain)
    write(cluster, "chunked", mixed, transactions=3)
    with open_reader("plain", groups_per_batch=2) as r:
        expected = take(r, 2)
    with open_reader("chunked", groups_per_batch=2) as r:
        got = take(r, 2)
        assert r.next_batch(0.3) is None
        stats = r.stats
    same_batches(got, expected)
    assert [s.sample.rollout_id for b in got for s in b.samples] == [
        s.sample.rollout_id for grp in groups for s in grp]
    assert stats.chunked_values == 3 and stats.records == len(mixed)
    assert stats.incomplete_chunked_values == stats.corrupt_chunked_values == stats.decode_errors == 0
    infos = [g for b in got for g in b.groups]
    assert infos[1].first_offset < infos[1].last_offset  # the group's offsets span all its chunk records


def test_commit_and_resume_when_a_value_straddles_the_committed_position(cluster):
    a, b, c = ([big(g, g * 100 + r) for r in range(2)] for g in range(3))
    v = chunked(encode_train_sample(b[0]), 600)
    assert len(v) >= 3
    enc = encode_train_sample
    items: list[tuple[str, bytes, Headers]] = [
        ("r/0", enc(a[0]), ()),
        ("r/1", *v[0]),  # offset 1: group 1's chunked value begins before group 0 completes
        ("r/0", enc(a[1]), ()),  # group 0 complete: batch 0
        *[("r/1", *part) for part in v[1:]],
        ("r/1", enc(b[1]), ()),  # group 1 complete: batch 1
        ("r/2", enc(c[0]), ()), ("r/2", enc(c[1]), ()),
    ]
    write(cluster, "chunked", items, transactions=2)
    tp = TopicPartition("chunked", 0)
    group = rank_group_id("trainer", 0)
    with open_reader("chunked") as r:
        first = take(r, 1)[0]
        assert [g.key for g in first.groups] == ["r/0"]
        assert r.commit()
    committed = cluster.committed(group)[tp]
    assert committed.offset == 1  # the chunk at 1 belongs to a value not yet consumed
    assert Mark.parse(committed.offset, committed.metadata)[1].skips(2)
    for _ in range(2):  # resumed twice from the same commit: the value is collected whole again each time
        with open_reader("chunked") as r:
            again = take(r, 2)
            assert [b.index for b in again] == [1, 2]
            assert [g.key for b in again for g in b.groups] == ["r/1", "r/2"]
            assert [enc(s) for s in again[0].samples] == [enc(b[0]), enc(b[1])]
            assert r.stats.incomplete_chunked_values == 0
    with open_reader("chunked") as r:
        assert take(r, 1)[0].groups[0].key == "r/1"
        assert r.commit()
    assert cluster.committed(group)[tp].offset >= 3 + len(v)  # past every chunk of the consumed value
    with open_reader("chunked") as r:
        last = take(r, 1)[0]
        assert last.index == 2 and last.groups[0].key == "r/2"
        assert r.next_batch(0.3) is None


def test_the_open_chunk_cap_fails_the_reader_with_a_typed_error(cluster):
    s = [big(0, r) for r in range(2)]
    parts = [chunked(encode_train_sample(x), 500) for x in s]
    write(cluster, "chunked", [("r/0", *p) for pair in zip(*parts, strict=False) for p in pair])
    with open_reader("chunked", max_open_chunk_bytes=len(encode_train_sample(s[0])) + 100) as r:
        with pytest.raises(ChunkLimitError, match="max_open_chunk_bytes"):
            r.next_batch(10.0)
        with pytest.raises(ChunkLimitError):  # and stays failed
            r.next_batch(0.1)


def test_an_incomplete_chunked_value_is_dropped_and_stops_holding_the_commit(cluster, monkeypatch):
    orphan = chunked(encode_train_sample(big(9, 900, samples=1)), 500)
    a, b = ([big(g, g * 100 + r) for r in range(2)] for g in range(2))
    producer = cluster.client().producer()  # outside transactions: a writer cut short
    producer.send("chunked", orphan[0][0], b"r/9", headers=orphan[0][1])
    producer.close()
    write(cluster, "chunked", [(s.group_key, encode_train_sample(s), ()) for s in a])
    tp = TopicPartition("chunked", 0)
    # It holds its first chunk: the rest could be behind another producer's open transaction, so it waits
    # that much longer (15 minutes by default) before it is given up.
    monkeypatch.setattr("rollout_stream.reader.assembler.HIDDEN_BY_TRANSACTION_S", 1.5)
    with open_reader("chunked", chunk_timeout_s=0.2) as r:
        assert take(r, 1)[0].groups[0].key == "r/0"
        assert r.commit()
        assert cluster.committed(rank_group_id("trainer", 0))[tp].offset == 0  # maybe still to complete
        time.sleep(0.6)
        assert r.stats.incomplete_chunked_values == 0  # past chunk_timeout_s, not past the transaction's
        deadline = time.monotonic() + 10
        while r.stats.incomplete_chunked_values == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.stats.incomplete_chunked_values == 1
        write(cluster, "chunked", [(s.group_key, encode_train_sample(s), ()) for s in b])
        assert take(r, 1)[0].groups[0].key == "r/1"
        assert r.commit()
    committed = cluster.committed(rank_group_id("trainer", 0))[tp]
    assert committed.offset > 0 and not Mark.parse(committed.offset, committed.metadata)[1].keep
