"""What librdkafka's group and assigned consumers share: records handed out once each as `Rec` tuples, pause
and resume, seeks, positions, watermarks, committed offsets and commits."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException

from rollout_stream.kafka.confluent.convert import _rd, _rd_offsets
from rollout_stream.kafka.confluent.errors import _COORDINATOR_MOVING, _LEADER_MOVING, _translated, translate
from rollout_stream.kafka.confluent.settings import TIMEOUT_S
from rollout_stream.kafka.seam import Committed, Header, Offsets, Polled, TopicPartition


class Rec(NamedTuple):
    """A consumed record with the seam's attribute names (librdkafka's Message has methods)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] | None


_new = tuple.__new__


class _Consumer:
    def __init__(self, consumer: Consumer) -> None:
        self._c = consumer
        self._paused: set[tuple[str, int]] = set()
        self._next: dict[
            tuple[str, int], int
        ] = {}  # per partition: the offset after the last record handed out
        self.redelivered = 0  # records librdkafka fetched again below that offset, dropped
        self._sought: set[tuple[str, int]] = set()  # sought, and no record handed out since
        # Per partition: where librdkafka said its fetcher reached the end (enable.partition.eof). A
        # transactional partition ends with a marker one offset past its last record; after a seek (a
        # resume) no record moves librdkafka's position past it, so only this says the end was reached.
        self._end: dict[tuple[str, int], int] = {}
        self.connections: int | None = None

    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        # consume(n, timeout) returns only when n records arrived or the timeout passed: at half load every
        # record waited out the whole timeout (docs/benchmarks.md). poll() returns with the first record;
        # what is already fetched follows without waiting.
        limit = max_records or 500
        try:
            first = self._c.poll(timeout_s)
            messages = [] if first is None else [first]
            if first is not None and limit > 1:
                messages += self._c.consume(limit - 1, 0)
        except KafkaException as exc:
            if exc.args and self._recovered(exc.args[0]):
                return {}
            raise translate(exc) from exc
        out: dict[TopicPartition, list[Rec]] = {}
        # Per message only what differs: a partition's messages come in runs, so its batch is looked up once
        # per run; a Rec is made by tuple.__new__ (a NamedTuple's own __new__ is a Python function), and no
        # TopicPartition is made per message (docs/benchmarks.md).
        topic, partition, batch = "", -1, []
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    eof_topic, eof_partition, end = m.topic(), m.partition(), m.offset()
                    assert eof_topic is not None and eof_partition is not None and end is not None  # named
                    self._end[(eof_topic, eof_partition)] = end
                    continue
                if self._irrelevant(error):
                    continue
                if self._recovered(error):
                    return {}
                raise translate(KafkaException(error))
            if m.partition() != partition or m.topic() != topic:
                next_topic, next_partition = m.topic(), m.partition()
                assert next_topic is not None and next_partition is not None  # a record names its partition
                topic, partition = next_topic, next_partition
                batch = out.setdefault(TopicPartition(topic, partition), [])
            batch.append(_new(Rec, (topic, partition, m.offset(), m.timestamp()[1], m.key(), m.value(),
                                    m.headers())))
        for tp, batch in list(out.items()):
            after = self._next.get(tp)
            if after is not None and batch[0].offset < after:
                # Handed out already: librdkafka re-fetches from an older position after some pause/resume
                # sequences (seen on the reader's backlog). The seam hands out each offset once per position.
                batch = [r for r in batch if r.offset >= after]
                self.redelivered += len(out[tp]) - len(batch)
                if not batch:
                    del out[tp]
                    continue
                out[tp] = batch
            self._next[tp] = batch[-1].offset + 1
            self._sought.discard(tp)
        return out

    def _irrelevant(self, error: KafkaError) -> bool:
        return False

    def _recovered(self, error: KafkaError) -> bool:
        """Whether a failure was dealt with here (the consumer replaced), so the poll just returns nothing."""
        return False

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        tps = list(partitions)
        if tps:
            with _translated:
                self._c.pause([_rd(tp) for tp in tps])
            self._paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        tps = list(partitions)
        if tps:
            with _translated:
                self._c.resume([_rd(tp) for tp in tps])
                # librdkafka purged what it had fetched for a paused partition and may fetch from an older
                # position on resume: go on after the last record handed out, so none comes twice.
                for tp in tps:
                    if (tp.topic, tp.partition) in self._next:
                        self.seek(tp, self._next[(tp.topic, tp.partition)])
            self._paused -= {(tp.topic, tp.partition) for tp in tps}

    def _forget(self, keys: Iterable[tuple[str, int]], *, paused: bool = True) -> None:
        """What the seam knew of these partitions' positions (unassigned, or sought elsewhere)."""
        for key in keys:
            if paused:
                self._paused.discard(key)
            self._next.pop(key, None)
            self._sought.discard(key)
            self._end.pop(key, None)

    def _forget_all(self) -> None:
        self._paused.clear()
        self._next.clear()
        self._sought.clear()
        self._end.clear()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._end.pop((tp.topic, tp.partition), None)
        self._next[(tp.topic, tp.partition)] = offset
        self._sought.add((tp.topic, tp.partition))
        deadline = time.monotonic() + 10
        while True:
            try:
                self._c.seek(_rd(tp, offset))
                return
            except KafkaException as exc:  # "Erroneous state" until the partition's fetcher has started;
                # "Outdated" when an assignment made in the rebalance callback is still being applied
                if exc.args[0].code() not in (KafkaError._STATE, KafkaError._OUTDATED) or \
                        time.monotonic() > deadline:
                    raise translate(exc) from exc
                time.sleep(0.01)

    def position(self, tp: TopicPartition) -> int:
        pos = self.fetch_position(tp)
        if pos >= 0:
            return pos
        committed = self.committed(tp)
        if committed is not None:
            return committed.offset
        return self.beginning_offsets([tp])[tp]

    def fetch_position(self, tp: TopicPartition) -> int:
        # librdkafka's position is invalid after a seek until a record comes (e.g. a seek to the end): the
        # seam's own mark of what it handed out counts too.
        key = (tp.topic, tp.partition)
        handed_out = max(self._next.get(key, -1), self._end.get(key, -1))
        if key in self._sought:  # librdkafka applies a seek asynchronously: its position may be the old one
            return handed_out
        try:
            found = self._c.position([_rd(tp)])
        except KafkaException:
            return handed_out
        offset = found[0].offset if found else OFFSET_INVALID
        return max(offset, handed_out) if offset >= 0 else handed_out

    def highwater(self, tp: TopicPartition) -> int | None:
        try:
            _low, high = self._c.get_watermark_offsets(_rd(tp), cached=True)
        except KafkaException:
            return None
        return high if high >= 0 else None

    def backlog(self) -> int:
        behind = 0
        for rtp in self._c.assignment():
            if (rtp.topic, rtp.partition) in self._paused:
                continue
            tp = TopicPartition(rtp.topic, rtp.partition)
            high, pos = self.highwater(tp), self.fetch_position(tp)
            if high is not None and pos >= 0:
                behind += max(0, high - pos)
        return behind

    def _watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        # After a broker dies librdkafka asks the old leader until its metadata catches up (a worker on the
        # 3-node cluster stopped on NOT_LEADER_FOR_PARTITION when its partitions moved): asked again.
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                low, high = self._c.get_watermark_offsets(_rd(tp), timeout=TIMEOUT_S, cached=False)
                return low, high
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                code = error.code() if isinstance(error, KafkaError) else None
                if code not in _LEADER_MOVING or time.monotonic() > deadline:
                    raise translate(exc) from exc
                time.sleep(0.2)

    def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {TopicPartition(*tp): self._watermarks(TopicPartition(*tp))[0] for tp in tps}

    def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {TopicPartition(*tp): self._watermarks(TopicPartition(*tp))[1] for tp in tps}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        with _translated:
            found = self._c.offsets_for_times(
                [_rd(tp, ts) for tp, ts in timestamps.items()], timeout=TIMEOUT_S
            )
        return {TopicPartition(f.topic, f.partition): (f.offset if f.offset >= 0 else None) for f in found}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        with _translated:
            meta = self._c.list_topics(topic, timeout=TIMEOUT_S)
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return None
        return set(found.partitions)

    def committed(self, tp: TopicPartition) -> Committed | None:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                found = self._c.committed([_rd(tp)], timeout=TIMEOUT_S)
                break
            except KafkaException as exc:
                # The group's coordinator moves when its broker dies (NOT_COORDINATOR, then load in
                # progress): ask again until it answers, as the Java client does.
                if exc.args[0].code() not in _COORDINATOR_MOVING or time.monotonic() > deadline:
                    raise translate(exc) from exc
                time.sleep(0.2)
        if not found or found[0].offset < 0:
            return None
        return Committed(found[0].offset, found[0].metadata or "")

    def commit(self, offsets: Offsets) -> None:
        if not offsets:
            return
        with _translated:
            self._c.commit(offsets=_rd_offsets(offsets), asynchronous=False)

    def group_metadata(self) -> Any:
        return self._c.consumer_group_metadata()

    def close(self) -> None:
        self._c.close()
