"""Where an input record came from, and what became of it: the values the window logic passes around."""

from __future__ import annotations

from dataclasses import dataclass

from rollout_stream.codec import DeadLetterReason
from rollout_stream.core.rewards import GroupRewards
from rollout_stream.core.structs import InputRecord, Member

__all__ = ["InputRecord", "Member", "Published", "DeadLettered", "DuplicateDropped", "Outcome"]


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
