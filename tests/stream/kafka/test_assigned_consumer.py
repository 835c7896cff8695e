"""The seam's assigned consumer: a new assignment is never paused, on every client (real broker).

librdkafka keeps a partition paused across assignments, and kafka-python keeps the state of a partition
assigned again: a rank's payload fetcher that paused a partition and later asked for it again waited forever.
"""

from __future__ import annotations

import time
import uuid

import pytest

from rollout_stream.clients import Connection
from rollout_stream.kafka import TopicPartition, TopicSpec, client_for


def _first(consumer, deadline_s: float = 10.0) -> int | None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for records in consumer.poll(0.1, max_records=1).values():
            return records[0].offset
    return None


def _filled(client, partitions: int) -> str:
    """A new topic with 10 records in each partition."""
    topic = f"assign-{uuid.uuid4().hex[:10]}"
    admin = client.admin(client_id="assign-test")
    admin.create_topics([TopicSpec(topic, partitions)])
    admin.close()
    producer = client.producer(client_id="assign-test", max_record_bytes=1 << 20)
    for i in range(10 * partitions):
        producer.send(topic, b"v", partition=i % partitions)
    producer.flush()
    producer.close()
    return topic


def test_a_partition_paused_then_assigned_again_fetches(kafka_bootstrap, kafka_client):
    client = client_for(Connection(kafka_bootstrap))
    topic = _filled(client, 2)
    p0, p1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer = client.assigned_consumer(client_id="assign-test", max_record_bytes=1 << 20)
    try:
        consumer.assign_at(p0, 3)
        assert _first(consumer) == 3
        consumer.pause([p0])
        consumer.assign_at(p0, 7)  # the same partition, paused before
        assert _first(consumer) == 7
        consumer.pause([p0])
        consumer.assign_at(p1, 2)  # another one: p0 leaves paused ...
        assert _first(consumer) == 2
        consumer.assign([p0])  # ... and comes back fetching
        consumer.seek(p0, 5)
        assert _first(consumer) == 5
    finally:
        consumer.close()


def test_partitions_assigned_from_their_offsets_fetch_nothing_before_them(kafka_bootstrap, kafka_client):
    client = client_for(Connection(kafka_bootstrap))
    topic = _filled(client, 3)
    tps = [TopicPartition(topic, p) for p in range(3)]
    consumer = client.assigned_consumer(client_id="assign-test", max_record_bytes=1 << 20)
    try:
        consumer.assign_from({tps[1]: 0, tps[2]: 0})
        consumer.pause([tps[2]])
        consumer.assign_from({tps[0]: 4, tps[2]: 8})  # replaces the assignment; p2 was paused
        seen: dict[int, list[int]] = {}
        deadline = time.monotonic() + 10
        while sum(map(len, seen.values())) < 8 and time.monotonic() < deadline:
            for tp, records in consumer.poll(0.1).items():
                seen.setdefault(tp.partition, []).extend(r.offset for r in records)
        assert seen == {0: [4, 5, 6, 7, 8, 9], 2: [8, 9]}
    finally:
        consumer.close()


@pytest.mark.client("kafka-python")
def test_a_start_fetch_size_hands_out_small_fetches_first_then_full_ones(kafka_bootstrap, kafka_client):
    """kafka-python parses a fetch whole before handing out its first record: `start_fetch` fetches little
    a partition until it has received as much as it says, then `max_partition_fetch_bytes`."""
    client = client_for(Connection(kafka_bootstrap))
    topic = f"start-fetch-{uuid.uuid4().hex[:10]}"
    admin = client.admin(client_id="assign-test")
    admin.create_topics([TopicSpec(topic, 1)])
    admin.close()
    producer = client.producer(client_id="assign-test", max_record_bytes=1 << 20, linger_ms=0)
    for _ in range(200):  # each its own record batch: a fetch returns whole batches
        producer.send(topic, b"x" * 10_000, partition=0)
        producer.flush()
    producer.close()
    consumer = client.assigned_consumer(client_id="assign-test", max_record_bytes=1 << 20,
                                        max_partition_fetch_bytes=1 << 20, start_fetch=(20_000, 100_000))
    try:
        consumer.assign_at(TopicPartition(topic, 0), 0)
        sizes: list[int] = []  # records a poll handed out
        deadline = time.monotonic() + 20
        while sum(sizes) < 200 and time.monotonic() < deadline:
            if polled := consumer.poll(0.2):
                sizes.append(sum(len(records) for records in polled.values()))
        assert sum(sizes) == 200, sizes
        received, start = 0, []
        for n in sizes:  # the polls while under 100 KB received: 20 KB fetches, two records at most
            if received < 100_000:
                start.append(n)
            received += n * 10_000
        assert start and max(start) <= 2, sizes
        assert max(sizes) > 10, f"full fetches (1 MiB) hand out more at a time: {sizes}"
    finally:
        consumer.close()
