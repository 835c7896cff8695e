"""librdkafka's errors as the seam's (`rollout_stream.kafka.errors`): `translate`, `_translated`, and the
error codes that mean a partition's leader or a group's coordinator is moving."""

from __future__ import annotations

from types import TracebackType
from typing import Literal, overload

from confluent_kafka import KafkaError, KafkaException

from rollout_stream.kafka.errors import (
    AuthorizationFailed,
    BrokerUnavailable,
    CommitFailed,
    KafkaFailure,
    ProducerFenced,
    RecordRefused,
    Resource,
    TopicExists,
    UnknownTopic,
)

_AUTH: dict[int, Resource] = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional_id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
}
_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
_COMMIT = {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
           KafkaError.FENCED_INSTANCE_ID, KafkaError._ASSIGNMENT_LOST}
_UNAVAILABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                KafkaError.REQUEST_TIMED_OUT, KafkaError._RESOLVE, KafkaError.NOT_COORDINATOR,
                KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS}
_REFUSED = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD,
            KafkaError.POLICY_VIOLATION, KafkaError.TOPIC_EXCEPTION}
_UNKNOWN_TOPIC = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}


# OFFSET_NOT_AVAILABLE: a new leader answers an offset query so until its high watermark has caught up (a
# worker restoring a partition right after a broker restart on the 3-node cluster stopped on it).
_LEADER_MOVING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                  KafkaError.OFFSET_NOT_AVAILABLE, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT,
                  KafkaError._TRANSPORT}
_COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                       KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TIMED_OUT}


@overload
def translate(exc: Exception | KafkaError) -> Exception: ...
@overload
def translate(exc: BaseException) -> BaseException: ...
def translate(exc: BaseException | KafkaError) -> BaseException:
    """librdkafka's error (a KafkaException, or a KafkaError) as the seam's; anything else unchanged."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if not isinstance(error, KafkaError):
        assert isinstance(exc, BaseException)  # a KafkaError is translated below
        return exc
    code, kind, text = error.code(), error.name(), error.str()
    out: KafkaFailure
    if code in _AUTH:
        out = AuthorizationFailed(text, resource=_AUTH[code], kind=kind)
    elif code in _FENCED:
        out = ProducerFenced(text, kind=kind)
    elif code in _COMMIT:
        out = CommitFailed(text, kind=kind)
    elif code in _REFUSED:
        out = RecordRefused(text, kind=kind)
    elif code == KafkaError.TOPIC_ALREADY_EXISTS:
        out = TopicExists(text, kind=kind)
    elif code in _UNKNOWN_TOPIC:
        out = UnknownTopic(text, kind=kind)
    elif code in _UNAVAILABLE:
        out = BrokerUnavailable(text, kind=kind)
    else:
        out = KafkaFailure(text, kind=kind, retriable=error.retriable())
    if isinstance(exc, BaseException):
        out.__cause__ = exc
    return out


class _Translated:
    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if isinstance(exc, KafkaException):
            raise translate(exc) from exc
        return False


_translated = _Translated()
