"""The broker the tests run on does what the stage relies on, checked with kafka-python alone.

Transactions (commit, abort, open), read_committed isolation, consumer-group offsets, and
offsets committed inside a transaction (send_offsets_to_transaction + group_metadata, KIP-447).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

pytestmark = pytest.mark.kafka(timeout=60)

POLL_TIMEOUT_S = 20.0


@contextmanager
def transactional_producer(bootstrap: str) -> Iterator[KafkaProducer]:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=f"txn-{uuid.uuid4().hex}", max_block_ms=20000,
        request_timeout_ms=15000,
    )  # fmt: skip
    try:
        producer.init_transactions()
        yield producer
    finally:
        producer.close(timeout=5)


@contextmanager
def consumer(bootstrap: str, **config: object) -> Iterator[KafkaConsumer]:
    config.setdefault("enable_auto_commit", False)
    config.setdefault("auto_offset_reset", "earliest")
    c = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=15000, **config)
    try:
        yield c
    finally:
        c.close()


def send_in_transaction(producer: KafkaProducer, topic: str, values: list[bytes], *, commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.send(topic, value)
    producer.flush(timeout=15)
    if commit:
        producer.commit_transaction()
    else:
        producer.abort_transaction()


def poll_values(c: KafkaConsumer, *, until: bytes | None = None, count: int | None = None,
                timeout_s: float = POLL_TIMEOUT_S) -> list[bytes]:  # fmt: skip
    """Values in partition order until `until` was seen or `count` reached; all seen when time runs out."""
    seen: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for records in c.poll(timeout_ms=200).values():
            seen.extend(r.value for r in records)
        if (until is not None and until in seen) or (count is not None and len(seen) >= count):
            break
    return seen


def read_partition(bootstrap: str, topic: str, *, isolation: str, until: bytes) -> list[bytes]:
    """Everything in partition 0 up to the sentinel, read without a group."""
    with consumer(bootstrap, isolation_level=isolation) as c:
        c.assign([TopicPartition(topic, 0)])
        c.seek_to_beginning()
        values = poll_values(c, until=until)
    assert until in values, f"sentinel {until!r} not read within {POLL_TIMEOUT_S} s (got {values})"
    return values


def test_committed_transaction_is_visible_to_read_committed(kafka_bootstrap, topic_factory):
    topic = topic_factory(1)
    with transactional_producer(kafka_bootstrap) as producer:
        send_in_transaction(producer, topic, [b"a1", b"a2", b"a3"], commit=True)
    assert read_partition(kafka_bootstrap, topic, isolation="read_committed", until=b"a3") == [
        b"a1",
        b"a2",
        b"a3",
    ]


def test_aborted_transaction_is_written_but_invisible_to_read_committed(kafka_bootstrap, topic_factory):
    topic = topic_factory(1)
    with transactional_producer(kafka_bootstrap) as producer:
        send_in_transaction(producer, topic, [b"a1", b"a2"], commit=True)
        send_in_transaction(producer, topic, [b"b1", b"b2"], commit=False)
        send_in_transaction(producer, topic, [b"c1"], commit=True)

    assert read_partition(kafka_bootstrap, topic, isolation="read_committed", until=b"c1") == [
        b"a1",
        b"a2",
        b"c1",
    ]
    # The aborted records are in the log (so read_committed really filtered them), markers take offsets too.
    everything = read_partition(kafka_bootstrap, topic, isolation="read_uncommitted", until=b"c1")
    assert everything == [b"a1", b"a2", b"b1", b"b2", b"c1"]


def test_open_transaction_blocks_read_committed_until_commit(kafka_bootstrap, topic_factory):
    topic = topic_factory(1)
    with transactional_producer(kafka_bootstrap) as producer, \
            consumer(kafka_bootstrap, isolation_level="read_committed") as committed_reader:  # fmt: skip
        committed_reader.assign([TopicPartition(topic, 0)])
        committed_reader.seek_to_beginning()
        producer.begin_transaction()
        producer.send(topic, b"pending")
        producer.flush(timeout=15)

        assert read_partition(kafka_bootstrap, topic, isolation="read_uncommitted", until=b"pending")
        assert poll_values(committed_reader, count=1, timeout_s=2.0) == []  # held back at the open txn

        producer.commit_transaction()
        assert poll_values(committed_reader, count=1) == [b"pending"]


def test_group_commit_then_a_new_member_resumes_at_the_committed_offset(
    kafka_bootstrap, topic_factory, unique_group_id
):
    topic = topic_factory(1)
    tp = TopicPartition(topic, 0)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_block_ms=20000)
    try:
        for i in range(10):
            producer.send(topic, f"m{i}".encode())
        producer.flush(timeout=15)
    finally:
        producer.close(timeout=5)

    with consumer(kafka_bootstrap, group_id=unique_group_id) as first:
        first.subscribe([topic])
        assert len(poll_values(first, count=10)) == 10
        first.commit({tp: OffsetAndMetadata(4, "", -1)})
        assert first.committed(tp) == 4

    with consumer(kafka_bootstrap, group_id=unique_group_id) as second:
        second.subscribe([topic])
        assert poll_values(second, count=6) == [f"m{i}".encode() for i in range(4, 10)]
        assert second.committed(tp) == 4  # reading alone commits nothing (auto commit is off)


def test_send_offsets_to_transaction_commits_offsets_with_the_outputs(
    kafka_bootstrap, topic_factory, unique_group_id
):
    source, sink = topic_factory(1, prefix="src"), topic_factory(1, prefix="sink")
    tp = TopicPartition(source, 0)
    reader = consumer(kafka_bootstrap, group_id=unique_group_id, isolation_level="read_committed")
    with transactional_producer(kafka_bootstrap) as producer, reader as c:
        send_in_transaction(producer, source, [b"in0", b"in1", b"in2"], commit=True)
        c.subscribe([source])
        assert poll_values(c, count=3) == [b"in0", b"in1", b"in2"]
        metadata = c.group_metadata()
        assert metadata.group_id == unique_group_id and metadata.member_id and metadata.generation_id >= 1

        # consume-transform-produce, committed: outputs and the input offset become visible together
        producer.begin_transaction()
        for i in range(3):
            producer.send(sink, f"out{i}".encode())
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(3, "", -1)}, c.group_metadata())
        producer.commit_transaction()
        assert c.committed(tp) == 3

        # ... aborted: neither the outputs nor the offset count
        send_in_transaction(producer, source, [b"in3"], commit=True)
        assert poll_values(c, count=1) == [b"in3"]
        producer.begin_transaction()
        producer.send(sink, b"out3-aborted")
        producer.send_offsets_to_transaction({tp: OffsetAndMetadata(4, "", -1)}, c.group_metadata())
        producer.abort_transaction()
        assert c.committed(tp) == 3

        send_in_transaction(producer, sink, [b"end"], commit=True)

    outputs = read_partition(kafka_bootstrap, sink, isolation="read_committed", until=b"end")
    assert outputs == [b"out0", b"out1", b"out2", b"end"]
    with consumer(kafka_bootstrap, group_id=unique_group_id) as restarted:
        assert restarted.committed(tp) == 3
