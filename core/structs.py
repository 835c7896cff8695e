"""The msgspec structs the hot path keeps by the hundred thousand: frozen, and untracked by the collector.

Tracked, the held samples of every open window and the closed-group memory (up to 200,000 groups for an
hour) would be walked by every full collection of the garbage collector (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import msgspec

from rollout_stream.codec import DeadLetterReason
from rollout_stream.core.digest import DIGEST_ALGORITHM, digest_with, record_digest

__all__ = ["InputRecord", "Member", "HeldSample", "ClosedGroup", "PlainHead"]


class InputRecord(msgspec.Struct, frozen=True, gc=False):
    """One consumed Kafka record, bytes untouched.

    A struct without GC tracking: one is built per consumed record and windows hold many of them.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    # A value reassembled from chunk records (core/chunks.py): the offsets of all of them, each resolved
    # with it; `offset` is the first's.
    chunks: tuple[int, ...] = ()

    @property
    def offsets(self) -> tuple[int, ...]:
        """The input offsets this record resolves when its outcome is committed."""
        return self.chunks or (self.offset,)


class Member(msgspec.Struct, frozen=True, gc=False):
    """A valid sample held in a window: its record and what normalization reads of it (`sample` has
    `reward`, `rollout_id`, `index`, `sibling_index`, like `codec.Sample`)."""

    record: InputRecord
    sample: Any
    rollout: object  # the member itself, or a tuple of members (a rollout of several samples)


class HeldSample(msgspec.Struct, frozen=True, gc=False):
    """What a window keeps of a validated member: the fields `normalize_group` reads.

    Everything else stays in the record's bytes, which outputs embed verbatim; a full decoded `Sample`
    (arrays, prompt, metadata) would double a window's memory, and even an emptied one costs more per sample
    than this (docs/benchmarks.md).
    """

    reward: float | dict[str, float] | None
    rollout_id: int | str | None
    index: int | None
    sibling_index: int


class ClosedGroup(msgspec.Struct, frozen=True, gc=False):
    """What the worker remembers of a resolved group, to recognise late members and copies.

    Up to `max_closed_groups` (200,000) of these live for an hour: as a tracked dataclass holding a frozenset
    each, every full collection of the cyclic garbage collector walked all of them (docs/benchmarks.md).
    Nothing here can form a cycle.
    """

    reason: DeadLetterReason | None  # None: published
    message: str
    deadline_ms: int
    closed_at_ms: int
    digests: tuple[bytes, ...]  # a group's few digests: `in` on a tuple, which the collector stops tracking
    digest_algorithm: str = DIGEST_ALGORITHM  # entries restored from an older changelog may differ
    # A chunked value once whole (core/windows.py `_take_chunk`): the offset of its first chunk, which tells a
    # restore whether it re-reads the value whole or only chunks of one already decided.
    first_offset: int | None = None

    def digest_of(self, record: InputRecord) -> bytes:
        """`record`'s digest, comparable with this group's."""
        if self.digest_algorithm == DIGEST_ALGORITHM:
            return record_digest(record.value)
        try:
            return digest_with(self.digest_algorithm, record.value)
        except KeyError:  # written by a newer stage: a copy cannot be recognised, so it is never dropped
            return b""


class PlainHead(msgspec.Struct, frozen=True, gc=False):
    """What `rollout_stream.core._plain_scan` reads of a plainly valid record (core/plain_scan.py): the
    fields a window
    takes of it (`rollout_stream.core.structs.HeldSample`'s, and the sizes it checks), and its group key."""

    group_key: str
    reward: float
    rollout_id: int | str | None
    index: int | None
    group_size: int | None
    sibling_count: int
    sibling_index: int
