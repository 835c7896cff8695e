"""The fold's state as bytes, so a newcomer starts from a `Checkpoint` record instead of the log's start.

The admission and prompt fold is a pure function of the records, so its state after offset `through` is
the same in every party: any of them may write it, and a newcomer that loads it and folds the records
after `through` reaches the state of one that folded everything (tests/core/test_prompts.py). The
decisions already delivered to waiters (`decided`) are not state: nobody waits on another party's
requests; the fold's indexes are derived and rebuilt on load. `FOLD_VERSION` changes whenever the state's
shape or the fold's rule does; a checkpoint of another version is not loaded (the newcomer looks further
back, or folds from the start).

Most of a large dataset's state is its shrunk prompts' state codes (`Epoch.codes`). An open epoch's codes
travel in the epoch's own order, as far as it has handed out: prompts settle roughly in that order, so the
codes are a long run of one value that compresses to almost nothing (docs/loop.md: a 10,000,000-prompt
epoch half handed out). A settled epoch's travel by row. The bytes may exceed one Kafka record;
`rollout_stream.pacing.checkpoints` splits them into parts.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import deque

import msgspec
import numpy as np

from rollout_stream.core.admission import _Group, _Pending, _Session, _Trainer  # the fold's own state types
from rollout_stream.core.prompt_records import Epoch, PromptRecord
from rollout_stream.core.prompts import PromptLog, SourceState

__all__ = ["FOLD_VERSION", "CheckpointMismatch", "dump_fold", "load_fold"]

# 5: an epoch's order from numpy's frozen RandomState; settled prompts past the newest KEEP_SETTLED of an open
# epoch shrink to a code; epochs travel as `_EpochState`
# 6: a take of a session whose lease ran out is handed no prompt; exhaustion waits on lapsed sent groups
# 7: what staleness by rollout or token left out of the groups that trained, per attempt and epoch
FOLD_VERSION = 7


class CheckpointMismatch(ValueError):
    """A checkpoint of another fold version, or bytes that are not one."""


class _EpochState(msgspec.Struct, kw_only=True):
    cursor: int
    final: int
    reissued: int
    reissued_by: dict[str, int]
    prompts: dict[int, PromptRecord]
    recent: list[int]
    reasons: dict[int, str]
    codes: bytes | None  # the shrunk prompts' codes: `in_order`, those of the first `cursor` of the order
    in_order: bool
    partial: int = 0
    excluded_rollouts: int = 0
    excluded_tokens: int = 0


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
    sources: dict[str, SourceState]  # each without its epochs: they are `epochs`
    epochs: dict[str, list[_EpochState]]
    live: dict[int, tuple[str, int, int]]
    uncommitted: dict[str, dict[int, dict[str, bool]]]
    excluded: dict[str, dict[int, dict[str, tuple[int, int]]]]
    trainer_sessions: dict[str, str]
    settled_through: dict[str, int]
    duplicates: int
    late_trained: int
    checkpointed_through: int


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_State)


def dump_fold(fold: PromptLog) -> bytes:
    """The fold's state through offset `fold.next_offset - 1`, compressed."""
    return zlib.compress(_encoder.encode(_State(
        limits=(fold.suspect_ms, fold.lease_ms, fold.sent_expiry_ms), next_offset=fold.next_offset,
        clock_ms=fold.clock_ms, expired=fold.expired, late_delivered=fold.late_delivered, groups=fold.groups,
        pending=fold.pending, sessions=fold.sessions, trainers=fold.trainers, by_key=fold.by_key,
        unmatched=fold.unmatched,
        sources={name: dataclasses.replace(src, epochs=[]) for name, src in fold.sources.items()},
        epochs={name: [_epoch_out(fold, name, number, e) for number, e in enumerate(src.epochs)]
                for name, src in fold.sources.items()},
        live=fold.live, uncommitted=fold.uncommitted, excluded=fold.excluded,
        trainer_sessions=fold.trainer_sessions,
        settled_through=fold.settled_through, duplicates=fold.duplicates, late_trained=fold.late_trained,
        checkpointed_through=fold.checkpointed_through)), 6)


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
    fold.sources, fold.live, fold.uncommitted, fold.excluded = s.sources, s.live, s.uncommitted, s.excluded
    fold.trainer_sessions, fold.settled_through = s.trainer_sessions, s.settled_through
    fold.duplicates, fold.late_trained = s.duplicates, s.late_trained
    fold.checkpointed_through = s.checkpointed_through
    if set(s.epochs) != set(s.sources):
        raise CheckpointMismatch("not a fold checkpoint: epochs of undeclared sources")
    for name, epochs in s.epochs.items():
        fold.sources[name].epochs = [_epoch_in(fold, name, number, e) for number, e in enumerate(epochs)]
    fold.reindex()
    return fold


def _epoch_out(fold: PromptLog, name: str, number: int, e: Epoch) -> _EpochState:
    codes, in_order = None, False
    if e.codes is not None and e.settled:
        codes = bytes(e.codes)
    elif e.codes is not None:
        order = fold.order(name, number)[: e.cursor]
        codes, in_order = np.frombuffer(e.codes, dtype=np.uint8)[order].tobytes(), True
    return _EpochState(cursor=e.cursor, final=e.final, reissued=e.reissued, reissued_by=e.reissued_by,
                       prompts=e.prompts, recent=list(e.recent), reasons=e.reasons, codes=codes,
                       in_order=in_order, partial=e.partial, excluded_rollouts=e.excluded_rollouts,
                       excluded_tokens=e.excluded_tokens)


def _epoch_in(fold: PromptLog, name: str, number: int, s: _EpochState) -> Epoch:
    e = Epoch(cursor=s.cursor, prompts=s.prompts, final=s.final, reissued=s.reissued,
              reissued_by=s.reissued_by, recent=deque(s.recent), reasons=s.reasons, partial=s.partial,
              excluded_rollouts=s.excluded_rollouts, excluded_tokens=s.excluded_tokens)
    prompts = fold.sources[name].dataset.prompts
    if s.codes is not None and not s.in_order:
        if len(s.codes) != prompts:
            raise CheckpointMismatch(f"not a fold checkpoint: {len(s.codes)} codes for {prompts} prompts")
        e.codes = bytearray(s.codes)
    elif s.codes is not None:
        if not len(s.codes) == s.cursor <= prompts:
            raise CheckpointMismatch(f"not a fold checkpoint: {len(s.codes)} codes for {s.cursor} handed out")
        codes = np.zeros(prompts, dtype=np.uint8)
        codes[fold.order(name, number)[: s.cursor]] = np.frombuffer(s.codes, dtype=np.uint8)
        e.codes = bytearray(codes.data)
    return e
