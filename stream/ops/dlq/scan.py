"""Stream through the dead-letter topic between offsets fixed at start, never holding more than one poll."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rollout_stream.errors import RuntimeFailure
from rollout_stream.kafka import AssignedConsumer, TopicPartition
from rollout_stream.ops.dlq.record import DeadLetterRecord, parse_record

__all__ = ["TopicMissing", "ScanStalled", "PartitionRange", "ScanPlan", "DeadLetterScanner"]

# Below this many records a scan is quick and a progress bar only flickers.
PROGRESS_THRESHOLD = 10_000


class TopicMissing(RuntimeFailure, LookupError):
    """The dead-letter topic does not exist (or this client may not see it)."""


class ScanStalled(RuntimeFailure, RuntimeError):
    """A partition stopped advancing below the end offset captured at start."""


@dataclass(frozen=True, slots=True)
class PartitionRange:
    partition: int
    low: int  # first offset still in the log when the scan started
    start: int  # where this scan starts reading (low, a replay cursor, or the --since time)
    end: int  # last stable offset seen at start: the scan stops here, whatever arrives meanwhile

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True, slots=True)
class ScanPlan:
    topic: str
    ranges: tuple[PartitionRange, ...]

    @property
    def total(self) -> int:
        return sum(r.size for r in self.ranges)

    def range_of(self, partition: int) -> PartitionRange:
        for r in self.ranges:
            if r.partition == partition:
                return r
        raise KeyError(partition)


@dataclass
class DeadLetterScanner:
    """Reads a topic partition by partition, in offset order, from `start` to the `end` captured at plan time.

    consumer: an assigned consumer of the Kafka seam (read_committed; `rollout_stream.kafka.client_for`).
    progress: True/False, or None for "when stderr is a terminal and the scan is long".
    """

    consumer: AssignedConsumer
    topic: str
    progress: bool | None = None
    console: Console = field(default_factory=lambda: Console(stderr=True))
    stall_timeout_s: float = 30.0
    scanned: int = 0
    positions: dict[int, int] = field(default_factory=dict)  # next offset per partition, once read

    def partitions(self, wait_s: float = 5.0) -> list[int]:
        deadline = time.monotonic() + wait_s
        while True:
            parts = self.consumer.partitions_for_topic(self.topic)
            if parts:
                return sorted(parts)
            if time.monotonic() >= deadline:
                raise TopicMissing(f"topic {self.topic!r} does not exist (or is not visible to this client)")
            time.sleep(0.25)

    def plan(
        self,
        *,
        partitions: list[int] | None = None,
        starts: Mapping[int, int] | None = None,
        stops: Mapping[int, int] | None = None,
        since_ms: int | None = None,
    ) -> ScanPlan:
        """Capture where each partition begins and ends now; start at `starts` or at the `since_ms` timestamp,
        stop at the end offset (or before `stops`, when given)."""
        parts = partitions if partitions is not None else self.partitions()
        tps = [TopicPartition(self.topic, p) for p in parts]
        lows = self.consumer.beginning_offsets(tps)
        ends = self.consumer.end_offsets(tps)
        by_time: dict[TopicPartition, int | None] = {}
        if since_ms is not None:
            # The first offset with a timestamp >= since: every record before it is older (time index).
            by_time = self.consumer.offsets_for_times({tp: max(0, since_ms) for tp in tps})
        ranges = []
        for tp in tps:
            low, end = lows[tp], ends[tp]
            if stops and tp.partition in stops:
                end = max(low, min(end, stops[tp.partition]))
            start = max(low, (starts or {}).get(tp.partition, low))
            if since_ms is not None:
                found = by_time.get(tp)
                start = max(start, found if found is not None else end)
            ranges.append(PartitionRange(tp.partition, low, min(start, end), end))
        return ScanPlan(self.topic, tuple(ranges))

    def records(self, plan: ScanPlan) -> Iterator[DeadLetterRecord]:
        """Every record of the plan, partition by partition. `positions` says how far each partition got."""
        show = (
            self.progress
            if self.progress is not None
            else (self.console.is_terminal and plan.total >= PROGRESS_THRESHOLD)
        )
        bar = Progress(
            TextColumn("[dim]scanning {task.fields[topic]}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
            disable=not show,
        )
        with bar:
            task = bar.add_task("scan", total=plan.total, topic=plan.topic)
            for r in plan.ranges:
                self.positions[r.partition] = r.start
                if r.size:
                    yield from self._partition(r, lambda n: bar.advance(task, n))
                self.positions[r.partition] = max(self.positions[r.partition], r.end)

    def _partition(self, r: PartitionRange, advance: Any) -> Iterator[DeadLetterRecord]:
        tp = TopicPartition(self.topic, r.partition)
        self.consumer.assign([tp])
        self.consumer.seek(tp, r.start)
        pos = r.start
        last_move = time.monotonic()
        while pos < r.end:
            batch = self.consumer.poll(0.5, 500).get(tp, [])
            for rec in batch:
                if rec.offset >= r.end:
                    break
                self.scanned += 1
                self.positions[r.partition] = rec.offset + 1
                yield parse_record(rec)
            # Not last record + 1: under read_committed, transaction markers and aborted records are skipped.
            new_pos = max(self.consumer.position(tp), self.positions[r.partition])
            if new_pos > pos:
                advance(min(new_pos, r.end) - pos)
                pos, last_move = new_pos, time.monotonic()
            elif time.monotonic() - last_move > self.stall_timeout_s:
                raise ScanStalled(
                    f"{self.topic}:{r.partition} has not advanced past offset {pos} for "
                    f"{self.stall_timeout_s:g}s (end offset at start: {r.end})"
                )
