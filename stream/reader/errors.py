"""The reader's errors: `ReaderError` (the fetch failed; the cause is chained) and what it is made of.

    RuntimeFailure (rollout_stream.errors)
    └── ReaderError             the background fetch failed (broker-fatal error), or the reader is closed
        ├── ChunkLimitError     open chunked values need more than `max_open_chunk_bytes`
        └── PayloadError        a train record a group head points at is missing or is not what it says

    ConfigurationError (rollout_stream.errors)
    ├── WorldMismatch           this rank's settings disagree with its trainer group's committed world, or a
    │                           rescale was asked for where none can start
    └── UncoveredRecords        `fetch="own"`: train-data holds records no group head covers

A topic that does not exist is `rollout_stream.topics.MissingTopic` (a setting to fix: exit 2).
"""

from __future__ import annotations

from rollout_stream.errors import ConfigurationError, RuntimeFailure

__all__ = ["ChunkLimitError", "PayloadError", "ReaderError", "UncoveredRecords", "WorldMismatch"]


class ReaderError(RuntimeFailure, RuntimeError):
    """The background reader failed (broker-fatal error); the cause is chained."""


class ChunkLimitError(ReaderError):
    """Chunked values open at once (or one of them) need more than the reader's `max_open_chunk_bytes`:
    raise it (a group's chunked values are open together while it is read)."""


class PayloadError(ReaderError):
    """A train record a head points at is missing, or is not the sample the head says (lineage, digest)."""


class WorldMismatch(ConfigurationError, ValueError):
    """A rank's settings disagree with the world its trainer group committed (or a rescale cannot start):
    the message names each setting and both values (docs/reader.md, "One world per trainer group")."""


class UncoveredRecords(ConfigurationError, LookupError):
    """`fetch="own"`: train-data holds records that no group head covers (groups a stage published without
    `--write-heads`), which rank-local fetch would never read; read the topic with `fetch="all"`."""
