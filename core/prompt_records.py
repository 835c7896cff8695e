"""What the prompt fold keeps (core/prompts.py): each prompt's state and attempts, per epoch and source,
the seeded order of an epoch, and the counts shown per epoch (docs/loop.md)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum

from rollout_stream.codec.admission import Dataset

__all__ = ["CODES", "COUNTED", "Attempt", "AttemptEnd", "Epoch", "EpochStatus", "Exhausted", "PromptRecord",
           "PromptState", "SourceState", "attempt_history", "epoch_order"]


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


def attempt_history(attempts: list[Attempt]) -> list[dict[str, object]]:
    """A prompt's attempts as plain values (`prompts show --json`, the exhausted prompt's dead letter)."""
    return [{"attempt": a.number, "producer": a.producer, "session": a.session, "request": a.request,
             "taken_ms": a.taken_ms, "sent": a.sent, "delivered": a.delivered,
             "ended": None if a.ended is None else a.ended.value, "ended_ms": a.ended_ms,
             "trainer": a.trainer, "batch": a.batch, "error": a.error} for a in attempts]


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
    cursor: int = 0  # prompts of the order handed out for the first time
    prompts: dict[int, PromptRecord] = field(default_factory=dict)  # every prompt handed out, by row
    final: int = 0  # prompts in a final state
    reissued: int = 0  # attempts that ended without a result and were handed out again
    reissued_by: dict[str, int] = field(default_factory=dict)  # the same, by how the attempt ended
    # Once every prompt is final the records shrink to one state code per row and the reasons: a week of
    # epochs stays small in memory and in a checkpoint (the attempts' history goes; `late_trained` and
    # `duplicates` no longer see the epoch).
    settled: bytes | None = None
    reasons: dict[int, str] = field(default_factory=dict)

    def record(self, prompt: int) -> PromptRecord | None:
        if self.settled is None:
            return self.prompts.get(prompt)
        if not 0 <= prompt < len(self.settled):
            return None
        return PromptRecord(CODES[self.settled[prompt]], [], self.reasons.get(prompt))

    def states(self) -> list[tuple[int, PromptState, str | None]]:
        """(row, state, reason) of every prompt handed out."""
        if self.settled is None:
            return [(p, rec.state, rec.reason) for p, rec in self.prompts.items()]
        return [(p, CODES[code], self.reasons.get(p)) for p, code in enumerate(self.settled)]


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


def epoch_order(prompts: int, seed: int, epoch: int) -> list[int]:
    """The rows in the order epoch `epoch` hands them out: the same in every process (a str seed is hashed
    with SHA-512, independent of PYTHONHASHSEED)."""
    order = list(range(prompts))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order
