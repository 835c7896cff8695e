"""The fold's state as bytes, so a newcomer starts from a `Checkpoint` record instead of the log's start.

The admission and prompt fold is a pure function of the records, so its state after offset `through` is
the same in every party: any of them may write it, and a newcomer that loads it and folds the records
after `through` reaches the state of one that folded everything (tests/core/test_checkpoint.py). The
decisions already delivered to waiters (`decided`) are not state: nobody waits on another party's
requests. `FOLD_VERSION` changes whenever the state's shape or the fold's rule does; a checkpoint of
another version is not loaded (the newcomer folds from the start instead).
"""

from __future__ import annotations

import zlib

import msgspec

from rollout_stream.core.admission import _Group, _Pending, _Session, _Trainer  # the fold's own state types
from rollout_stream.core.prompts import PromptLog, SourceState

__all__ = ["FOLD_VERSION", "CheckpointMismatch", "dump_fold", "load_fold"]

FOLD_VERSION = 4  # 4: a failed attempt (`Release.error`) counts; empty declarations are ignored


class CheckpointMismatch(ValueError):
    """A checkpoint of another fold version, or bytes that are not one."""


class _State(msgspec.Struct, kw_only=True):
    limits: tuple[int, int, int]  # suspect, lease, sent expiry (ms)
    next_offset: int
    clock_ms: int
    expired: int
    late_delivered: int
    groups: dict[int, _Group]
    pending: dict[int, _Pending]
    sessions: dict[str, _Session]
    trainers: dict[str, _Trainer]
    by_key: dict[str, int]
    unmatched: dict[str, tuple[str, int | None, int]]
    sources: dict[str, SourceState]
    live: dict[int, tuple[str, int, int]]
    uncommitted: dict[str, dict[int, dict[str, bool]]]
    trainer_sessions: dict[str, str]
    settled_through: dict[str, int]
    duplicates: int
    late_trained: int
    checkpointed_through: int


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_State)


def dump_fold(fold: PromptLog) -> bytes:
    """The fold's state through offset `fold.next_offset - 1`, compressed (a week of settled epochs is mostly
    the same state code over and over)."""
    return zlib.compress(_encoder.encode(_State(
        limits=(fold.suspect_ms, fold.lease_ms, fold.sent_expiry_ms), next_offset=fold.next_offset,
        clock_ms=fold.clock_ms, expired=fold.expired, late_delivered=fold.late_delivered, groups=fold.groups,
        pending=fold.pending, sessions=fold.sessions, trainers=fold.trainers, by_key=fold.by_key,
        unmatched=fold.unmatched, sources=fold.sources, live=fold.live, uncommitted=fold.uncommitted,
        trainer_sessions=fold.trainer_sessions, settled_through=fold.settled_through,
        duplicates=fold.duplicates, late_trained=fold.late_trained,
        checkpointed_through=fold.checkpointed_through)), 1)


def load_fold(state: bytes, fold_version: int) -> PromptLog:
    """A fold that goes on from the checkpoint: fold the records after its `next_offset - 1` into it."""
    if fold_version != FOLD_VERSION:
        raise CheckpointMismatch(f"a checkpoint of fold version {fold_version}, this fold is {FOLD_VERSION}")
    try:
        s = _decoder.decode(zlib.decompress(state))
    except (zlib.error, msgspec.DecodeError) as exc:
        raise CheckpointMismatch(f"not a fold checkpoint: {exc}") from exc
    suspect, lease, expiry = s.limits
    fold = PromptLog(suspect_ms=suspect, lease_ms=lease, sent_expiry_ms=expiry)
    fold.next_offset, fold.clock_ms, fold.expired = s.next_offset, s.clock_ms, s.expired
    fold.late_delivered, fold.groups, fold.pending = s.late_delivered, s.groups, s.pending
    fold.sessions, fold.trainers, fold.by_key, fold.unmatched = s.sessions, s.trainers, s.by_key, s.unmatched
    fold.sources, fold.live, fold.uncommitted = s.sources, s.live, s.uncommitted
    fold.trainer_sessions, fold.settled_through = s.trainer_sessions, s.settled_through
    fold.duplicates, fold.late_trained = s.duplicates, s.late_trained
    fold.checkpointed_through = s.checkpointed_through
    fold.reindex()
    return fold
