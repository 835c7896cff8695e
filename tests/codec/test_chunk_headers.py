"""Chunk headers and splitting: the manifest every chunk carries, and slices that join back exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_stream.codec.chunks import (
    CHUNK_HEADER,
    ChunkHeader,
    ChunkHeaderError,
    chunk_header_of,
    decode_chunk_header,
    encode_chunk_header,
    split,
    value_digest,
    without_chunk_header,
)


@given(st.binary(max_size=5000), st.integers(min_value=1, max_value=700))
def test_split_slices_join_back_and_every_header_names_the_whole(value: bytes, size: int) -> None:
    chunks = split(value, size)
    headers = [decode_chunk_header(h) for h, _ in chunks]
    assert b"".join(part for _, part in chunks) == value
    assert all(len(part) <= size for _, part in chunks)
    assert [h.index for h in headers] == list(range(len(chunks)))
    manifest = {(h.digest, h.count, h.total_bytes) for h in headers}
    assert manifest == {(value_digest(value), len(chunks), len(value))}


def test_an_empty_value_is_one_empty_chunk() -> None:
    ((header, part),) = split(b"", 10)
    assert part == b"" and decode_chunk_header(header).count == 1


@pytest.mark.parametrize("raw", [b"", b"\xc1", encode_chunk_header(ChunkHeader(b"x" * 16, 3, 3, 10)),
                                 encode_chunk_header(ChunkHeader(b"short", 0, 1, 10)),
                                 encode_chunk_header(ChunkHeader(b"x" * 16, 0, 1, -1))])
def test_a_header_that_does_not_describe_a_chunk_is_refused_with_a_reason(raw: bytes) -> None:
    with pytest.raises(ChunkHeaderError, match=CHUNK_HEADER):
        decode_chunk_header(raw)


def test_split_refuses_a_chunk_size_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        split(b"abc", 0)


def test_the_header_is_found_and_removed_among_others() -> None:
    headers = (("a", b"1"), (CHUNK_HEADER, b"h"), ("b", b"2"))
    assert chunk_header_of(headers) == b"h"
    assert chunk_header_of(()) is None and chunk_header_of(None) is None
    assert without_chunk_header(headers) == (("a", b"1"), ("b", b"2"))
