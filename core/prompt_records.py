"""What the prompt fold keeps (core/prompts.py): each prompt's state and attempts, per epoch and source,
the seeded order of an epoch, and the counts shown per epoch (docs/loop.md)."""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from rollout_stream.codec.admission import Dataset

__all__ = ["CODES", "COUNTED", "KEEP_SETTLED", "Attempt", "AttemptEnd", "Epoch", "EpochStatus", "Exhausted",
           "PromptRecord", "PromptState", "SourceState", "attempt_history", "epoch_order",
           "epoch_permutation"]

# Settled prompts of an open epoch whose attempts are kept (`prompts show`); older ones keep their outcome.
KEEP_SETTLED = 10_000


class PromptState(Enum):
    WAITING = "waiting"
    IN_FLIGHT = "in_flight"
    TRAINED = "trained"
    DEAD_LETTERED = "dead_lettered"
    FILTERED = "filtered"
    EXHAUSTED = "exhausted"

    @property
    def final(self) -> bool:
        return self not in (PromptState.WAITING, PromptState.IN_FLIGHT)


class AttemptEnd(Enum):
    LEASE = "lease"  # its producer's lease ended before the group was whole at the stage
    INCOMPLETE = "incomplete"  # the stage timed its group out
    SKIPPED = "skipped"  # a committed trainer batch skipped it (stale, invalid)
    UNCONSUMED = "unconsumed"  # sent, and neither consumed nor resolved for the sent expiry
    RELEASED = "released"  # admitted and given back before anything was sent: not counted
    FAILED = "failed"  # the rollout process raised while it held the attempt (`Attempt.error` says what)
    TRAINED = "trained"
    DEAD_LETTERED = "dead_lettered"
    FILTERED = "filtered"
    SUPERSEDED = "superseded"  # another attempt of its prompt settled it


COUNTED = frozenset({AttemptEnd.LEASE, AttemptEnd.INCOMPLETE, AttemptEnd.SKIPPED, AttemptEnd.UNCONSUMED,
                     AttemptEnd.FAILED})


@dataclass(slots=True)
class Attempt:
    number: int  # 1 for the first: part of the group key
    request: int  # the admitting request's offset
    producer: str
    session: str
    taken_ms: int
    sent: bool = False
    delivered: bool = False
    ended: AttemptEnd | None = None
    ended_ms: int | None = None
    trainer: str | None = None  # the trainer and batch that trained it
    batch: int | None = None
    error: str | None = None  # `Type: message` of what the rollout process raised while it held it
    # its group's fate came after the attempt had ended (resolved or skipped): it can no longer train
    group_ended: bool = False
    # what staleness by rollout or token left out of its group when it trained (rollouts, loss tokens)
    excluded_rollouts: int = 0
    excluded_tokens: int = 0


def attempt_history(attempts: list[Attempt]) -> list[dict[str, object]]:
    """A prompt's attempts as plain values (`prompts show --json`, the exhausted prompt's dead letter)."""
    return [{"attempt": a.number, "producer": a.producer, "session": a.session, "request": a.request,
             "taken_ms": a.taken_ms, "sent": a.sent, "delivered": a.delivered,
             "ended": None if a.ended is None else a.ended.value, "ended_ms": a.ended_ms,
             "trainer": a.trainer, "batch": a.batch, "error": a.error,
             "excluded_rollouts": a.excluded_rollouts, "excluded_tokens": a.excluded_tokens}
            for a in attempts]


@dataclass(slots=True)
class PromptRecord:
    state: PromptState
    attempts: list[Attempt] = field(default_factory=list)
    reason: str | None = None  # a dead-letter reason, or `prompt_attempts_exhausted`


CODES = list(PromptState)


@dataclass(slots=True)
class Exhausted:
    """A prompt exhausted whose dead-letter record is not in the log yet: what the record says (its
    attempts are kept here, since a settled epoch forgets them)."""

    epoch: int
    prompt: int
    attempts: list[Attempt]
    offset: int  # the record at which the fold decided it
    decided_ms: int


