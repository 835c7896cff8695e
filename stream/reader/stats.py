"""What a reader counted: `ReaderStats`.

Two parties count: the fetch thread (records, groups, what it dropped) and the trainer's thread (batches, what
they skipped, payload bytes). Each writes its own `ReaderStats` only; `TrainDataReader.stats` adds the two.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ReaderStats"]


@dataclass
class ReaderStats:
    """Counts since the reader started.

    `records`, `bytes`: train-data records read (with `fetch="own"`: head records) and their value bytes.
    `groups`: groups assembled and merged into the global sequence. `batches`: batches yielded.
    `skipped_stale_groups`, `skipped_invalid_groups`: groups left out of batches as too old for the weight
    version, or as impossible to collate or judge. `skipped_superseded_groups`: left out because another
    attempt of their prompt trains (the fence, docs/loop.md). `duplicate_records`: copies of a record already
    held (at-least-once republication). `duplicate_groups`: complete copies of a group already assembled.
    `decode_errors`: records that do not decode. `abandoned_groups`: incomplete groups evicted by the
    per-partition bound. `chunked_values`: values reassembled from chunk records (each chunk counts in
    `records`). `payload_bytes`: with `fetch="own"`, train-data bytes received (its rows', and any fetched
    with them). `incomplete_chunked_values`: chunks of a value that never completed, dropped.
    `corrupt_chunked_values`: chunks that disagree or do not match their value's digest, dropped.
    `stale_rollouts`, `stale_tokens`: with staleness by rollout or by token, rollouts and loss tokens left out
    of groups that trained (all ranks').
    """

    records: int = 0
    bytes: int = 0
    groups: int = 0
    batches: int = 0
    skipped_stale_groups: int = 0
    skipped_invalid_groups: int = 0
    skipped_superseded_groups: int = 0
    duplicate_records: int = 0
    duplicate_groups: int = 0
    decode_errors: int = 0
    abandoned_groups: int = 0
    chunked_values: int = 0
    payload_bytes: int = 0
    incomplete_chunked_values: int = 0
    corrupt_chunked_values: int = 0
    stale_rollouts: int = 0
    stale_tokens: int = 0

    def __add__(self, other: ReaderStats) -> ReaderStats:
        return ReaderStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})
