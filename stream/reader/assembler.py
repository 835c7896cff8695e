"""The whole-topic fold: train-data records (plain or chunked) → whole groups, with `GroupAssembler`.

Decoding, counting and logging live here; `rollout_stream.core.assembly.SampleAssembler` decides what a
sample does to its group, `rollout_stream.core.chunks.ChunkAssembler` joins chunk records into their value.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from rollout_stream.codec import DeadLetterReason, DecodeError, decode_train_sample
from rollout_stream.codec.chunks import ChunkHeaderError, chunk_header_of, decode_chunk_header
from rollout_stream.core.assembly import AssembledGroup, ReadMarks, SampleAssembler
from rollout_stream.core.chunks import ChunkAssembler, ChunkKey, Copy, Refused
from rollout_stream.core.structs import InputRecord
from rollout_stream.logs import log_event
from rollout_stream.reader.errors import ChunkLimitError
from rollout_stream.reader.stats import ReaderStats

__all__ = ["CHUNK_TIMEOUT_S", "HIDDEN_BY_TRANSACTION_S", "MAX_OPEN_CHUNK_BYTES", "GroupAssembler"]

log = logging.getLogger("rollout_stream.reader")

# Open chunk bytes the reader holds at most (`max_open_chunk_bytes`).
MAX_OPEN_CHUNK_BYTES = 1 << 30
# How long after its first chunk was written a chunked value may stay incomplete in a partition read to its
# end before it is dropped (`chunk_timeout_s`): a read_committed reader can see part of a committed
# transaction while an earlier open one hides the rest, for as long as that one stays open.
CHUNK_TIMEOUT_S = 60.0
# A value holding its first chunk waits this much longer: the stage writes a value's chunks in order in one
# transaction, so the rest can only be hidden behind another producer's open transaction, which the broker
# aborts within its transaction.max.timeout.ms (15 minutes by default).
HIDDEN_BY_TRANSACTION_S = 15 * 60.0


class GroupAssembler:
    """Whole groups from one topic's records: decodes, counts and logs; `rollout_stream.core.assembly`
    decides.

    Chunk records (an `x-chunk` header) are reassembled first (`rollout_stream.core.chunks.ChunkAssembler`,
    per partition and value digest, in any order, copies of a held chunk dropped): each chunk's offset is held
    while the value is open, and the whole value is taken as one record that carries all of them, so they are
    released together, when its group is yielded or it is dropped. What cannot become a whole value:

    * chunks that disagree (count, size, different bytes at one index) or whose joined bytes do not match
      the value's digest: dropped, logged (`chunks.refused`), counted in `corrupt_chunked_values`, like an
      undecodable record (a bad record in the log must not stop every restart of the trainer);
    * a value still incomplete in a partition read to its end `chunk_timeout_s` after its first chunk was
      written (15 minutes more when it holds its first chunk: the rest may be hidden behind another
      producer's open transaction until the broker aborts it; `expire_chunks`): dropped, logged
      (`chunks.incomplete`), counted in
      `incomplete_chunked_values`. The stage writes all chunks of a value in one transaction, so this is
      either a value whose first chunks precede where reading started (a commit whose metadata was
      truncated, an offset reset, retention: its value was consumed before, or is lost) or a bug or a
      writer outside transactions;
    * more open chunk bytes than `max_open_chunk_bytes` (or one value larger): `ChunkLimitError`, a
      setting to raise, never a silent drop.

    `marks`: the read marks it holds and releases offsets in; `stats`: where it counts. Per partition it
    keeps at most `max_pending_per_partition` incomplete groups (the oldest is abandoned) and remembers the
    last `remember_per_partition` groups, to drop complete copies. `chunk_timeout_s`: see above.
    """

    def __init__(self, marks: ReadMarks, stats: ReaderStats, *, max_pending_per_partition: int = 1024,
                 remember_per_partition: int = 20_000, max_open_chunk_bytes: int = MAX_OPEN_CHUNK_BYTES,
                 chunk_timeout_s: float = CHUNK_TIMEOUT_S) -> None:
        self.marks = marks
        self.stats = stats
        self.samples = SampleAssembler(max_pending_per_partition=max_pending_per_partition,
                                       remember_per_partition=remember_per_partition)
        self.max_open_chunk_bytes = max_open_chunk_bytes
        self.chunks = ChunkAssembler(int(chunk_timeout_s * 1000), max_open_chunk_bytes)

    def accept(self, partition: int, offset: int, timestamp_ms: int, value: bytes | None,
               headers: Sequence[tuple[str, bytes]] | None = None) -> AssembledGroup | None:
        chunks: tuple[int, ...] = ()
        if headers and (raw := chunk_header_of(headers)) is not None:
            whole = self._chunk(partition, offset, timestamp_ms, value, raw)
            if whole is None:
                return None
            value, chunks = whole.value, whole.chunks
            nbytes = len(value or b"")
        else:
            nbytes = len(value or b"")
            self.stats.records += 1
            self.stats.bytes += nbytes
        try:
            if value is None:
                raise DecodeError("record has no value (tombstone)")
            sample = decode_train_sample(value)
        except DecodeError as exc:
            self.stats.decode_errors += 1
            self.marks.read(partition, offset, hold=False)
            if chunks:
                self.marks.release(partition, chunks)
            log_event(log, "record.undecodable", logging.WARNING, partition=partition, offset=offset,
                      error=exc.message[:300])
            return None
        added = self.samples.add(partition, offset, timestamp_ms, sample, nbytes, chunks)
        self.marks.read(partition, offset, hold=added.hold)
        if chunks and not added.hold:
            self.marks.release(partition, chunks)
        if added.release:
            self.marks.release(partition, added.release)
        if added.duplicate == "record":
            self.stats.duplicate_records += 1
        elif added.duplicate == "group":
            self.stats.duplicate_groups += 1
        for old in added.abandoned:
            self.stats.abandoned_groups += 1
            log_event(log, "group.abandoned", logging.WARNING, partition=partition, group=old.key,
                      have=old.have, expected=old.expected, first_offset=old.first_offset)
        return added.group

    def _chunk(self, partition: int, offset: int, timestamp_ms: int, value: bytes | None,
               raw: bytes) -> InputRecord | None:
        """A chunk record: the whole value once its last chunk is here (a record with all their offsets
        in `chunks`), else None (held, or dropped)."""
        stats, marks, assembler = self.stats, self.marks, self.chunks
        stats.records += 1
        stats.bytes += len(value or b"")
        try:
            header = decode_chunk_header(raw)
        except ChunkHeaderError as exc:
            stats.decode_errors += 1
            marks.read(partition, offset, hold=False)
            log_event(log, "record.undecodable", logging.WARNING, partition=partition, offset=offset,
                      error=str(exc)[:300])
            return None
        ckey: ChunkKey = (partition, header.digest, "")
        if assembler.deadline_passed(ckey, timestamp_ms):  # written after the value's chunks timed out
            self._close_incomplete(ckey)
        added = assembler.add(ckey, InputRecord("", partition, offset, timestamp_ms, None, value), header)
        if added is None:
            marks.read(partition, offset, hold=True)
            if assembler.open_bytes > self.max_open_chunk_bytes:
                raise ChunkLimitError(
                    f"open chunked values hold {assembler.open_bytes} bytes, over max_open_chunk_bytes="
                    f"{self.max_open_chunk_bytes} ({len(assembler.open)} values open; the last chunk read: "
                    f"partition {partition} offset {offset})")
            return None
        marks.read(partition, offset, hold=False)  # held again below if it completed the value
        if type(added) is Copy:
            stats.duplicate_records += 1
            return None
        if type(added) is Refused:
            if added.reason is DeadLetterReason.GROUP_TOO_LARGE:
                raise ChunkLimitError(
                    f"a chunked value of {header.total_bytes} bytes (partition {partition} offset {offset}) "
                    f"is larger than max_open_chunk_bytes={self.max_open_chunk_bytes}")
            self._dropped(added)
            return None
        assert not isinstance(added, Copy | Refused)
        stats.chunked_values += 1
        return added.record

    def expire(self, now_ms: int, read_to_end: Callable[[int], bool]) -> None:
        """The fold's timer (`rollout_stream.reader.sources.GroupFold`): incomplete chunked values expire."""
        if self.chunks.open:
            self.expire_chunks(now_ms, read_to_end)

    def taken(self, group: AssembledGroup) -> tuple[Sequence[int], None]:
        """A merged group leaves the fold: its records' offsets may be committed once it is yielded."""
        return group.offsets, None

    def expire_chunks(self, now_ms: int, read_to_end: Callable[[int], bool]) -> None:
        """Drop chunked values still incomplete `chunk_timeout_s` after their first chunk was written (plus
        HIDDEN_BY_TRANSACTION_S when the first chunk is here), in partitions read to their end."""
        hidden_ms = int(HIDDEN_BY_TRANSACTION_S * 1000)
        due = [k for k, c in self.chunks.open.items() if read_to_end(k[0]) and (
            c.deadline_ms < now_ms if c.parts[0] is None else c.deadline_ms + hidden_ms < now_ms)]
        for ckey in due:
            self._close_incomplete(ckey)

    def _close_incomplete(self, ckey: ChunkKey) -> None:
        first_missing = self.chunks.open[ckey].parts[0] is None
        self._dropped(self.chunks.close_incomplete(ckey), first_missing)

    def _dropped(self, refused: Refused, first_missing: bool = False) -> None:
        """Chunks that do not make a value: released (their offsets may be committed), counted, logged."""
        parts = refused.parts
        partition = parts[0].partition
        self.marks.release(partition, [p.offset for p in parts])
        offsets = sorted(p.offset for p in parts)
        if refused.reason is DeadLetterReason.INCOMPLETE_CHUNKS:
            self.stats.incomplete_chunked_values += 1
            log_event(log, "chunks.incomplete", logging.WARNING, partition=partition, first_offset=offsets[0],
                      last_offset=offsets[-1], error=refused.message[:300],
                      cause=("its first chunk precedes where reading started (a commit whose metadata was "
                             "truncated, an offset reset, retention)" if first_missing else
                             "a writer outside transactions, or a bug"))
        else:
            self.stats.corrupt_chunked_values += 1
            log_event(log, "chunks.refused", logging.WARNING, partition=partition, first_offset=offsets[0],
                      last_offset=offsets[-1], reason=refused.reason.value, error=refused.message[:300])
