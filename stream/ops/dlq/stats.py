"""Aggregates of a dead-letter scan in bounded memory: by reason, top groups, time span, partition ranges."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

from rollout_stream.ops.dlq.record import DeadLetterRecord, iso_ms
from rollout_stream.ops.dlq.scan import ScanPlan
from rollout_stream.ops.dlq.values import DeadLetterValue

__all__ = ["TopGroups", "DeadLetterStats"]


@dataclass(slots=True)
class _GroupTally:
    records: int = 0
    reasons: set[str] = field(default_factory=set)
    first_failed_at_ms: int = 0


@dataclass
class TopGroups:
    """Records per group key, exact up to `capacity` distinct groups and approximate (lower bounds) beyond.

    When the table outgrows twice its capacity it keeps the `capacity` largest groups; `error` is the
    largest count ever dropped, so a reported count is at most `error` below the true one.
    """

    capacity: int = 10_000
    tallies: dict[str, _GroupTally] = field(default_factory=dict)
    error: int = 0
    pruned: bool = False

    def add(self, group: str, reason: str, failed_at_ms: int) -> None:
        tally = self.tallies.get(group)
        if tally is None:
            tally = self.tallies[group] = _GroupTally(first_failed_at_ms=failed_at_ms)
            if len(self.tallies) > 2 * self.capacity:
                self._prune()
        tally.records += 1
        tally.reasons.add(reason)
        tally.first_failed_at_ms = min(tally.first_failed_at_ms, failed_at_ms)

    def _prune(self) -> None:
        ranked = sorted(self.tallies.items(), key=lambda kv: kv[1].records, reverse=True)
        self.error = max([self.error, *(t.records for _, t in ranked[self.capacity :])])
        self.tallies = dict(ranked[: self.capacity])
        self.pruned = True

    def top(self, n: int) -> list[tuple[str, _GroupTally]]:
        return sorted(self.tallies.items(), key=lambda kv: (-kv[1].records, kv[0]))[:n]


@dataclass
class _PartitionTally:
    matched: int = 0
    first_offset: int | None = None
    last_offset: int | None = None


@dataclass
class DeadLetterStats:
    """Feed it the values that passed the filters; `to_dict` is the `dlq stats --json` document.

    By reason, by original topic and top groups count values (a chunked value once); the totals and the
    partitions count records."""

    top_capacity: int = 10_000
    matched: int = 0  # records
    values: int = 0  # a plain record is one value; the chunk records of a chunked value are one
    chunked_values: int = 0
    chunk_records: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    by_original_topic: Counter[str] = field(default_factory=Counter)
    replayed_before: int = 0  # records that already carry x-replay-count (failed again after a replay)
    oldest: DeadLetterRecord | None = None
    newest: DeadLetterRecord | None = None
    partitions: dict[int, _PartitionTally] = field(default_factory=dict)
    groups: TopGroups = field(init=False)

    def __post_init__(self) -> None:
        self.groups = TopGroups(self.top_capacity)

    def add(self, record: DeadLetterRecord) -> None:
        self.add_value(DeadLetterValue([record]))

    def add_value(self, value: DeadLetterValue) -> None:
        """One value: reasons, groups and topics count it once; records and partitions count its records."""
        record = value.first
        self.values += 1
        if value.chunk is not None:
            self.chunked_values += 1
            self.chunk_records += len(value.records)
        self.by_reason[record.reason] += 1
        self.by_original_topic[record.original_topic or "(unknown)"] += 1
        if record.replay_count:
            self.replayed_before += 1
        group = record.group
        if group is not None:
            self.groups.add(group, record.reason, record.failed_at_ms)
        for r in value.records:
            self._add_record(r)

    def _add_record(self, record: DeadLetterRecord) -> None:
        self.matched += 1
        # Only the coordinates and headers are kept for these two, never the record's bytes.
        if self.oldest is None or record.timestamp_ms < self.oldest.timestamp_ms:
            self.oldest = _light(record)
        if self.newest is None or record.timestamp_ms >= self.newest.timestamp_ms:
            self.newest = _light(record)
        p = self.partitions.setdefault(record.partition, _PartitionTally())
        p.matched += 1
        if p.first_offset is None:
            p.first_offset = record.offset
        p.last_offset = record.offset

    def to_dict(self, plan: ScanPlan, *, scanned: int, top: int) -> dict[str, Any]:
        def point(r: DeadLetterRecord | None) -> dict[str, Any] | None:
            if r is None:
                return None
            return {
                "dead_lettered_at": iso_ms(r.timestamp_ms),
                "partition": r.partition,
                "offset": r.offset,
                "reason": r.reason,
                "group_key": r.group,
            }

        return {
            "topic": plan.topic,
            "scanned": scanned,
            "matched": self.matched,
            "values": self.values,
            "chunked_values": self.chunked_values,
            "chunk_records": self.chunk_records,
            "by_reason": dict(self.by_reason.most_common()),
            "by_original_topic": dict(self.by_original_topic.most_common()),
            "replayed_before": self.replayed_before,
            "oldest": point(self.oldest),
            "newest": point(self.newest),
            "top_groups": [
                {
                    "group_key": g,
                    "records": t.records,
                    "reasons": sorted(t.reasons),
                    "first_failed_at": iso_ms(t.first_failed_at_ms),
                }
                for g, t in self.groups.top(top)
            ],
            "top_groups_exact": not self.groups.pruned,
            "top_groups_max_undercount": self.groups.error,
            "distinct_groups": None if self.groups.pruned else len(self.groups.tallies),
            "partitions": [
                {
                    "partition": r.partition,
                    "low": r.low,
                    "end": r.end,
                    "scanned_from": r.start,
                    "matched": self.partitions.get(r.partition, _PartitionTally()).matched,
                    "first_matched_offset": self.partitions.get(r.partition, _PartitionTally()).first_offset,
                    "last_matched_offset": self.partitions.get(r.partition, _PartitionTally()).last_offset,
                }
                for r in plan.ranges
            ],
        }


def _light(record: DeadLetterRecord) -> DeadLetterRecord:
    """The record without its key/value bytes (kept for the oldest/newest rows only)."""
    return replace(record, key=None, value=None, headers=())
