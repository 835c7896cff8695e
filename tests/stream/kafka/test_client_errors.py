"""Both clients' failures as the seam's: what the worker decides on (stop, or abort and restore) must not
depend on which client raised it."""

from __future__ import annotations

import kafka.errors as ke
import pytest
from confluent_kafka import KafkaError, KafkaException

from rollout_stream.kafka import (
    AuthorizationFailed,
    BrokerUnavailable,
    KafkaFailure,
    RecordRefused,
    authorization_cause,
    refusal_cause,
)
from rollout_stream.kafka.confluent.errors import translate as from_librdkafka
from rollout_stream.kafka.kafka_python.errors import translate as from_kafka_python


@pytest.mark.parametrize("code", [KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
                                  KafkaError.INVALID_RECORD, KafkaError.POLICY_VIOLATION,
                                  KafkaError.TOPIC_EXCEPTION])
def test_librdkafka_refusals_of_the_records_themselves(code):
    failure = from_librdkafka(KafkaException(KafkaError(code)))
    assert isinstance(failure, RecordRefused) and not failure.retriable


@pytest.mark.parametrize("error", [ke.MessageSizeTooLargeError, ke.RecordListTooLargeError,
                                   ke.InvalidRecordError, ke.PolicyViolationError, ke.InvalidTopicError])
def test_kafka_python_refusals_of_the_records_themselves(error):
    failure = from_kafka_python(error("refused"))
    assert isinstance(failure, RecordRefused) and not failure.retriable


def test_a_refusal_is_found_behind_the_transaction_that_can_only_abort():
    refused = RecordRefused("a 9-byte record is over max.message.bytes=8", kind="MessageSizeTooLargeError")
    wrapper = KafkaFailure("the transaction can only abort", kind="TransactionAbortableError")
    wrapper.__cause__ = refused
    assert refusal_cause(wrapper) is refused and authorization_cause(wrapper) is None


@pytest.mark.parametrize("failure", [
    from_librdkafka(KafkaException(KafkaError(KafkaError._TRANSPORT))),
    from_kafka_python(ke.KafkaConnectionError("gone")),
    from_librdkafka(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))),
    from_kafka_python(ke.TopicAuthorizationFailedError()),
], ids=["librdkafka-away", "kafka-python-away", "librdkafka-acl", "kafka-python-acl"])
def test_a_broker_away_or_a_missing_acl_is_not_a_refusal_of_the_records(failure):
    assert refusal_cause(failure) is None
    assert isinstance(failure, (BrokerUnavailable, AuthorizationFailed))


class _RefusingKafkaConsumer:
    """kafka-python's KafkaConsumer as it behaves for a moment while its only broker is down."""

    def __init__(self) -> None:
        self.polls = 0

    def poll(self, timeout_ms: int, max_records: int | None = None) -> dict:
        self.polls += 1
        raise ke.KafkaConnectionError("KafkaConnectionError: 111 ECONNREFUSED")


def test_a_refused_connection_out_of_kafka_pythons_poll_is_an_empty_poll_that_waits_its_timeout():
    """librdkafka only reports a broker that went away; kafka-python at times raises it out of poll. The
    seam's poll is the same on both: nothing polled, after the timeout (a loop around it does not spin)."""
    import time

    from rollout_stream.kafka.kafka_python.consumer import _Consumer

    raw = _RefusingKafkaConsumer()
    consumer = _Consumer(raw)  # type: ignore[arg-type]
    started = time.monotonic()
    assert consumer.poll(0.2) == {}
    assert time.monotonic() - started >= 0.19 and raw.polls == 1
