"""Exactly what rollout-stream needs from a Kafka client, and nothing more: the seam every module talks to.

Three kinds of clients, each a Protocol below, built by a `Client` (one per implementation):

* `GroupConsumer`: a member of a consumer group (the worker, the bench passthrough). Rebalance callbacks
  run while the loop is inside `poll()`, never concurrently with the loop's own code; offsets committed
  from `on_revoked` are committed before the partitions move.
* `AssignedConsumer`: partitions assigned by hand, no group (the reader, restore, dead-letter tools).
* `Producer`: idempotent, optionally transactional (`send_offsets_to_transaction` ties input offsets to
  the outputs, KIP-447); a send the client already knows failed raises at once.
* `Admin`: topics, consumer-group offsets, ACLs.

Offsets are plain ints (the next record to read). Records are whatever the client returns, read through
the `Record` protocol (no per-record conversion on the hot path). Every failure is a
`rollout_stream.kafka.errors.KafkaFailure`. Implementations: `rollout_stream.kafka.kafka_python` (the
design's client),
`rollout_stream.kafka.memory` (tests only: partitions, groups, transactions in one process).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = [
    "AclSpec",
    "Admin",
    "AssignedConsumer",
    "Client",
    "Committed",
    "GroupConsumer",
    "Header",
    "Offsets",
    "Outgoing",
    "OutgoingRecord",
    "Polled",
    "Producer",
    "RebalanceListener",
    "Record",
    "SendFuture",
    "TopicInfo",
    "TopicPartition",
    "TopicSpec",
    "Written",
    "heartbeat_interval_ms",
]

Header = tuple[str, bytes]


def heartbeat_interval_ms(session_timeout_s: float) -> int:
    """The Java client's 3 s, or a third of a shorter session: members learn of a rebalance at their next
    heartbeat, and a third of the 45 s session (what both clients had) made a scale-out wait up to 15 s."""
    return max(100, min(3000, int(session_timeout_s * 1000 / 3)))


class TopicPartition(NamedTuple):
    """Equal to (and hashed as) the tuple (topic, partition), so it finds a client's own partition keys."""

    topic: str
    partition: int


class Committed(NamedTuple):
    """A committed position: the next offset to read, and the metadata committed with it."""

    offset: int
    metadata: str = ""


Offsets = Mapping[TopicPartition, "int | Committed"]


@runtime_checkable
class Record(Protocol):
    """A consumed record (read-only view of the client's own record object)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...  # ms since the epoch (CreateTime unless the topic says LogAppendTime)
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[Header] | None: ...


Polled = Mapping[TopicPartition, Sequence[Record]]


class Outgoing(Protocol):
    """A record to send (the stage's `OutputRecord` is one)."""

    @property
    def topic(self) -> str: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[Header]: ...
    @property
    def partition(self) -> int | None: ...  # None: the producer's partitioner picks it from the key


class OutgoingRecord(NamedTuple):
    """A plain `Outgoing`, for callers without a record type of their own (the bench's load, tests)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    partition: int | None = None


class Written(NamedTuple):
    """Where an acknowledged record was written."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None  # as stored (LogAppendTime: the broker's); None: the client does not say


class SendFuture(Protocol):
    """The outcome of one send, known once the producer flushed it."""

    def done(self) -> bool: ...

    def exception(self) -> BaseException | None:
        """The KafkaFailure that failed the send, or None (also while not done)."""
        ...

    def get(self, timeout: float | None = None) -> Written:
        """Wait for the acknowledgement (up to `timeout` s); where the record was written, or raise why
        not."""
        ...


class RebalanceListener(Protocol):
    """Told about partitions of the subscribed topic, by partition number (one topic per subscription)."""

    def on_assigned(self, partitions: set[int]) -> None: ...
    def on_revoked(self, partitions: set[int]) -> None: ...
    def on_lost(self, partitions: set[int]) -> None: ...


class _Consuming(Protocol):
    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled: ...
    def pause(self, partitions: Iterable[TopicPartition]) -> None: ...
    def resume(self, partitions: Iterable[TopicPartition]) -> None: ...
    def seek(self, tp: TopicPartition, offset: int) -> None: ...
    def position(self, tp: TopicPartition) -> int:
        """The next offset to fetch (asks the broker if not known yet)."""
        ...
    def fetch_position(self, tp: TopicPartition) -> int:
        """The next offset to fetch as the client knows it now, without a network call; -1 if unknown. Unlike
        the last record's offset + 1 it also moves past transaction markers."""
        ...
    def highwater(self, tp: TopicPartition) -> int | None:
        """The last high watermark (read_committed: last stable offset) the client saw; no network call."""
        ...
    def backlog(self) -> int:
        """Records known to the client and not returned yet, over its unpaused partitions (no network
        call)."""
        ...
    def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...
    def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]: ...
    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        """Per partition, the first offset whose timestamp is at least the one given (None: no such
        record)."""
        ...
    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The topic's partitions, or None when the topic is unknown to the cluster."""
        ...
    def committed(self, tp: TopicPartition) -> Committed | None:
        """This consumer's group's commit for `tp` (None: no commit, or no group)."""
        ...
    def commit(self, offsets: Offsets) -> None:
        """Commit synchronously for this consumer's group; in a GroupConsumer also valid inside `on_revoked`
        (committed before the partitions move)."""
        ...
    def group_metadata(self) -> Any:
        """What `Producer.send_offsets_to_transaction` needs to commit for this consumer's group (and, for a
        group member, to fence a zombie of it: KIP-447)."""
        ...
    def close(self) -> None: ...


