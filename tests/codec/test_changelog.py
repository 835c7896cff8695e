"""Changelog records stay readable across versions: entries written before a field existed get its default."""

from __future__ import annotations

import msgspec

from rollout_stream.codec import ClosedGroupEntry, decode_changelog, encode_changelog


def test_an_entry_written_before_digest_algorithm_existed_reads_as_blake2b():
    old = msgspec.msgpack.encode({"type": "closed_group", "reason": None, "message": "", "deadline_ms": 1,
                                  "closed_at_ms": 2, "digests": [b"d" * 16], "schema_version": 1})
    entry = decode_changelog(old)
    assert isinstance(entry, ClosedGroupEntry) and entry.digest_algorithm == "blake2b-128"


def test_new_entries_name_their_algorithm():
    entry = ClosedGroupEntry(None, "", 1, 2, [b"d" * 16], digest_algorithm="xxh3-128")
    assert decode_changelog(encode_changelog(entry)) == entry
    assert b"xxh3-128" in encode_changelog(entry)
