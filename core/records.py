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
    """A valid sample held in a window: its record, the fields `normalize_group` reads of it, and its rollout.

    Everything else stays in the record's bytes, which outputs embed verbatim; a full decoded `Sample`
    (arrays, prompt, metadata, ~2 KB of Python objects for a 256-token sample) would double a window's
    memory. The read fields live on the member itself: one object per held sample, not two.
    """

    record: InputRecord
    reward: float | dict[str, float] | None
    rollout_id: int | str | None
    index: int | None  # kept only without a rollout_id, the only case it matters (docs/spec.md §2.4)
    sibling_index: int
    rollout: object

    @property
    def sample(self) -> Any:
        """What normalization reads, with `codec.Sample`'s names (`reward`, `rollout_id`, `index`,
        `sibling_index`): the member itself."""
        return self


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
