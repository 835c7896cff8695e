"""Changelog records: the worker's closed-group memory and read position, kept in a compacted topic.

Written in the same Kafka transaction as the outputs and input offsets they describe, so that a worker
taking over a partition restores exactly the state that the committed outputs imply.
"""

from __future__ import annotations

import msgspec

__all__ = ["ClosedGroupEntry", "PartitionPosition", "POSITION_KEY", "changelog_key", "parse_changelog_key",
           "encode_changelog", "decode_changelog"]

POSITION_KEY = b"\x00position"


class ClosedGroupEntry(msgspec.Struct, tag="closed_group", tag_field="type"):
    reason: str | None  # None: published
    message: str
    deadline_ms: int
    closed_at_ms: int
    digests: list[bytes]
    schema_version: int = 1
    # Entries written before the algorithm was recorded used BLAKE2b-128; new ones always name theirs.
    digest_algorithm: str = "blake2b-128"
    first_offset: int | None = None  # a chunked value once whole: its first chunk's input offset


class PartitionPosition(msgspec.Struct, tag="position", tag_field="type"):
    """Every input record below `next_offset` has been processed and its outcome committed."""

    next_offset: int
    schema_version: int = 1


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ClosedGroupEntry | PartitionPosition)
_key_decoder = msgspec.msgpack.Decoder(tuple[str, str])


def changelog_key(group_key: str, replay_id: str) -> bytes:
    return _encoder.encode((group_key, replay_id))


def parse_changelog_key(key: bytes) -> tuple[str, str]:
    return _key_decoder.decode(key)


def encode_changelog(record: ClosedGroupEntry | PartitionPosition) -> bytes:
    return _encoder.encode(record)


def decode_changelog(data: bytes) -> ClosedGroupEntry | PartitionPosition:
    return _decoder.decode(data)