class GroupConsumer(_Consuming, Protocol):
    def subscribe(self, topic: str, listener: RebalanceListener) -> None: ...
    def assignment(self) -> set[TopicPartition]: ...
    def connection_count(self) -> int | None:
        """Open broker connections, or None when the client cannot tell (say nothing rather than guess)."""
        ...


class AssignedConsumer(_Consuming, Protocol):
    def assign(self, tps: Sequence[TopicPartition]) -> None:
        """Assign `tps` (replacing what was assigned), none of them paused."""
        ...
    def assign_at(self, tp: TopicPartition, offset: int) -> None:
        """Assign `tp` alone, its first fetch at `offset` (no record before it is fetched first)."""
        ...
    def assign_from(self, positions: Mapping[TopicPartition, int]) -> None:
        """Assign these partitions (replacing what was assigned), each one's first fetch at its offset; none
        of them paused."""
        ...
    def seek_to_beginning(self, tps: Sequence[TopicPartition]) -> None: ...
    def seek_to_end(self, tps: Sequence[TopicPartition]) -> None: ...


class Producer(Protocol):
    def send(self, topic: str, value: bytes | None, key: bytes | None = None, *, partition: int | None = None,
             headers: Sequence[Header] | None = None, timestamp_ms: int | None = None) -> SendFuture:
        """Queue a record. Raises the KafkaFailure at once when the client already knows the send failed."""
        ...
    def send_in_transaction(self, topic: str, value: bytes | None, key: bytes | None = None, *,
                            partition: int | None = None, headers: Sequence[Header] | None = None) -> None:
        """Queue a record of the open transaction, with no report of its own: its fate is the transaction's
        (`commit_transaction` raises when any of its records failed). Raises at once what `send` would."""
        ...
    def send_all_in_transaction(self, records: Sequence[Outgoing]) -> None:
        """`send_in_transaction` of each record, in order, in one call (a prompt group's outputs). When it
        raises, the records before the refused one are queued in the transaction."""
        ...
    def partitions_for(self, topic: str) -> list[int] | None: ...
    def partition_for(self, topic: str, key: bytes) -> int | None:
        """The partition to name in the sends of `key`'s records: the one Java's murmur2 rule gives it. None
        leaves it to the producer's own partitioner, which follows the same rule: a client that hashes in C
        says None (naming it would cost a Python hash), as does any client when the topic's partitions are
        unknown (the send then fails as a send to an unknown topic does)."""
        ...
    def flush(self, timeout: float | None = None) -> None: ...
    def close(self, timeout: float | None = None) -> None: ...
    # transactional producers only
    def init_transactions(self) -> None: ...
    def begin_transaction(self) -> None: ...
    def send_offsets_to_transaction(self, offsets: Offsets, group_metadata: Any) -> None: ...
    def commit_transaction(self) -> None: ...
    def abort_transaction(self) -> None: ...


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int = -1  # -1: the broker's default
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """What the cluster says of a topic this client asked about."""

    name: str
    partitions: int | None  # None when it does not exist or may not be described
    error: Exception | None = None  # UnknownTopic, AuthorizationFailed, ...
    authorized_operations: frozenset[str] | None = None  # KIP-430 (upper case: READ, WRITE, ...), if asked
    replication_factor: int | None = None  # the fewest replicas of any of its partitions
    leaderless: int = 0  # partitions without a leader now (a broker down and no in-sync replica to elect)


