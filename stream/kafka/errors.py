"""What a Kafka client can fail with, as the rest of the project sees it: one tree, whatever the client.

Each client implementation translates its own exceptions into these (the original is the `__cause__`,
its class name is `kind`), so the worker, the reader and the tools decide on meaning, not on a library's
class names: a fenced producer stops the worker, a missing ACL is named with the permission to grant, a
retriable failure is retried or restored from the last commit.

A KafkaFailure is a RuntimeFailure (exit 1; stream/errors.py): a missing ACL is one too until a caller that
knows what was asked says which (rollout_stream.access `denials_explained`: AccessDenied, exit 2). A
ConnectionCheckFailed is a ConfigurationError (exit 2): the broker answered, the settings are wrong.
"""

from __future__ import annotations

from typing import Literal, TypeVar

from rollout_stream.errors import ConfigurationError, RuntimeFailure

__all__ = [
    "AuthenticationRefused",
    "AuthorizationFailed",
    "BrokerUnavailable",
    "CommitFailed",
    "ConnectionCheckFailed",
    "KafkaFailure",
    "ListenerMismatch",
    "ProducerFenced",
    "RecordRefused",
    "TlsRefused",
    "Resource",
    "TopicExists",
    "UnknownTopic",
    "authorization_cause",
    "refusal_cause",
]

_F = TypeVar("_F", bound=BaseException)
Resource = Literal["topic", "group", "transactional_id", "cluster", "unknown"]


class KafkaFailure(RuntimeFailure, RuntimeError):
    """A Kafka operation failed. `kind`: the client's own name for it; `retriable`: trying again may help."""

    retriable: bool = False

    def __init__(self, message: str, *, kind: str = "", retriable: bool | None = None) -> None:
        super().__init__(message)
        self.kind = kind or type(self).__name__
        if retriable is not None:
            self.retriable = retriable

    def __str__(self) -> str:
        return f"{self.kind}: {self.args[0]}" if self.args and self.args[0] else self.kind


class BrokerUnavailable(KafkaFailure):
    """No broker answered (connection refused, timeout, no leader): the clients retry with backoff."""

    retriable = True


class AuthorizationFailed(KafkaFailure):
    """The broker refused an operation for lack of an ACL on `resource`; retrying cannot help."""

    def __init__(self, message: str, *, resource: Resource = "unknown", kind: str = "") -> None:
        super().__init__(message, kind=kind, retriable=False)
        self.resource: Resource = resource


class ProducerFenced(KafkaFailure):
    """A newer producer with the same transactional id took over: this one must stop."""


class CommitFailed(KafkaFailure):
    """An offset commit was refused because the group rebalanced (the partitions may have moved)."""


class RecordRefused(KafkaFailure):
    """The records themselves are refused (too large, invalid, against a topic's policy): sending them again
    is refused again."""


class TopicExists(KafkaFailure):
    """Creating a topic that already exists."""


class UnknownTopic(KafkaFailure):
    """The topic or partition does not exist (or is not visible yet)."""


class ConnectionCheckFailed(ConfigurationError, ConnectionError):
    """The broker answered but cannot be used as configured; the message says why and what to do."""


class TlsRefused(ConnectionCheckFailed):
    """TLS failed: untrusted, expired or misnamed broker certificate, or our client certificate refused."""


class AuthenticationRefused(ConnectionCheckFailed):
    """SASL login refused (user, password, token or mechanism)."""


class ListenerMismatch(ConnectionCheckFailed):
    """The listener speaks another security protocol than the one configured."""


def _behind(exc: BaseException | None, kind: type[_F]) -> _F | None:
    """The `kind` of failure behind `exc`, also where it is wrapped (a cause, or an argument)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, kind):
            return exc
        nested = next((a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)), None)
        exc = nested or exc.__cause__ or exc.__context__
    return None


def authorization_cause(exc: BaseException | None) -> AuthorizationFailed | None:
    """The authorization failure behind `exc` (a transaction that can only abort wraps the refused ACL)."""
    return _behind(exc, AuthorizationFailed)


def refusal_cause(exc: BaseException | None) -> RecordRefused | None:
    """The refusal of the records themselves behind `exc`."""
    return _behind(exc, RecordRefused)
