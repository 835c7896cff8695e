"""Heads cover train-data, or the reader knows (`fetch="own"`): `CoverageWatch`, in the fetch thread.

A rank that folds group heads reads only what they describe: a group published without a head (a stage run
without `--write-heads`, or an older stage) would never be read, and nothing would say so. The watch follows,
per partition, how far the heads cover train-data and looks for records no head covers:

* between two heads: the train-data offsets between the last head's records and the next head's. Under
  exactly-once every transaction ends with one marker in both topics, so a gap in train-data no wider than
  the one between the two heads' own offsets is markers (an aborted transaction holds at least as many
  records as heads); a wider one is read (read_committed: only committed records come back).
* after the last head, once the heads partition is read to its end: train-data's end against the last head's
  records the same way, every COVERAGE_CHECK_S.

Records found hold their partition back — its next head is not folded and the merge waits for the partition,
so every rank keeps one order — until a later head of their group key covers them (an at-least-once stage
that stopped between a group's records and its head publishes both again), or, when the heads partition has
been read to its end and UNCOVERED_AFTER_S have passed, the reader stops with `UncoveredRecords`. What the
watch holds is in the reader's `batch.waiting` line meanwhile (`describe`).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from rollout_stream.codec import DecodeError
from rollout_stream.codec.group_heads import GroupHead, decode_group_head
from rollout_stream.kafka import AssignedConsumer, Client, TopicPartition
from rollout_stream.logs import log_event
from rollout_stream.reader.by_offset import fetch_tuning
from rollout_stream.reader.errors import UncoveredRecords

__all__ = ["COVERAGE_CHECK_S", "UNCOVERED_AFTER_S", "CoverageWatch"]

log = logging.getLogger("rollout_stream.reader")

# How long records no head covers may wait for one, with the heads read to their end, before the reader stops.
UNCOVERED_AFTER_S = 30.0
# How often the end of train-data is compared with the heads read to their end.
COVERAGE_CHECK_S = 5.0
PROBE_BUDGET_S = 2.0  # the longest one read of a gap may take (the rest is looked at next time)
PROBE_MAX_RECORDS = 256  # records a read of a gap stops at: enough to decide and to name
SCAN_EVERY_S = 0.5  # how often the heads after a held one are searched for the heads of its records
HEAD_LOOKBACK = 16  # offsets read before a resumed position for the head before it
RECENT_KEYS = 1000  # group keys of the last heads per partition: a record of one of them is a copy


@dataclass
class _Partition:
    last_head: int | None = None  # heads offset of the last head folded (or the one before the start)
    covered: int | None = None  # highest train-data offset the heads cover up to that head
    pending: dict[str, list[int]] = field(default_factory=dict)  # group key -> train offsets no head covers
    since: float = 0.0  # when the pending records were found (monotonic)
    hold_at: int | None = None  # the heads offset held back (read again once the records are covered)
    scan_from: int = 0  # the heads offset the search for covering heads goes on from
    next_scan: float = 0.0  # when that search may run again (monotonic)
    recent: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def remember(self, key: str) -> None:
        self.recent[key] = None
        self.recent.move_to_end(key)
        if len(self.recent) > RECENT_KEYS:
            self.recent.popitem(last=False)


class CoverageWatch:
    """Finds train-data records of `topic` that no head in `heads` covers (module docstring).

    `client`, `client_id`, `max_record_bytes`: what its two readers (of train-data gaps, of heads ahead) are
    made with, on first use. Used by the fetch thread alone.
    """

    def __init__(self, client: Client, client_id: str, topic: str, heads: str, max_record_bytes: int) -> None:
        self.client, self.client_id, self.topic, self.heads = client, client_id, topic, heads
        self.max_record_bytes = max_record_bytes
        self.parts: dict[int, _Partition] = {}
        self._probe: AssignedConsumer | None = None
        self._scan: AssignedConsumer | None = None
        self._next_check = 0.0

    # ---- the head before the start -------------------------------------------------------------------
    def start(self, positions: dict[int, int], heads_begin: dict[int, int]) -> None:
        """Reading heads starts at `positions` (per partition); `heads_begin`: the heads topic's first
        offsets. From the beginning, train-data's first offset is where coverage starts; else the head
        before the position says."""
        begin = self._consumer("probe").beginning_offsets([TopicPartition(self.topic, p) for p in positions])
        for p, position in positions.items():
            st = self.parts[p] = _Partition(scan_from=position)
            if position <= heads_begin.get(p, 0):
                st.last_head, st.covered = position - 1, begin[TopicPartition(self.topic, p)] - 1
                continue
            found = self._heads(p, max(heads_begin.get(p, 0), position - HEAD_LOOKBACK), position)
            if found:
                offset, head = found[-1]
                st.last_head, st.covered = offset, _span(head)[1]

    # ---- heads as the fetch thread reads them --------------------------------------------------------
    def passed(self, partition: int, offset: int, value: bytes | None) -> None:
        """A head yielded before a restart: coverage goes on from it."""
        head = self._decoded(partition, value)
        if head is not None:
            self._advance(self.parts[partition], offset, head)

    def admits(self, partition: int, offset: int, value: bytes | None) -> bool:
        """Whether the head at `offset` may be folded now; False: records before it are not covered, the
        partition is held (read it again from `offset` once `holding` says no more)."""
        st = self.parts[partition]
        head = self._decoded(partition, value)
        if head is None:
            return True  # the fold counts it (undecodable, another topic's)
        st.pending.pop(head.group_key, None)
        if st.pending and st.hold_at is None:
            st.hold_at = offset
        if st.hold_at is not None and st.hold_at != offset:
            return False
        low, high = _span(head)
        if st.covered is not None and st.last_head is not None and st.hold_at is None:
            gap, markers = low - st.covered - 1, offset - st.last_head - 1
            if gap > max(markers, 0):
                found = self._uncovered(st, partition, st.covered + 1, low, head.group_key)
                if found:
                    self._found(st, partition, found, hold_at=offset)
                    return False
        if st.hold_at == offset:
            if st.pending:
                return False
            st.hold_at = None
        self._advance(st, offset, head)
        return True

    def holding(self, partition: int) -> bool:
        """The partition waits for a head of records found uncovered (the merge must wait for it too)."""
        st = self.parts.get(partition)
        return st is not None and bool(st.pending)

    def check(self, at_end: dict[int, bool], heads_end: dict[int, int | None]) -> list[int]:
        """Once a turn: look after the held partitions (the partitions now released), and every
        COVERAGE_CHECK_S compare train-data's end with what the heads read to their end (`at_end`) cover.
        Raises UncoveredRecords once records waited UNCOVERED_AFTER_S with the heads read to their end."""
        released = []
        now = time.monotonic()
        for p, st in self.parts.items():
            if st.pending and now >= st.next_scan:
                st.next_scan = now + SCAN_EVERY_S
                self._covered_later(p, st)
                if not st.pending:
                    released.append(p)
                    log_event(log, "heads.covered", topic=self.topic, partition=p)
        if now < self._next_check:
            return released
        self._next_check = now + COVERAGE_CHECK_S
        for p, st in self.parts.items():
            if st.pending or not at_end.get(p) or st.covered is None or st.last_head is None:
                continue
            end = heads_end.get(p)
            if end is None:
                continue
            tail = self._end(p)
            if tail - st.covered - 1 > max(end - st.last_head - 1, 0):
                found = self._uncovered(st, p, st.covered + 1, tail, None)
                if found:
                    self._found(st, p, found, hold_at=None)
        return released

    def describe(self) -> str:
        """What the watch holds, for the waiting log ("" when nothing)."""
        held = []
        for p, st in sorted(self.parts.items()):
            if st.pending:
                offsets = sorted(o for os in st.pending.values() for o in os)
                held.append(f"{p}:{offsets[0]}-{offsets[-1]}({len(offsets)} records, "
                            f"{round(time.monotonic() - st.since)}s)")
        return ",".join(held)

    def close(self) -> None:
        for consumer in (self._probe, self._scan):
            if consumer is not None:
                consumer.close()

    # ---- parts -----------------------------------------------------------------------------------------
    def _decoded(self, partition: int, value: bytes | None) -> GroupHead | None:
        try:
            head = decode_group_head(value or b"")
        except DecodeError:
            return None
        ok = head.topic == self.topic and head.partition == partition and any(s.offsets for s in head.samples)
        return head if ok else None

    def _advance(self, st: _Partition, offset: int, head: GroupHead) -> None:
        high = _span(head)[1]
        st.covered = high if st.covered is None else max(st.covered, high)
        st.last_head = offset if st.last_head is None else max(st.last_head, offset)
        st.remember(head.group_key)

    def _found(self, st: _Partition, partition: int, found: list[tuple[int, str]], hold_at: int | None
               ) -> None:
        for offset, key in found:
            st.pending.setdefault(key, []).append(offset)
        st.since, st.hold_at = time.monotonic(), hold_at
        st.scan_from = (hold_at + 1) if hold_at is not None else (st.last_head or 0) + 1
        log_event(log, "heads.uncovered", logging.WARNING, topic=self.topic, partition=partition,
                  offsets=f"{found[0][0]}-{found[-1][0]}", records=len(found),
                  groups=",".join(sorted(st.pending)[:5]))

    def _covered_later(self, partition: int, st: _Partition) -> None:
        """Read the heads after the held one for heads of the pending keys. Raises UncoveredRecords when they
        stayed uncovered for UNCOVERED_AFTER_S, every head read."""
        scan = self._consumer("scan")
        tp = TopicPartition(self.heads, partition)
        end = scan.end_offsets([tp])[tp]
        if st.scan_from < end:
            for offset, head in self._heads(partition, st.scan_from, end):
                st.pending.pop(head.group_key, None)
                st.scan_from = offset + 1
            st.scan_from = max(st.scan_from, min(end, scan.fetch_position(tp)))
        if st.pending and st.scan_from >= end and time.monotonic() - st.since >= UNCOVERED_AFTER_S:
            offsets = sorted(o for os in st.pending.values() for o in os)
            raise UncoveredRecords(
                f"{self.topic} partition {partition} holds records no group head in {self.heads} covers "
                f"(offsets {offsets[0]}..{offsets[-1]}, {len(offsets)} found, groups "
                f"{', '.join(sorted(st.pending)[:3])}), {UNCOVERED_AFTER_S:g}s after they were found: groups "
                "published by a stage without --write-heads, which fetch='own' never reads; read this topic "
                "with fetch='all' (under a new group_id), or stop the stage that writes no heads")

    def _uncovered(self, st: _Partition, partition: int, start: int, end: int, covering: str | None
                   ) -> list[tuple[int, str]]:
        """(offset, group key) of the committed records in train-data [start, end) that are not copies of a
        group a recent head (or `covering`, the head after them) covers."""
        return [(o, k) for o, k in self._records(partition, start, end)
                if k != covering and k not in st.recent]

    def _records(self, partition: int, start: int, end: int) -> list[tuple[int, str]]:
        probe = self._consumer("probe")
        tp = TopicPartition(self.topic, partition)
        probe.assign_at(tp, start)  # assigned and sought, librdkafka would fetch the partition's first record
        found: list[tuple[int, str]] = []
        deadline = time.monotonic() + PROBE_BUDGET_S
        polled = False
        while time.monotonic() < deadline and len(found) < PROBE_MAX_RECORDS:
            for records in probe.poll(0.1, max_records=1).values():
                for rec in records:
                    if start <= rec.offset < end:
                        found.append((rec.offset, (rec.key or b"").decode("utf-8", "replace")))
            polled = True
            position, stable = probe.fetch_position(tp), probe.highwater(tp)
            if position >= end or (polled and stable is not None and position >= stable):
                break  # read to the end asked for, or to the last stable offset (the rest is not committed)
            if found and found[-1][0] + 1 >= end:
                break
        return found

    def _heads(self, partition: int, start: int, end: int) -> list[tuple[int, GroupHead]]:
        """The heads of this topic in heads partition `partition`, offsets [start, end), as far as read within
        PROBE_BUDGET_S."""
        scan = self._consumer("scan")
        tp = TopicPartition(self.heads, partition)
        scan.assign_at(tp, start)
        out: list[tuple[int, GroupHead]] = []
        deadline = time.monotonic() + PROBE_BUDGET_S
        while time.monotonic() < deadline and scan.fetch_position(tp) < end:
            for records in scan.poll(0.1).values():
                for rec in records:
                    if rec.offset < end and (head := self._decoded(partition, rec.value)) is not None:
                        out.append((rec.offset, head))
            stable = scan.highwater(tp)
            if stable is not None and scan.fetch_position(tp) >= stable:
                break
        return out

    def _end(self, partition: int) -> int:
        tp = TopicPartition(self.topic, partition)
        return self._consumer("probe").end_offsets([tp])[tp]

    def _consumer(self, which: str) -> AssignedConsumer:
        if which == "probe":
            if self._probe is None:  # one record batch per fetch: a gap's records, not the ones after it
                self._probe = self.client.assigned_consumer(
                    client_id=f"{self.client_id}-coverage", max_record_bytes=self.max_record_bytes,
                    **fetch_tuning(self.client.name))
            return self._probe
        if self._scan is None:
            self._scan = self.client.assigned_consumer(client_id=f"{self.client_id}-coverage",
                                                       max_record_bytes=self.max_record_bytes)
        return self._scan


def _span(head: GroupHead) -> tuple[int, int]:
    offsets = [o for s in head.samples for o in s.offsets]
    return min(offsets), max(offsets)
