"""librdkafka's assigned consumer: partitions the caller assigns, logical seeks resolved by reassigning."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError
from confluent_kafka import TopicPartition as RdTopicPartition

from rollout_stream.kafka.confluent.consumer import _Consumer
from rollout_stream.kafka.confluent.convert import _rd
from rollout_stream.kafka.confluent.errors import _translated
from rollout_stream.kafka.seam import TopicPartition


class _AssignedConsumer(_Consumer):
    def __init__(self, consumer: Consumer, commit_group: str | None) -> None:
        super().__init__(consumer)
        self._commit_group = commit_group
        self._start: dict[tuple[str, int], int] = {}  # where a logical seek resolved to
        # Partitions assigned from their beginning and neither read nor sought since: a seek to the beginning
        # changes nothing for them, and reassigning would drop and fetch again what the fetcher already has.
        self._untouched: set[tuple[str, int]] = set()

    def assign(self, tps: Sequence[TopicPartition]) -> None:
        # Without a group of its own there is nothing committed to start from: asking would need the right to
        # describe the placeholder group (a least-privilege reader has none), so start at the beginning.
        start = None if self._commit_group else OFFSET_BEGINNING
        self._assign_anew([_rd(tp, start) for tp in tps])
        self._untouched = {(tp.topic, tp.partition) for tp in tps} if start == OFFSET_BEGINNING else set()

    def assign_at(self, tp: TopicPartition, offset: int) -> None:
        self.assign_from({tp: offset})

    def assign_from(self, positions: Mapping[TopicPartition, int]) -> None:
        # Assigned at the offsets: assign() then seek() would start a fetch at the beginning first.
        self._assign_anew([_rd(tp, offset) for tp, offset in positions.items()])
        self._untouched = set()
        for tp, offset in positions.items():
            self._next[(tp.topic, tp.partition)] = offset
            self._sought.add((tp.topic, tp.partition))

    def _assign_anew(self, rd_tps: list[RdTopicPartition]) -> None:
        """librdkafka's assign, what the seam knew of earlier partitions forgotten, none left paused."""
        paused = set(self._paused)
        self._forget_all()
        self._start.clear()
        with _translated:
            self._c.assign(rd_tps)
            # librdkafka keeps a partition paused across assignments: one paused before fetches once assigned
            # again, and one not assigned now would come back paused later.
            if paused:
                self._c.resume([_rd(TopicPartition(topic, partition)) for topic, partition in paused])

    def _irrelevant(self, error: KafkaError) -> bool:
        # librdkafka wants a group id even here and looks for its coordinator: a least-privilege reader
        # may not describe that placeholder group, and never uses it.
        return self._commit_group is None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    def position(self, tp: TopicPartition) -> int:
        pos = self.fetch_position(tp)
        if pos >= 0:
            return pos
        if (tp.topic, tp.partition) in self._start:
            return self._start[(tp.topic, tp.partition)]
        # Without a group of its own, committed offsets need a group the caller may not be allowed to read.
        return super().position(tp) if self._commit_group else self.beginning_offsets([tp])[tp]

    def seek_to_beginning(self, tps: Sequence[TopicPartition]) -> None:
        fresh = [tp for tp in tps if (key := (tp.topic, tp.partition)) in self._untouched
                 and key not in self._next and key not in self._sought]
        if fresh:
            for tp, offset in self.beginning_offsets(fresh).items():
                self._start[(tp.topic, tp.partition)] = offset
        rest = [tp for tp in tps if tp not in fresh]
        if rest:
            self._reassign(rest, OFFSET_BEGINNING)

    def seek_to_end(self, tps: Sequence[TopicPartition]) -> None:
        self._reassign(tps, OFFSET_END)

    def _reassign(self, tps: Sequence[TopicPartition], logical: int) -> None:
        # A logical offset is resolved at (re)assignment; seek() to one needs a started fetcher.
        current = {(tp.topic, tp.partition): tp for tp in self._c.assignment()}
        resolved = (self.beginning_offsets if logical == OFFSET_BEGINNING else self.end_offsets)(list(tps))
        for tp in tps:
            self._untouched.discard((tp.topic, tp.partition))
            current[(tp.topic, tp.partition)] = _rd(tp, logical)
            self._forget([(tp.topic, tp.partition)], paused=False)
            self._start[(tp.topic, tp.partition)] = resolved[tp]
        with _translated:
            self._c.assign(list(current.values()))
