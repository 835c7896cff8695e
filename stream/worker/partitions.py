"""Which input partitions the worker owns and what each still needs: the rebalance bookkeeping, pure."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Partitions"]


@dataclass
class Partitions:
    """Assigned partitions, those whose state must be restored first, and what a rebalance changes.

    kafka-python keeps the fetch position of a partition assigned again, so a partition revoked and given
    back in one rebalance keeps its windows; anything else assigned is new (and, exactly-once, restored).
    """

    restores: bool  # as the delivery (`Delivery.restores`): a new partition's state comes from its changelog
    assigned: set[int] = field(default_factory=set)
    to_restore: set[int] = field(default_factory=set)
    _revoked: set[int] = field(default_factory=set)
    _reset_all: bool = False  # a commit on revoke failed: nothing kept can be trusted

    @property
    def active(self) -> set[int]:
        """Assigned and restored: where records are processed and offsets committed."""
        return self.assigned - self.to_restore

    @property
    def ready(self) -> bool:
        return bool(self.assigned) and not self.to_restore

    def revoked(self, partitions: set[int], *, committed: bool) -> None:
        self._revoked |= partitions
        if not committed:
            self._reset_all = True

    def assign(self, partitions: set[int]) -> tuple[set[int], set[int]]:
        """The new assignment; returns (partitions whose state to drop, partitions that are new)."""
        gone = (self._revoked | self.assigned) - partitions
        if self._reset_all:
            drop, new = gone | partitions, set(partitions)
            self._reset_all = False
        else:
            drop, new = gone, partitions - (self.assigned - gone)
        self._revoked.clear()
        self.assigned = set(partitions)
        self.to_restore -= drop
        if self.restores:
            self.to_restore |= new
        return drop, new

    def lose(self, partitions: set[int]) -> None:
        self.assigned -= partitions
        self.to_restore -= partitions

    def restore_all(self) -> None:
        """After an aborted transaction: every assigned partition restarts from its last commit."""
        if self.restores:
            self.to_restore |= self.assigned

    def restored(self, partition: int) -> None:
        self.to_restore.discard(partition)
