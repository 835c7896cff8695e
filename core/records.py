"""Where an input record came from, and what became of it: the values the window logic passes around."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from codec import DeadLetterReason
from core.rewards import GroupRewards

__all__ = ["InputRecord", "Member", "Published", "DeadLettered", "DuplicateDropped", "Outcome"]


class InputRecord(msgspec.Struct, frozen=True, gc=False):
    """One consumed Kafka record, bytes untouched.

    A struct without GC tracking: one is built per consumed record and windows hold many of them.
    """

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def size(self) -> int:
        return len(self.value or b"") + len(self.key or b"")


class Member(msgspec.Struct, frozen=True, gc=False):
    """A valid sample held in a window: its record and what normalization reads of it (`sample` has
    `reward`, `rollout_id`, `index`, `sibling_index`, like `codec.Sample`)."""

    record: InputRecord
    sample: Any
    rollout: Any  # not `object`: msgspec cannot resolve that name in a mypyc-compiled module


@dataclass(frozen=True, slots=True)
class Published:
    """A complete, consistent group: every member in publication order with its rewards."""

    group_key: str
    partition: int
    members: tuple[Member, ...]
    rewards: GroupRewards

    @property
    def records(self) -> tuple[InputRecord, ...]:
        return tuple(m.record for m in self.members)


@dataclass(frozen=True, slots=True)
class DeadLettered:
    """Records refused for one reason (a whole group, or a single record)."""

    reason: DeadLetterReason
    message: str
    group_key: str | None
    records: tuple[InputRecord, ...]
    first_failed_at_ms: int = 0
    # A later member of a group already dead-lettered for this reason: one more record of that group, not
    # another rejected group (metrics count the group once; the log says it at debug level).
    straggler: bool = False


@dataclass(frozen=True, slots=True)
class DuplicateDropped:
    """An exact copy of a record already held or already resolved."""

    group_key: str
    record: InputRecord

    @property
    def records(self) -> tuple[InputRecord, ...]:
        return (self.record,)


Outcome = Published | DeadLettered | DuplicateDropped
