"""The confluent implementation's transactional producer after a fatal error (real broker)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException

from rollout_stream.clients import Connection
from rollout_stream.kafka import KafkaFailure, ProducerFenced, client_for
from tests.stream.helpers import new_topics, read_topic

pytestmark = pytest.mark.client("confluent")


def _raise(error: KafkaError):
    def call(_producer: object) -> None:
        raise KafkaException(error)
    return call


def _transactional(kafka_bootstrap: str, prefix: str):
    """A fresh output topic and a confluent transactional producer with a transaction open."""
    topics = new_topics(kafka_bootstrap, partitions=1, prefix=prefix)
    producer = client_for(Connection(kafka_bootstrap, client="confluent")).producer(
        client_id=prefix, max_record_bytes=1 << 20, transactional_id=f"{prefix}-{uuid.uuid4().hex[:8]}")
    producer.init_transactions()
    producer.begin_transaction()
    return topics, producer


def test_a_fatal_transaction_error_replaces_the_producer_and_reads_as_an_aborted_transaction(kafka_bootstrap):
    """Seen as INVALID_TXN_STATE on ending a transaction while the coordinator's broker died: the producer is
    unusable though no other one owns its id. It is replaced; the caller restores, and the next transaction
    commits. Fencing (a newer producer owns the id) is not replaced: that is a zombie's end."""
    topics, producer = _transactional(kafka_bootstrap, "fatal")
    try:
        producer.send(topics.output, b"lost", b"k", partition=0)
        before = producer._p
        fatal = KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True)
        with pytest.raises(KafkaFailure) as failed:
            producer._transactional("commit_transaction", _raise(fatal))
        assert failed.value.retriable and failed.value.kind == "TransactionFatal"
        assert producer._p is not before
        producer.abort_transaction()  # the replacement aborted the old transaction: nothing left to abort
        producer.begin_transaction()
        producer.send(topics.output, b"kept", b"k", partition=0)
        producer.commit_transaction()
        committed = read_topic(kafka_bootstrap, topics.output, min_count=1, timeout=20)
        assert [r.value for r in committed] == [b"kept"]

        fenced = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)
        current = producer._p
        with pytest.raises(ProducerFenced):
            producer._transactional("commit_transaction", _raise(fenced))
        assert producer._p is current
    finally:
        producer.close(timeout=10)


def test_an_abort_that_meets_a_fatal_error_is_done_by_the_replacement(kafka_bootstrap, monkeypatch):
    """librdkafka#4849: an abort right after a begin and a send can fail with a fatal INVALID_TXN_STATE. The
    producer is replaced, and the replacement's init_transactions() aborts the transaction: the abort did what
    was asked, so it returns, and the next transaction commits without the aborted record."""
    topics, producer = _transactional(kafka_bootstrap, "fatal-abort")
    try:
        producer.send(topics.output, b"aborted", b"k", partition=0)
        before, real = producer._p, producer._transactional
        fatal = KafkaError(KafkaError.INVALID_TXN_STATE, "Failed to end transaction", fatal=True)
        monkeypatch.setattr(producer, "_transactional", lambda what, call: real(
            what, _raise(fatal) if what == "abort_transaction" else call))
        producer.abort_transaction()
        assert producer._p is not before
        monkeypatch.undo()
        producer.begin_transaction()
        producer.send(topics.output, b"kept", b"k", partition=0)
        producer.commit_transaction()
        committed = read_topic(kafka_bootstrap, topics.output, min_count=1, timeout=20, settle=1)
        assert [r.value for r in committed] == [b"kept"]
    finally:
        producer.close(timeout=10)
