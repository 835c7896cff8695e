"""`lag`'s records behind a consumer group count records, not the transaction markers between them: on the
in-memory seam (which writes a marker per transaction, as a broker does) and on the real broker, where what
each client reports past a marker is the point."""

from __future__ import annotations

import uuid

import pytest

import rollout_stream.ops.records_behind as module
from rollout_stream.clients import Connection
from rollout_stream.kafka import TopicPartition, client_for
from rollout_stream.kafka.memory import MemoryClient, MemoryCluster
from rollout_stream.ops.records_behind import TAIL_OFFSETS, records_behind

TOPIC = "rollouts"


def write(client, topic: str, counts: dict[int, int], *, abort: bool = False) -> None:
    """One transaction of `counts[p]` records in each partition p (committed: a marker after them)."""
    producer = client.producer(client_id="writer", max_record_bytes=1 << 20,
                               transactional_id=f"writer-{uuid.uuid4().hex[:8]}")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for partition, n in counts.items():
            for i in range(n):
                producer.send(topic, b"v%d" % i, b"k", partition=partition)
        producer.abort_transaction() if abort else producer.commit_transaction()
    finally:
        producer.close()


def commit_at_end(client, topic: str, group: str, partitions: int) -> dict[TopicPartition, int]:
    """The group commits each partition's end offset minus its last marker: where a caught-up worker's
    commit stands (after the last record it read)."""
    consumer = client.assigned_consumer(client_id="lag", max_record_bytes=1 << 20, commit_group=group)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = consumer.end_offsets(tps)
        offsets = {tp: ends[tp] - 1 for tp in tps}
        consumer.commit(offsets)
        return offsets
    finally:
        consumer.close()


@pytest.fixture
def memory(monkeypatch) -> MemoryClient:
    cluster = MemoryCluster()
    cluster.create_topic(TOPIC, 2)
    client = MemoryClient(cluster)
    monkeypatch.setattr(module, "client_for", lambda conn: client)
    return client


CONN = Connection("memory:9092")


def test_a_caught_up_group_is_zero_behind_though_markers_follow_its_commit(memory):
    write(memory, TOPIC, {0: 3, 1: 2})
    write(memory, TOPIC, {0: 1})
    commit_at_end(memory, TOPIC, "stage", 2)  # p0: 6 of end 7 (two markers), p1: 3 of end 4
    assert records_behind(CONN, TOPIC, {"stage": "stage"}) == {"stage": 0}


def test_records_after_the_commit_count_and_markers_and_aborted_records_do_not(memory):
    write(memory, TOPIC, {0: 3, 1: 2})
    commit_at_end(memory, TOPIC, "stage", 2)
    write(memory, TOPIC, {0: 4, 1: 1})  # 5 records, 2 markers
    write(memory, TOPIC, {0: 2}, abort=True)  # 2 records no one reads, 1 marker
    write(memory, TOPIC, {1: 3})  # 3 records, 1 marker
    assert records_behind(CONN, TOPIC, {"stage": "stage", "none": "never-committed"}) == {
        "stage": 8, "none": None}


def test_far_behind_the_offsets_before_the_tail_count_as_records(memory):
    for _ in range(TAIL_OFFSETS):  # one record and one marker each: 2 × TAIL_OFFSETS offsets
        write(memory, TOPIC, {0: 1})
    consumer = memory.assigned_consumer(client_id="lag", commit_group="stage")
    consumer.commit({TopicPartition(TOPIC, 0): 0})
    consumer.close()
    # the tail (the last TAIL_OFFSETS offsets) holds TAIL_OFFSETS / 2 records; before it, offsets count
    assert records_behind(CONN, TOPIC, {"stage": "stage"}) == {"stage": TAIL_OFFSETS + TAIL_OFFSETS // 2}


@pytest.mark.kafka
def test_on_the_broker_markers_are_not_lag(kafka_bootstrap, kafka_client, topic_factory, unique_group_id):
    topic = topic_factory(2)
    conn = Connection(kafka_bootstrap)
    client = client_for(conn)
    write(client, topic, {0: 3, 1: 2})
    write(client, topic, {0: 1})
    commit_at_end(client, topic, unique_group_id, 2)
    assert records_behind(conn, topic, {"stage": unique_group_id}) == {"stage": 0}
    write(client, topic, {0: 2, 1: 1})
    write(client, topic, {1: 1}, abort=True)
    assert records_behind(conn, topic, {"stage": unique_group_id}) == {"stage": 3}
