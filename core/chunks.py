"""Reassembly of chunked records (docs/chunks.md): chunks of one value, in any order and with copies, become
one record when all have arrived and the bytes match the digest they travel under.

Pure: the window store owns one assembler and remembers what it decided (core/windows.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from rollout_stream.codec import DeadLetterReason
from rollout_stream.codec.chunks import ChunkHeader, value_digest, without_chunk_header
from rollout_stream.core.structs import InputRecord

__all__ = ["ChunkAssembler", "ChunkKey", "ChunkSet", "Whole", "Copy", "Refused", "Added", "join_chunks"]

R = DeadLetterReason

ChunkKey = tuple[int, bytes, str]
"""(input partition, the value's digest, replay id): a replayed value is reassembled apart from its
original."""


@dataclass(slots=True)
class ChunkSet:
    """The chunks of one value received so far."""

    header: ChunkHeader
    deadline_ms: int
    parts: list[InputRecord | None]
    received: int = 0
    nbytes: int = 0

    def records(self) -> tuple[InputRecord, ...]:
        return tuple(p for p in self.parts if p is not None)


@dataclass(frozen=True, slots=True)
class Whole:
    """The value reassembled: one record with the offsets of the chunks it was made of."""

    record: InputRecord
    parts: tuple[InputRecord, ...]


@dataclass(frozen=True, slots=True)
class Copy:
    """An exact copy of a chunk already held."""


@dataclass(frozen=True, slots=True)
class Refused:
    reason: DeadLetterReason
    message: str
    parts: tuple[InputRecord, ...]


Added = Whole | Copy | Refused | None
"""None: held, the value is not whole yet."""


@dataclass(slots=True)
class ChunkAssembler:
    """Values whose chunks are arriving. What became of a value once decided (whole or refused) is the
    caller's to remember: the window store keeps it with its closed groups, in the changelog."""

    timeout_ms: int
    max_value_bytes: int
    open: dict[ChunkKey, ChunkSet] = field(default_factory=dict)
    open_bytes: int = 0

    def add(self, ckey: ChunkKey, record: InputRecord, header: ChunkHeader) -> Added:
        chunks = self.open.get(ckey)
        if chunks is None:
            if header.total_bytes > self.max_value_bytes:
                return Refused(R.GROUP_TOO_LARGE,
                               f"chunked value of {header.total_bytes} bytes is larger than the worker's cap "
                               f"of {self.max_value_bytes} bytes for one group", (record,))
            chunks = ChunkSet(header, record.timestamp_ms + self.timeout_ms, [None] * header.count)
            self.open[ckey] = chunks
        first = chunks.header
        if (header.count, header.total_bytes) != (first.count, first.total_bytes):
            return self._refuse(ckey, record, R.CHUNK_CONFLICT,
                                f"chunks of value {header.digest.hex()} disagree: {first.count} chunks of "
                                f"{first.total_bytes} bytes and {header.count} of {header.total_bytes}")
        held = chunks.parts[header.index]
        if held is not None:
            if held.value == record.value:
                return Copy()
            return self._refuse(ckey, record, R.CHUNK_CONFLICT,
                                f"chunk {header.index} of value {header.digest.hex()} arrived twice with "
                                f"different bytes (offsets {held.offset} and {record.offset})")
        size = len(record.value or b"")
        if chunks.nbytes + size > first.total_bytes:
            return self._refuse(ckey, record, R.CHUNK_DIGEST_MISMATCH,
                                f"chunks of value {header.digest.hex()} hold more than its "
                                f"{first.total_bytes} bytes")
        chunks.parts[header.index] = record
        chunks.received += 1
        chunks.nbytes += size
        self.open_bytes += size
        if chunks.received < first.count:
            return None
        return self._join(ckey, chunks)

    def expire(self, now_ms: int, partitions: set[int]) -> list[tuple[ChunkKey, Refused]]:
        """Values past their deadline with chunks missing, in partitions whose backlog has been read."""
        due = [k for k, c in self.open.items() if k[0] in partitions and c.deadline_ms < now_ms]
        return [(k, self.close_incomplete(k)) for k in due]

    def close_incomplete(self, ckey: ChunkKey) -> Refused:
        chunks = self._close(ckey)
        h = chunks.header
        return Refused(R.INCOMPLETE_CHUNKS,
                       f"value {h.digest.hex()} timed out after {self.timeout_ms / 1000:g}s with "
                       f"{chunks.received} of {h.count} chunks ({chunks.nbytes} of {h.total_bytes} bytes)",
                       chunks.records())

    def deadline_passed(self, ckey: ChunkKey, timestamp_ms: int) -> bool:
        """A chunk written after its value's deadline: the value was incomplete whatever the clock says."""
        chunks = self.open.get(ckey)
        return chunks is not None and timestamp_ms > chunks.deadline_ms

    def drop_partition(self, partition: int) -> None:
        for k in [k for k in self.open if k[0] == partition]:
            self._close(k)

    def _refuse(self, ckey: ChunkKey, record: InputRecord, reason: DeadLetterReason, message: str) -> Refused:
        chunks = self._close(ckey)
        return Refused(reason, message, (*chunks.records(), record))

    def _close(self, ckey: ChunkKey) -> ChunkSet:
        chunks = self.open.pop(ckey)
        self.open_bytes -= chunks.nbytes
        return chunks

    def _join(self, ckey: ChunkKey, chunks: ChunkSet) -> Whole | Refused:
        parts = chunks.records()
        value, mismatch = join_chunks(chunks.header, (p.value for p in parts))
        self._close(ckey)
        if mismatch is not None:
            return Refused(R.CHUNK_DIGEST_MISMATCH, mismatch, parts)
        last = max(parts, key=lambda p: p.offset)
        first = min(parts, key=lambda p: p.offset)
        record = InputRecord(first.topic, first.partition, first.offset, last.timestamp_ms, first.key, value,
                             without_chunk_header(first.headers), tuple(p.offset for p in parts))
        return Whole(record, parts)


def join_chunks(header: ChunkHeader, slices: Iterable[bytes | None]) -> tuple[bytes, str | None]:
    """Every chunk's slice of one value, in index order, joined; and why the bytes are not the value `header`
    names (its size or digest differ), or None when they are."""
    value = b"".join(s or b"" for s in slices)
    if len(value) == header.total_bytes and value_digest(value) == header.digest:
        return value, None
    return value, (f"value {header.digest.hex()} reassembled from {header.count} chunks has {len(value)} "
                   f"bytes and digest {value_digest(value).hex()}")
