"""kafka-python's exceptions as the seam's (`rollout_stream.kafka.errors`): `translate`, and `_translated`
around a block that calls kafka-python."""

from __future__ import annotations

from types import TracebackType
from typing import Literal, overload

import kafka.errors as ke

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

_AUTH: dict[type[ke.KafkaError], Resource] = {
    ke.TopicAuthorizationFailedError: "topic",
    ke.GroupAuthorizationFailedError: "group",
    ke.TransactionalIdAuthorizationFailedError: "transactional_id",
    ke.ClusterAuthorizationFailedError: "cluster",
}


@overload
def translate(exc: Exception) -> Exception: ...
@overload
def translate(exc: BaseException) -> BaseException: ...
def translate(exc: BaseException) -> BaseException:
    """kafka-python's exception as the seam's (rollout_stream.kafka.errors); anything else unchanged."""
    if isinstance(exc, KafkaFailure) or not isinstance(exc, ke.KafkaError):
        return exc
    kind, text = type(exc).__name__, _text(exc)
    nested = next((a for a in exc.args if isinstance(a, ke.KafkaError)), None)
    if nested is not None and isinstance(nested, (ke.AuthorizationError, ke.ProducerFencedError)):
        # "Cannot perform send because ... failed" wrapping a denial
        exc, kind = nested, type(nested).__name__
    out: KafkaFailure
    if isinstance(exc, ke.AuthorizationError):
        resource: Resource = next((r for cls, r in _AUTH.items() if isinstance(exc, cls)), "unknown")
        out = AuthorizationFailed(text, resource=resource, kind=kind)
    elif isinstance(exc, (ke.ProducerFencedError, ke.InvalidProducerEpochError)):
        out = ProducerFenced(text, kind=kind)
    elif isinstance(exc, (ke.CommitFailedError, ke.RebalanceInProgressError, ke.IllegalGenerationError,
                          ke.UnknownMemberIdError, ke.FencedInstanceIdError)):
        out = CommitFailed(text, kind=kind)
    elif isinstance(exc, (ke.MessageSizeTooLargeError, ke.RecordListTooLargeError, ke.InvalidRecordError,
                          ke.PolicyViolationError, ke.InvalidTopicError)):
        out = RecordRefused(text, kind=kind)
    elif isinstance(exc, ke.TopicAlreadyExistsError):
        out = TopicExists(text, kind=kind)
    elif isinstance(exc, ke.UnknownTopicOrPartitionError):
        out = UnknownTopic(text, kind=kind)
    elif isinstance(exc, (ke.BrokerNotAvailableError, ke.KafkaConnectionError, ke.KafkaTimeoutError,
                          ke.NodeNotReadyError, ke.RequestTimedOutError)):
        out = BrokerUnavailable(text, kind=kind)
    else:
        out = KafkaFailure(text, kind=kind, retriable=bool(getattr(exc, "retriable", False)))
    out.__cause__ = exc
    return out


def _text(exc: BaseException) -> str:
    text = str(exc)
    prefix = f"[Error {getattr(exc, 'errno', '')}] {type(exc).__name__}"
    return text[len(prefix):].lstrip(": ") if text.startswith(prefix) else text


class _Translated:
    """Raise the seam's errors from a block that calls kafka-python."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        if isinstance(exc, ke.KafkaError):
            raise translate(exc) from exc
        return False


_translated = _Translated()
