"""Which input partitions the worker owns and what each still needs: the rebalance bookkeeping, pure."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Partitions"]


@dataclass
class Partitions:
    """Assigned partitions, those whose state must be restored first, and what a rebalance changes.

    kafka-python keeps the fetch position of a partition assigned again, so a partition revoked and given
    back in one rebalance keeps its windows; anything else assigned is new (and, exactly-once, restored).
    From the revocation until the next assignment a partition is not the worker's: kafka-python's join runs
    on its IO thread while the loop goes on, and another worker may own the partition already, so nothing of
    it is processed, expired or committed meanwhile. Records of it that come then are passed over, and the
    partition, if given back, is restored like a new one (its fetch position is past them).
    """

    restores: bool  # as the delivery (`Delivery.restores`): a new partition's state comes from its changelog
    assigned: set[int] = field(default_factory=set)
    to_restore: set[int] = field(default_factory=set)
    _revoked: set[int] = field(default_factory=set)
    _passed: set[int] = field(default_factory=set)  # revoked partitions whose records were passed over
    _reset_all: bool = False  # a commit on revoke failed: nothing kept can be trusted

    @property
    def active(self) -> set[int]:
        """Assigned, restored and not revoked: where records are processed, groups expire and offsets are
        committed."""
        return self.assigned - self.to_restore - self._revoked

    @property
    def leaving(self) -> set[int]:
        """Revoked and not assigned again yet."""
        return set(self._revoked)

    @property
    def ready(self) -> bool:
        return bool(self.assigned) and not self.to_restore

    def revoked(self, partitions: set[int], *, committed: bool) -> None:
        self._revoked |= partitions
        if not committed:
            self._reset_all = True

    def passed_over(self, partition: int) -> None:
        """Records of `partition` came while it was revoked and were not processed."""
        self._passed.add(partition)

    def assign(self, partitions: set[int]) -> tuple[set[int], set[int]]:
        """The new assignment; returns (partitions whose state to drop, partitions that are new)."""
        gone = (self._revoked | self.assigned) - partitions
        if self._reset_all:
            drop, new = gone | partitions, set(partitions)
            self._reset_all = False
        else:
            passed = self._passed & partitions
            drop, new = gone | passed, partitions - (self.assigned - gone - passed)
        self._revoked.clear()
        self._passed.clear()
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
