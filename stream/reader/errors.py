"""The reader's errors: `ReaderError` (the fetch failed; the cause is chained) and what it is made of.

    RuntimeFailure (rollout_stream.errors)
    └── ReaderError             the background fetch failed (broker-fatal error), or the reader is closed
        ├── ChunkLimitError     open chunked values need more than `max_open_chunk_bytes`
        └── PayloadError        a train record a group head points at is missing or is not what it says

A topic that does not exist is `rollout_stream.topics.MissingTopic` (a setting to fix: exit 2).
"""

from __future__ import annotations

from rollout_stream.errors import RuntimeFailure

__all__ = ["ChunkLimitError", "PayloadError", "ReaderError"]


class ReaderError(RuntimeFailure, RuntimeError):
    """The background reader failed (broker-fatal error); the cause is chained."""


class ChunkLimitError(ReaderError):
    """Chunked values open at once (or one of them) need more than the reader's `max_open_chunk_bytes`:
    raise it (a group's chunked values are open together while it is read)."""


class PayloadError(ReaderError):
    """A train record a head points at is missing, or is not the sample the head says (lineage, digest)."""