@dataclass(frozen=True, slots=True)
class AclSpec:
    """One ALLOW ACL: principal may do `operation` on a resource (a prefix of names when `prefixed`)."""

    principal: str
    resource: str  # topic | group | transactional-id | cluster
    name: str
    operation: str  # Read | Write | Describe | Create | IdempotentWrite | ...
    prefixed: bool = False
    host: str = "*"


class Admin(Protocol):
    def list_topics(self) -> set[str]: ...
    def describe_topics(
        self, names: Sequence[str], *, authorized_operations: bool = False
    ) -> list[TopicInfo]: ...
    def create_topics(
        self, specs: Sequence[TopicSpec], *, timeout_s: float = 30.0
    ) -> dict[str, Exception | None]:
        """Create each topic; the failure per name (TopicExists when it was there already), None if
        created."""
        ...
    def delete_topics(self, names: Sequence[str], *, timeout_s: float = 30.0) -> None: ...
    def topic_configs(self, name: str) -> dict[str, str]: ...
    def group_offsets(self, groups: Sequence[str], tps: Sequence[TopicPartition]
                      ) -> dict[str, dict[TopicPartition, tuple[int, str]]]:
        """Committed (offset, metadata) per group and partition; partitions without a commit are absent."""
        ...
    def broker_count(self) -> int: ...
    def broker_ready(self, port: int) -> bool:
        """The cluster lists a broker on `port`, unfenced (a freshly started broker clients can use now)."""
        ...
    def create_acls(self, acls: Sequence[AclSpec]) -> list[tuple[AclSpec, Exception]]:
        """Create the ACLs; returns the ones the broker refused, each with why."""
        ...
    # What this client's principal may do (KIP-430 authorized operations), asked before acting:
    def may_create_topic(self, name: str) -> bool: ...
    def group_operations(self, group: str) -> frozenset[str] | None:
        """Operations allowed on the group (upper case); AuthorizationFailed when not even Describe; None when
        the broker does not say (no authorizer, old broker, coordinator unavailable)."""
        ...
    def cluster_operations(self) -> frozenset[str] | None: ...
    def may_describe_transaction(self, transactional_id: str, budget_s: float = 10.0) -> bool | None:
        """False only when the broker refuses to describe the id (a fresh cluster's missing transaction log
        or an unused id count as allowed: the producer reports a refusal itself); None when this client
        cannot ask."""
        ...
    def remove_static_member(self, group: str, instance_id: str) -> bool | None:
        """Take the static member `instance_id` out of `group` now, as its session timeout would later
        (KIP-345 RemoveMembersFromConsumerGroup): the others rebalance at once. False when the group has no
        such member; None when this client cannot ask."""
        ...
    def close(self) -> None: ...


class Client(Protocol):
    """Builds one implementation's clients from the project's settings (rollout_stream.clients.Connection)."""

    name: str

    def group_consumer(self, group_id: str, *, client_id: str, max_record_bytes: int,
                       session_timeout_s: float = 45.0, instance_id: str | None = None,
                       isolation: str = "read_committed", **tuning: Any) -> GroupConsumer: ...
    def assigned_consumer(self, *, client_id: str, max_record_bytes: int, isolation: str = "read_committed",
                          commit_group: str | None = None, **tuning: Any) -> AssignedConsumer:
        """`commit_group`: the group whose offsets `committed`/`commit` read and write (never joined)."""
        ...
    def producer(self, *, client_id: str, max_record_bytes: int, transactional_id: str | None = None,
                 transaction_timeout_s: float = 60.0, **tuning: Any) -> Producer: ...
    def admin(self, *, client_id: str) -> Admin: ...
