"""librdkafka's assigned consumer starts fetching at `assign`: a seek to the beginning right after it (the
reader's start without a commit) must not reassign, which would drop what the fetcher already holds and
fetch it from the broker again, once per call. Checked against a stand-in for librdkafka's Consumer."""

from __future__ import annotations

from typing import Any

from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import TopicPartition as RdTopicPartition

from rollout_stream.kafka.confluent.assigned_consumer import _AssignedConsumer
from rollout_stream.kafka.seam import TopicPartition


class _Librdkafka:
    """What `_AssignedConsumer` asks of librdkafka here: assignments (recorded) and low watermarks."""

    def __init__(self) -> None:
        self.assigns: list[list[tuple[str, int, int]]] = []
        self.seeks: list[tuple[str, int, int]] = []

    def assign(self, tps: list[RdTopicPartition]) -> None:
        self.assigns.append([(tp.topic, tp.partition, tp.offset) for tp in tps])

    def assignment(self) -> list[RdTopicPartition]:
        return [RdTopicPartition(t, p, o) for t, p, o in self.assigns[-1]]

    def seek(self, tp: RdTopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))

    def get_watermark_offsets(self, tp: RdTopicPartition, **_: Any) -> tuple[int, int]:
        return 3, 10

    def position(self, tps: list[RdTopicPartition]) -> list[RdTopicPartition]:
        return [RdTopicPartition(tp.topic, tp.partition, -1001) for tp in tps]  # no record fetched yet


TPS = [TopicPartition("train-data", p) for p in range(3)]


def test_a_seek_to_the_beginning_after_assign_keeps_the_fetch_that_started() -> None:
    rd = _Librdkafka()
    consumer = _AssignedConsumer(rd, None)  # type: ignore[arg-type]
    consumer.assign(TPS)
    for tp in TPS:  # as the reader does, one partition at a time
        consumer.seek_to_beginning([tp])
    assert rd.assigns == [[("train-data", p, OFFSET_BEGINNING) for p in range(3)]]  # assigned once
    assert all(consumer.position(tp) == 3 for tp in TPS)


def test_a_partition_sought_elsewhere_is_reassigned_to_its_beginning() -> None:
    rd = _Librdkafka()
    consumer = _AssignedConsumer(rd, None)  # type: ignore[arg-type]
    consumer.assign(TPS)
    consumer.seek(TPS[1], 7)
    consumer.seek_to_beginning([TPS[0], TPS[1]])
    assert len(rd.assigns) == 2
    assert ("train-data", 1, OFFSET_BEGINNING) in rd.assigns[-1]


def test_with_a_commit_group_the_start_is_the_commit_and_a_seek_to_the_beginning_reassigns() -> None:
    rd = _Librdkafka()
    consumer = _AssignedConsumer(rd, "trainer-rank0")  # type: ignore[arg-type]
    consumer.assign(TPS)
    consumer.seek_to_beginning(TPS[:1])
    assert len(rd.assigns) == 2
