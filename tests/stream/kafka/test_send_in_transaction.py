"""`Producer.send_in_transaction` and `send_all_in_transaction` on every client (real broker): records with
no report of their own commit with their transaction, and one the broker refuses fails the transaction's
commit."""

from __future__ import annotations

import uuid

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from rollout_stream.clients import Connection
from rollout_stream.kafka import KafkaFailure, OutgoingRecord, client_for
from rollout_stream.kafka.partitioner import murmur2
from tests.stream.helpers import read_topic


def _topic(bootstrap: str, **configs: str) -> str:
    name = f"txn-send-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, 2, 1, topic_configs=configs)])
    finally:
        admin.close()
    return name


def _producer(bootstrap: str):
    producer = client_for(Connection(bootstrap)).producer(
        client_id="txn-send", max_record_bytes=1 << 20, transactional_id=f"txn-send-{uuid.uuid4().hex[:8]}")
    producer.init_transactions()
    return producer


def test_records_sent_in_a_transaction_commit_with_it(kafka_bootstrap, kafka_client):
    topic = _topic(kafka_bootstrap)
    producer = _producer(kafka_bootstrap)
    try:
        producer.begin_transaction()
        for i in range(200):
            producer.send_in_transaction(topic, b"v%d" % i, b"k%d" % i, partition=i % 2,
                                         headers=[("n", b"%d" % i)])
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send_in_transaction(topic, b"aborted", b"k", partition=0)
        producer.abort_transaction()
    finally:
        producer.close(timeout=10)
    read = read_topic(kafka_bootstrap, topic, min_count=200, timeout=30)
    assert sorted((r.partition, r.value, r.key, r.headers["n"]) for r in read) == sorted(
        (i % 2, b"v%d" % i, b"k%d" % i, str(i)) for i in range(200))


def test_a_record_the_broker_refuses_fails_the_commit(kafka_bootstrap, kafka_client):
    topic = _topic(kafka_bootstrap, **{"max.message.bytes": "1024"})
    producer = _producer(kafka_bootstrap)
    try:
        producer.begin_transaction()
        producer.send_in_transaction(topic, b"small", b"k", partition=0)
        producer.send_in_transaction(topic, b"x" * 8192, b"k", partition=0)  # over the topic's limit only
        with pytest.raises(KafkaFailure):
            producer.flush(timeout=30)
            producer.commit_transaction()
        producer.abort_transaction()
    finally:
        producer.close(timeout=10)
    assert read_topic(kafka_bootstrap, topic, timeout=5) == []


def test_a_groups_records_sent_in_one_call_commit_in_order_on_their_keys_partition(kafka_bootstrap,
                                                                                    kafka_client):
    topic = _topic(kafka_bootstrap)
    # A local queue of 16 records on librdkafka: a call of 300 fills it, and waits for room as it goes.
    tuning = {"queue.buffering.max.messages": 16} if kafka_client == "confluent" else {}
    producer = client_for(Connection(kafka_bootstrap)).producer(
        client_id="txn-send", max_record_bytes=1 << 20, transactional_id=f"txn-send-{uuid.uuid4().hex[:8]}",
        **tuning)
    producer.init_transactions()
    keyed = [OutgoingRecord(topic, b"group-%d" % (i % 5), b"v%d" % i) for i in range(300)]
    named = [OutgoingRecord(topic, b"k", b"dl%d" % i, (("reason", b"r%d" % i),), partition=1)
             for i in range(3)]
    try:
        producer.begin_transaction()
        producer.send_all_in_transaction(keyed)
        producer.send_all_in_transaction(named)
        producer.commit_transaction()
    finally:
        producer.close(timeout=10)
    read = read_topic(kafka_bootstrap, topic, min_count=303, timeout=30)
    assert len(read) == 303
    for g in range(5):  # each key on Java's partition for it, in the order sent
        key = b"group-%d" % g
        assert {r.partition for r in read if r.key == key} == {(murmur2(key) & 0x7FFFFFFF) % 2}
        assert [r.value for r in read if r.key == key] == [o.value for o in keyed if o.key == key]
    assert [(r.partition, r.value, r.headers) for r in read if r.key == b"k"] == [
        (1, b"dl%d" % i, {"reason": f"r{i}"}) for i in range(3)]