@dataclass(slots=True)
class Epoch:
    """One epoch of a source: where its order is, and every prompt it handed out.

    A prompt's record (its attempts) is kept while it waits or is in flight, once final for the newest
    `KEEP_SETTLED` settled (`recent`, oldest first), and exhausted; an older final prompt shrinks to its
    state code in `codes` (by row, 0: not shrunk) and its reason in `reasons`. Once every prompt of the epoch
    is final every record shrinks. A dataset of millions of prompts so costs a byte a prompt in memory, and
    far less in a checkpoint (rollout_stream.core.checkpoint); a shrunk prompt's attempts are gone, and with
    them a second training of it counted in `duplicates`."""

    cursor: int = 0  # prompts of the order handed out for the first time
    prompts: dict[int, PromptRecord] = field(default_factory=dict)  # the records kept, by row
    final: int = 0  # prompts in a final state
    reissued: int = 0  # attempts that ended without a result and were handed out again
    reissued_by: dict[str, int] = field(default_factory=dict)  # the same, by how the attempt ended
    recent: deque[int] = field(default_factory=deque)
    codes: bytearray | None = None
    reasons: dict[int, str] = field(default_factory=dict)
    # prompts trained with part of their group left out (staleness by rollout or token); the rollouts and
    # loss tokens left out
    partial: int = 0
    excluded_rollouts: int = 0
    excluded_tokens: int = 0

    @property
    def settled(self) -> bool:
        """Every prompt of the epoch is final (and shrunk)."""
        return self.codes is not None and not self.prompts and self.final == len(self.codes)

    def record(self, prompt: int) -> PromptRecord | None:
        """A prompt's record (a shrunk one's has no attempts); None: not handed out."""
        rec = self.prompts.get(prompt)
        codes = self.codes
        if rec is not None or codes is None or not 0 <= prompt < len(codes) or not codes[prompt]:
            return rec
        return PromptRecord(CODES[codes[prompt]], [], self.reasons.get(prompt))

    def finalized(self, prompt: int, prompts: int) -> None:
        """`prompt` (kept in `prompts`) has just become final; `prompts`: the dataset's size."""
        self.final += 1
        if self.final == prompts and self.cursor == prompts:
            for row in list(self.prompts):
                self._shrink(row, prompts)
            self.recent.clear()
            return
        self.recent.append(prompt)
        while len(self.recent) > KEEP_SETTLED:
            row = self.recent.popleft()
            if self.prompts[row].state is not PromptState.EXHAUSTED:  # its lapsed attempt may still train
                self._shrink(row, prompts)

    def _shrink(self, prompt: int, prompts: int) -> None:
        rec = self.prompts.pop(prompt)
        if self.codes is None:
            self.codes = bytearray(prompts)
        self.codes[prompt] = CODES.index(rec.state)
        if rec.reason is not None:
            self.reasons[prompt] = rec.reason

    def _shrunk(self) -> np.ndarray:
        return np.frombuffer(self.codes or b"", dtype=np.uint8)

    def states(self) -> list[tuple[int, PromptState, str | None]]:
        """(row, state, reason) of every prompt handed out."""
        out = [(p, rec.state, rec.reason) for p, rec in self.prompts.items()]
        codes = self._shrunk()
        return out + [(p, CODES[codes[p]], self.reasons.get(p)) for p in np.flatnonzero(codes).tolist()]

    def rows(self, state: PromptState) -> list[int]:
        """The rows of the prompts in `state`."""
        shrunk = np.flatnonzero(self._shrunk() == CODES.index(state)).tolist()
        return [p for p, rec in self.prompts.items() if rec.state is state] + shrunk

    def tally(self) -> tuple[dict[PromptState, int], dict[str, int]]:
        """How many prompts handed out are in each state, and the dead-lettered ones by reason."""
        counts = dict.fromkeys(PromptState, 0)
        dead: dict[str, int] = {}
        for rec in self.prompts.values():
            counts[rec.state] += 1
            if rec.state is PromptState.DEAD_LETTERED:
                dead[rec.reason or "?"] = dead.get(rec.reason or "?", 0) + 1
        if self.codes is not None:
            codes = self._shrunk()
            shrunk = np.bincount(codes, minlength=len(CODES)).tolist()
            for state, n in zip(CODES[1:], shrunk[1:], strict=True):
                counts[state] += n
            dead_code, named = CODES.index(PromptState.DEAD_LETTERED), 0
            for p, reason in self.reasons.items():
                if codes[p] == dead_code:
                    dead[reason] = dead.get(reason, 0) + 1
                    named += 1
            unnamed = int(np.count_nonzero(codes == dead_code)) - named
            if unnamed:
                dead["?"] = dead.get("?", 0) + unnamed
        return counts, dead


@dataclass(slots=True)
class SourceState:
    dataset: Dataset
    epochs: list[Epoch] = field(default_factory=list)
    retry: list[list[int]] = field(default_factory=list)  # [epoch, prompt] to hand out again, oldest first
    reissued: int = 0
    refused: int = 0  # later declarations that differed from the first
    # Refills: prompts filtered (zero-variance) whose place another prompt took. Each counts toward the next
    # committed trainer batch that trains a group of this source, in log order: the batch it was refilled
    # into. `batch_refills`: how many batches saw n refills (n -> batches), over every epoch.
    refills: int = 0
    refills_pending: int = 0  # since the last such batch
    batch_refills: dict[int, int] = field(default_factory=dict)
    # Exhausted prompts whose `prompt_attempts_exhausted` dead-letter record is not written yet, oldest first
    # (a prompt source writes it with a marker in this log: rollout_stream.prompts.exhausted).
    unrecorded: list[Exhausted] = field(default_factory=list)
    recorded: int = 0  # markers folded: dead-letter records written
    # [epoch, prompt, due ms]: attempts spent, but a lapsed attempt's sent group may still train; exhausted
    # once none can, or at the due time (the sent expiry), oldest first
    deferred: list[list[int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class EpochStatus:
    epoch: int
    prompts: int
    waiting: int
    in_flight: int
    trained: int
    dead_lettered: dict[str, int]
    filtered: int
    exhausted: int
    reissued: int  # attempts that ended without a result and were handed out again
    reissued_by: dict[str, int] = field(default_factory=dict)  # by how they ended (`AttemptEnd` values)
    # trained with part of the group left out (staleness by rollout or token): prompts, rollouts, loss tokens
    partial: int = 0
    excluded_rollouts: int = 0
    excluded_tokens: int = 0


def epoch_permutation(prompts: int, seed: int, epoch: int) -> np.ndarray:
    """The rows in the order epoch `epoch` hands them out: the same in every process and every numpy version
    (the legacy `RandomState` stream is frozen), seeded by SHA-512 of `"{seed}:{epoch}"`. About 0.6 s for
    10,000,000 rows."""
    words = np.frombuffer(hashlib.sha512(f"{seed}:{epoch}".encode()).digest(), dtype="<u4")
    order = np.random.RandomState(words).permutation(prompts)
    return order.astype(np.int32) if prompts < 2**31 else order


def epoch_order(prompts: int, seed: int, epoch: int) -> list[int]:
    """`epoch_permutation` as a list."""
    return list(epoch_permutation(prompts, seed, epoch).tolist())
