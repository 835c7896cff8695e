"""Chunked records: a value larger than one Kafka record travels as records of the same key, each carrying
a slice of it and a manifest header (docs/chunks.md).

The manifest names the whole value by its XXH3-128 digest, so chunks of one value sent twice (a retry, a
replay) are copies of each other, and the reassembled bytes are checked against the name they travel under.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import msgspec
import xxhash

__all__ = ["CHUNK_HEADER", "DEFAULT_CHUNK_BYTES", "ChunkHeader", "ChunkHeaderError", "chunk_header_of",
           "decode_chunk_header", "encode_chunk_header", "split", "value_digest", "without_chunk_header"]

CHUNK_HEADER = "x-chunk"
"""The Kafka header that makes a record one chunk of a larger value."""

DEFAULT_CHUNK_BYTES = 900 * 1024
"""Values above this many bytes are chunked: under a default cluster's 1 MiB `message.max.bytes` with room
for the key, headers and the record batch's own bytes."""


class ChunkHeader(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Chunk `index` of `count` of the value of `total_bytes` bytes whose XXH3-128 digest is `digest`."""

    digest: bytes
    index: int
    count: int
    total_bytes: int


class ChunkHeaderError(ValueError):
    """A chunk header that cannot be read, or does not describe a chunk."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(ChunkHeader)


def value_digest(value: bytes) -> bytes:
    return xxhash.xxh3_128_digest(value)


def encode_chunk_header(header: ChunkHeader) -> bytes:
    return _encoder.encode(header)


def decode_chunk_header(data: bytes) -> ChunkHeader:
    try:
        header = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise ChunkHeaderError(f"unreadable {CHUNK_HEADER} header: {exc}") from None
    if not (len(header.digest) == 16 and 0 <= header.index < header.count and header.total_bytes >= 0):
        raise ChunkHeaderError(
            f"{CHUNK_HEADER} header does not describe a chunk: index {header.index} of {header.count}, "
            f"{header.total_bytes} bytes, a digest of {len(header.digest)} bytes")
    return header


def chunk_header_of(headers: Iterable[tuple[str, bytes]] | None) -> bytes | None:
    """The raw chunk header among a record's headers, or None for a record that is not a chunk."""
    if headers:
        for key, value in headers:
            if key == CHUNK_HEADER:
                return value
    return None


def without_chunk_header(headers: Sequence[tuple[str, bytes]]) -> tuple[tuple[str, bytes], ...]:
    return tuple((k, v) for k, v in headers if k != CHUNK_HEADER)


def split(value: bytes, chunk_bytes: int) -> list[tuple[bytes, bytes]]:
    """(encoded header, slice) for each chunk of `value`, in order: one chunk per `chunk_bytes` bytes."""
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
    digest = value_digest(value)
    total = len(value)
    count = max(1, -(-total // chunk_bytes))
    return [(encode_chunk_header(ChunkHeader(digest, i, count, total)),
             value[i * chunk_bytes:(i + 1) * chunk_bytes]) for i in range(count)]
