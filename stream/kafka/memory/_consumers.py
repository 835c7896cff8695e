"""Consumers on the memory cluster: an assignment with fetch positions, read below the isolation's end."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rollout_stream.kafka.errors import KafkaFailure
from rollout_stream.kafka.memory._groups import GroupMetadata
from rollout_stream.kafka.memory._log import Isolation, MemoryRecord, Partition
from rollout_stream.kafka.seam import Committed, Offsets, Polled, TopicPartition

if TYPE_CHECKING:
    from rollout_stream.kafka.memory._cluster import MemoryCluster

__all__ = ["ConsumerBase", "FetchState", "MemoryAssignedConsumer", "committed_offsets", "illegal"]

OffsetReset = Literal["earliest", "latest"]
IDLE_POLL_S = 0.001  # an empty poll naps this long at most: tests stay fast, a polling thread stays polite


def illegal(message: str) -> KafkaFailure:
    return KafkaFailure(message, kind="IllegalStateError")


def committed_offsets(offsets: Offsets) -> dict[TopicPartition, Committed]:
    return {TopicPartition(*tp): pos if isinstance(pos, Committed) else Committed(pos)
            for tp, pos in offsets.items()}


@dataclass(slots=True)
class FetchState:
    position: int | None = None  # None: resolve at the next fetch or position() (Kafka resets lazily)
    reset: Literal["committed", "earliest", "latest"] = "committed"
    paused: bool = False
    highwater: int | None = None  # as of the last fetch
    fetchable: bool = True  # False while an eager rebalance has revoked it and not assigned it again


class ConsumerBase:
    """What group and assigned consumers share (the seam's _Consuming but poll and close)."""

    def __init__(self, cluster: MemoryCluster, *, client_id: str, group_id: str | None, isolation: str,
                 auto_offset_reset: str, max_poll_records: int) -> None:
        if isolation not in ("read_committed", "read_uncommitted"):
            raise ValueError(f"isolation must be read_committed or read_uncommitted, not {isolation!r}")
        if auto_offset_reset not in ("earliest", "latest"):
            raise ValueError(f"auto_offset_reset must be earliest or latest, not {auto_offset_reset!r}")
        self._cluster, self._client_id, self._group_id = cluster, client_id, group_id
        self._isolation: Isolation = isolation  # type: ignore[assignment]  # checked above
        self._auto_reset: OffsetReset = auto_offset_reset  # type: ignore[assignment]  # checked above
        self._max_poll_records = max_poll_records
        self._assignment: dict[TopicPartition, FetchState] = {}
        self._rotation = 0  # first partition of the next fetch, so that one busy partition starves no other
        self._closed = False

    # ---- fetching ----
    def _fetch(self, max_records: int | None) -> Polled:
        with self._cluster.lock:
            self._check_open()
            budget = self._max_poll_records if max_records is None else max_records
            if budget <= 0:
                raise ValueError(f"max_records must be positive, not {max_records}")
            tps = [tp for tp, s in self._assignment.items() if s.fetchable and not s.paused]
            if tps:
                self._rotation = (self._rotation + 1) % len(tps)
                tps = tps[self._rotation:] + tps[:self._rotation]
            out: dict[TopicPartition, list[MemoryRecord]] = {}
            for tp in tps:
                if budget <= 0:
                    break
                records = self._read(tp, self._assignment[tp], budget)
                if records:
                    out[tp] = records
                    budget -= len(records)
            return out

    def _read(self, tp: TopicPartition, state: FetchState, budget: int) -> list[MemoryRecord]:
        part = self._cluster._log.partition(tp)
        pos = self._resolve(tp, state)
        if not 0 <= pos <= part.end():  # out of range: reset, as auto.offset.reset says
            pos = self._reset_offset(part, self._auto_reset)
        limit, entries, iso = part.end(self._isolation), part.entries, self._isolation
        taken: list[MemoryRecord] = []
        while pos < limit and len(taken) < budget:
            entry = entries[pos]
            pos += 1
            if entry.record is not None and entry.visible(iso):
                taken.append(entry.record)
        while pos < limit and not entries[pos].visible(iso):
            pos += 1  # past markers and aborted records, as a fetch that ends in them leaves the position
        state.position, state.highwater = pos, limit
        return taken

    def _resolve(self, tp: TopicPartition, state: FetchState) -> int:
        if state.position is None:
            part = self._cluster._log.partition(tp)
            committed = self._commits().get(tp) if state.reset == "committed" else None
            if committed is not None:
                state.position = committed.offset
            else:
                reset = self._auto_reset if state.reset == "committed" else state.reset
                state.position = self._reset_offset(part, reset)
        return state.position

    def _reset_offset(self, part: Partition, reset: OffsetReset) -> int:
        return 0 if reset == "earliest" else part.end(self._isolation)

    def _commits(self) -> dict[TopicPartition, Committed]:
        return self._cluster._groups.group(self._group_id).committed if self._group_id else {}

    def _state(self, tp: TopicPartition) -> FetchState:
        state = self._assignment.get(TopicPartition(*tp))
        if state is None:
            raise illegal(f"{tp[0]}:{tp[1]} is not assigned to this consumer")
        return state

    def _check_open(self) -> None:
        if self._closed:
            raise illegal("the consumer is closed")

    def _idle(self, timeout_s: float) -> None:
        time.sleep(max(0.0, min(timeout_s, IDLE_POLL_S)))

    # ---- the seam ----
    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        with self._cluster.lock:
            for tp in partitions:
                self._state(tp).paused = True

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        with self._cluster.lock:
            for tp in partitions:
                self._state(tp).paused = False

    def seek(self, tp: TopicPartition, offset: int) -> None:
        with self._cluster.lock:
            self._state(tp).position = offset

    def position(self, tp: TopicPartition) -> int:
        with self._cluster.lock:
            return self._resolve(TopicPartition(*tp), self._state(tp))

    def fetch_position(self, tp: TopicPartition) -> int:
        with self._cluster.lock:
            state = self._assignment.get(TopicPartition(*tp))
            return -1 if state is None or state.position is None else state.position

    def highwater(self, tp: TopicPartition) -> int | None:
        with self._cluster.lock:
            state = self._assignment.get(TopicPartition(*tp))
            return None if state is None else state.highwater

    def backlog(self) -> int:
        with self._cluster.lock:
            return sum(max(0, s.highwater - s.position) for s in self._assignment.values()
                       if not s.paused and s.position is not None and s.highwater is not None)

    def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        with self._cluster.lock:
            for tp in tps:
                self._cluster._log.partition(TopicPartition(*tp))
            return {TopicPartition(*tp): 0 for tp in tps}  # nothing is ever deleted from a log here

    def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """High watermarks; for read_committed last stable offsets (Kafka's ListOffsets by isolation)."""
        with self._cluster.lock:
            parts = {TopicPartition(*tp): self._cluster._log.partition(TopicPartition(*tp)) for tp in tps}
            return {tp: part.end(self._isolation) for tp, part in parts.items()}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        """The first offset below the isolation's end whose record's timestamp is at least the one given."""
        with self._cluster.lock:
            out: dict[TopicPartition, int | None] = {}
            for tp, at in timestamps.items():
                part = self._cluster._log.partition(TopicPartition(*tp))
                below = part.entries[:part.end(self._isolation)]
                out[TopicPartition(*tp)] = next((e.record.offset for e in below
                                                 if e.record is not None and e.record.timestamp >= at), None)
            return out

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        with self._cluster.lock:
            return set(range(self._cluster._log.count(topic))) or None

    def committed(self, tp: TopicPartition) -> Committed | None:
        with self._cluster.lock:
            return self._commits().get(TopicPartition(*tp))

    def commit(self, offsets: Offsets) -> None:
        with self._cluster.lock:
            self._check_open()
            meta = self.group_metadata()
            if not meta.group_id:
                raise illegal("commit needs a group: this consumer has none")
            self._cluster._groups.commit(meta, committed_offsets(offsets))

    def group_metadata(self) -> GroupMetadata:
        return GroupMetadata(self._group_id or "")


class MemoryAssignedConsumer(ConsumerBase):
    """Partitions assigned by hand (the seam's AssignedConsumer). It reads and writes `commit_group`'s offsets
    without joining it, so its commits are refused while that group has live members, as the broker does."""

    def assign(self, tps: Sequence[TopicPartition]) -> None:
        with self._cluster.lock:
            self._check_open()
            keep = self._assignment  # partitions assigned again keep their position, as in Kafka
            wanted = [TopicPartition(*tp) for tp in tps]
            self._assignment = {tp: keep.get(tp) or FetchState() for tp in wanted}
            for state in self._assignment.values():
                state.paused = False

    def assign_at(self, tp: TopicPartition, offset: int) -> None:
        self.assign_from({tp: offset})

    def assign_from(self, positions: Mapping[TopicPartition, int]) -> None:
        self.assign(list(positions))
        for tp, offset in positions.items():
            self.seek(tp, offset)

    def seek_to_beginning(self, tps: Sequence[TopicPartition]) -> None:
        self._seek_lazily(tps, "earliest")

    def seek_to_end(self, tps: Sequence[TopicPartition]) -> None:
        self._seek_lazily(tps, "latest")

    def _seek_lazily(self, tps: Sequence[TopicPartition], reset: OffsetReset) -> None:
        # Resolved at the next fetch or position(), as Kafka does: records sent before then count.
        with self._cluster.lock:
            for tp in tps:
                state = self._state(tp)
                state.position, state.reset = None, reset

    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        """Records of the assigned partitions; raises UnknownTopic for a partition that does not exist."""
        polled = self._fetch(max_records)
        if not polled:
            self._idle(timeout_s)
        return polled

    def close(self) -> None:
        with self._cluster.lock:
            self._closed = True
            self._assignment.clear()
