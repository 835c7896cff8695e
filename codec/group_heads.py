"""Group heads: one small record per group published to a train-data topic, written to `<topic>.heads`.

A head says where each of its group's train records lies in train-data (partition, offsets: every chunk
record of a chunked value) and carries what readers need to agree on the global sequence of groups and
each batch's shards without fetching the records themselves: lineage, the rollout a sample belongs to,
token and loss-token counts, weight versions and their spans, rewards, the group's statistics and, when the
stage found one, why the group cannot be collated. A reader then fetches only its own share by offset
(docs/reader.md, "Bytes each rank fetches").

Explicit tags and defaults for every field added later (msgspec's schema evolution rules).
"""

from __future__ import annotations

from typing import Any

import msgspec

from rollout_stream.codec.wire import DecodeError

__all__ = ["GROUP_HEAD_VERSION", "GroupHead", "HeadSample", "decode_group_head", "encode_group_head"]

GROUP_HEAD_VERSION = 1


class HeadSample(msgspec.Struct, kw_only=True, frozen=True, array_like=True):
    """One sample of a head, in the group's publication order (the order of its train records)."""

    offsets: list[int]  # its train record's offset; a chunked value: every chunk record's, ascending
    nbytes: int  # the train record's value bytes (whole, not chunked)
    source_topic: str
    source_partition: int
    source_offset: int
    rollout_id: int | str | None = None
    index: int | None = None
    tokens: int = 0
    response_length: int = 0
    loss_tokens: int = 0  # response tokens with a non-zero loss mask (zero for remove_sample)
    weight_versions: list[str] = msgspec.field(default_factory=list)
    raw_reward: float = 0.0
    reward: float = 0.0
    # A rollout buffer's own raw reward (`metadata["raw_reward"]`), which miles' layout prefers: with it,
    # `has_metadata_raw_reward` (any value, None included, may be the metadata's).
    metadata_raw_reward: Any = None
    has_metadata_raw_reward: bool = False
    # A partial rollout's version spans (`Sample.weight_version_offsets`) and, per span, its loss tokens: what
    # a reader needs to judge staleness per token without the payload (None: the sample has no spans).
    weight_version_offsets: list[int] | None = None
    span_loss_tokens: list[int] | None = None


class GroupHead(msgspec.Struct, kw_only=True, frozen=True, tag="group_head", tag_field="type"):
    """Where a published group's train records are, and what batching decides with."""

    topic: str  # the train-data topic it points into
    partition: int  # its train records' partition (the head's own partition has the same number)
    group_key: str
    rollout_count: int
    mean: float
    std: float
    zero_variance: bool
    samples: list[HeadSample]
    problem: str | None = None  # why the stage found the group cannot be collated
    # The timestamp of its last train record (by offset): the record whose reading completes the group in a
    # whole-topic read, so heads are merged by the key train-data is (None: a head of an older stage).
    timestamp_ms: int | None = None
    schema_version: int = GROUP_HEAD_VERSION


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(GroupHead)


def encode_group_head(head: GroupHead) -> bytes:
    return _encoder.encode(head)


def decode_group_head(data: bytes) -> GroupHead:
    """The head in `data`; DecodeError for anything else (or a newer schema version)."""
    try:
        head = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        text = str(exc)
        raise DecodeError(text, not_a_record=" - at `$" not in text) from exc
    if head.schema_version > GROUP_HEAD_VERSION:
        raise DecodeError(f"group head schema_version {head.schema_version} is newer than this reader's "
                          f"{GROUP_HEAD_VERSION}")
    if any(not s.offsets for s in head.samples):
        raise DecodeError("a head sample without offsets")
    return head
