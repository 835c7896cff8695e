"""Commit positions for at-least-once delivery: an offset is committable only when all below it are
resolved."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["PartitionOffsets", "OffsetLedger"]


class PartitionOffsets:
    """Offsets of one partition that were consumed but are not yet published or dead-lettered."""

    def __init__(self) -> None:
        self._pending: set[int] = set()
        # Held offsets in ascending order from `_head` on (those before it are resolved): a consumer hands
        # them out ascending, so holding appends and finding the lowest unresolved one moves `_head`, where a
        # heap cost a push and pops of log n each, for every record (docs/benchmarks.md).
        self._held: list[int] = []
        self._head = 0
        self.next_offset: int | None = None  # one past the highest offset consumed

    def hold(self, offset: int) -> None:
        self._pending.add(offset)
        after = offset + 1
        if self.next_offset is None or after > self.next_offset:
            self._held.append(offset)
            self.next_offset = after
        else:  # read again from an earlier offset: keep the order (rare, so a sort is fine)
            self._held = sorted(self._held[self._head:] + [offset])
            self._head = 0

    def resolve(self, offset: int) -> None:
        self._pending.discard(offset)

    def committable(self) -> int | None:
        """The position to commit: the lowest unresolved offset, or one past everything consumed."""
        held, head, pending = self._held, self._head, self._pending
        while head < len(held) and held[head] not in pending:
            head += 1
        if head > 4096 and head * 2 > len(held):  # drop the resolved prefix now and then
            del held[:head]
            head = 0
        self._head = head
        if head < len(held):
            return held[head]
        return self.next_offset

    @property
    def pending_count(self) -> int:
        return len(self._pending)


class OffsetLedger:
    """PartitionOffsets for every assigned partition, plus what was last committed."""

    def __init__(self) -> None:
        self.partitions: dict[int, PartitionOffsets] = {}
        self.committed: dict[int, int] = {}

    def hold(self, partition: int, offset: int) -> None:
        tracker = self.partitions.get(partition)
        if tracker is None:  # not setdefault: that would build a PartitionOffsets for every record
            tracker = self.partitions[partition] = PartitionOffsets()
        tracker.hold(offset)

    def resolve(self, partition: int, offsets: Iterable[int]) -> None:
        tracker = self.partitions.get(partition)
        if tracker is not None:
            for offset in offsets:
                tracker.resolve(offset)

    def due(self) -> dict[int, int]:
        """Positions that moved forward since the last commit (never backwards)."""
        out: dict[int, int] = {}
        for partition, tracker in self.partitions.items():
            position = tracker.committable()
            if position is not None and position > self.committed.get(partition, -1):
                out[partition] = position
        return out

    def mark_committed(self, positions: dict[int, int]) -> None:
        self.committed.update(positions)

    def next_offset(self, partition: int) -> int | None:
        """The offset after the last record held in `partition` since it was assigned (None: none yet)."""
        tracker = self.partitions.get(partition)
        return tracker.next_offset if tracker is not None else None

    def forget(self, partition: int) -> None:
        self.partitions.pop(partition, None)
        self.committed.pop(partition, None)
