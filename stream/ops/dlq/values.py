"""Dead-letter values: a plain record is one, and so are the chunk records of one chunked value.

A value larger than one Kafka record lands in the dead-letter topic as chunk records (docs/dlq.md, "Chunked
values"): its slices alone are not samples, so the tools show, count and replay the value they make up.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rollout_stream.codec.chunks import ChunkHeader
from rollout_stream.core.chunks import join_chunks
from rollout_stream.ops.dlq.record import DeadLetterRecord, SampleHead, sample_head

__all__ = ["DeadLetterValue", "ValueGrouper", "ValueKey", "group_values", "value_key"]

ValueKey = tuple[int, str | None, int | None, bytes, str | None]
"""(dead-letter partition, original topic, original partition, digest, replay id): the worker reassembles
chunks by input partition, digest and replay id, so chunks of one value share all of these."""

DEFAULT_WINDOW = 1000
"""Offsets within which the chunk records of one value are looked for: the worker writes them together."""


def value_key(record: DeadLetterRecord) -> ValueKey | None:
    chunk = record.chunk
    if chunk is None:
        return None
    return (record.partition, record.original_topic, record.original_partition, chunk.digest,
            record.replay_id)


@dataclass(slots=True)
class DeadLetterValue:
    """One record, or the chunk records of one value found so far (offset order)."""

    records: list[DeadLetterRecord]
    _whole: bytes | None = field(default=None, init=False, repr=False)

    @property
    def first(self) -> DeadLetterRecord:
        return self.records[0]

    @property
    def chunk(self) -> ChunkHeader | None:
        return self.first.chunk

    @property
    def offsets(self) -> tuple[int, ...]:
        return tuple(r.offset for r in self.records)

    def add(self, record: DeadLetterRecord) -> None:
        if record.offset not in self.offsets:
            self.records.append(record)
            self.records.sort(key=lambda r: r.offset)
            self._whole = None

    def _by_index(self) -> dict[int, list[DeadLetterRecord]]:
        out: dict[int, list[DeadLetterRecord]] = {}
        for r in self.records:
            if r.chunk is not None:
                out.setdefault(r.chunk.index, []).append(r)
        return out

    def missing(self) -> list[int]:
        chunk = self.chunk
        if chunk is None:
            return []
        present = self._by_index()
        return [i for i in range(chunk.count) if i not in present]

    def problem(self) -> str | None:
        """Why the chunks do not make the value up, or None (a plain record, or a whole value)."""
        chunk = self.chunk
        if chunk is None:
            return None
        if any((r.chunk.count, r.chunk.total_bytes) != (chunk.count, chunk.total_bytes)
               for r in self.records if r.chunk is not None):
            return f"chunk records of value {chunk.digest.hex()} disagree on its size"
        by_index = self._by_index()
        differ = sorted(i for i, rs in by_index.items() if len({r.value for r in rs}) > 1)
        if differ:
            return f"chunk {_indices(differ)} present with different bytes"
        missing = self.missing()
        if missing:
            present = chunk.count - len(missing)
            return f"{present} of {chunk.count} chunks present (missing {_indices(missing)})"
        if self._join() is None:
            return f"chunks do not reassemble to value {chunk.digest.hex()} (digest mismatch)"
        return None

    def _join(self) -> bytes | None:
        """The reassembled bytes when they match the digest they travel under."""
        chunk = self.chunk
        if chunk is None:
            return self.first.value
        if self._whole is None:
            by_index = self._by_index()
            if len(by_index) != chunk.count:
                return None
            value, mismatch = join_chunks(chunk, (by_index[i][0].value for i in range(chunk.count)))
            if mismatch is not None:
                return None
            self._whole = value
        return self._whole

    @property
    def whole(self) -> bool:
        return self.chunk is None or self.problem() is None

    @property
    def value(self) -> bytes | None:
        """A plain record's bytes, or the chunks reassembled; None when they do not make the value up."""
        return self._join() if self.whole else None

    def head(self) -> SampleHead | None:
        return sample_head(self.value)

    def chunk_summary(self) -> dict[str, Any] | None:
        chunk = self.chunk
        if chunk is None:
            return None
        return {
            "count": chunk.count,
            "present": chunk.count - len(self.missing()),
            "missing": self.missing(),
            "digest": chunk.digest.hex(),
            "total_bytes": chunk.total_bytes,
            "offsets": list(self.offsets),
            "problem": self.problem(),
        }

    def summary(self) -> dict[str, Any]:
        """A `dlq list` row: the record's for a plain record; the value's for chunk records."""
        doc = self.first.summary()
        chunks = self.chunk_summary()
        if chunks is None:
            return doc
        head = self.head()
        doc.update(rollout=head.rollout if head else None, sibling_index=head.sibling_index if head else None,
                   value_bytes=chunks["total_bytes"], chunks=chunks)
        return doc


def _indices(values: list[int]) -> str:
    return ", ".join(map(str, values))


@dataclass
class ValueGrouper:
    """Records of a scan (partition by partition, offset order) in, values out in the order of their first
    record. A value whose chunks are not all there within `window` offsets goes out as it is, so memory
    stays bounded by the window."""

    window: int = DEFAULT_WINDOW
    pending: dict[ValueKey, DeadLetterValue] = field(default_factory=dict)
    ready: list[tuple[int, int, DeadLetterValue]] = field(default_factory=list)  # a heap: first offset
    partition: int | None = None
    _seq: int = 0

    def add(self, record: DeadLetterRecord) -> list[DeadLetterValue]:
        out = self.flush() if self.partition not in (None, record.partition) else []
        self.partition = record.partition
        key = value_key(record)
        if key is None:
            self._ready(DeadLetterValue([record]))
        else:
            held = self.pending.get(key)
            if held is None:
                held = self.pending[key] = DeadLetterValue([record])
            else:
                held.add(record)
            if not held.missing():
                self._ready(self.pending.pop(key))
        for k in [k for k, v in self.pending.items() if v.first.offset < record.offset - self.window]:
            self._ready(self.pending.pop(k))
        floor = min((v.first.offset for v in self.pending.values()), default=None)
        while self.ready and (floor is None or self.ready[0][0] < floor):
            out.append(heapq.heappop(self.ready)[2])
        return out

    def flush(self) -> list[DeadLetterValue]:
        """Every value held, complete or not, in order (the scan ended, or moved to the next partition)."""
        for v in self.pending.values():
            self._ready(v)
        self.pending.clear()
        out = [heapq.heappop(self.ready)[2] for _ in range(len(self.ready))]
        return out

    def floor(self) -> int | None:
        """The first offset of the current partition whose value is still held."""
        return min([*(v.first.offset for v in self.pending.values()), *(o for o, _, _ in self.ready)],
                   default=None)

    def _ready(self, value: DeadLetterValue) -> None:
        self._seq += 1
        heapq.heappush(self.ready, (value.first.offset, self._seq, value))


def group_values(records: Iterable[DeadLetterRecord], window: int = DEFAULT_WINDOW) -> list[DeadLetterValue]:
    grouper = ValueGrouper(window)
    out = [v for r in records for v in grouper.add(r)]
    return out + grouper.flush()
