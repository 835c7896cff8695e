"""The Kafka seam (`seam`), its errors (`errors`) and the one factory that picks an implementation.

Everything in rollout-stream that talks to Kafka does it through these types; a client library is
imported only inside its implementation package (`rollout_stream.kafka.confluent`,
`rollout_stream.kafka.kafka_python`).

The implementations are plugins chosen by name, here and nowhere else: `client_for` imports the package a
Connection's `client` names when it is first asked for, so choosing confluent-kafka loads no kafka-python
(and the reverse). Two helpers use kafka-python on purpose, whatever the chosen client, and import it only
when called: `check_connection` (one raw Kafka exchange that names what failed) and `ask_admin` (the admin
requests librdkafka lacks). Connections and their security settings (rollout_stream.clients,
rollout_stream.security) import nothing of this package, so the seam imports them at module level.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from rollout_stream.clients import Connection
from rollout_stream.kafka.errors import (
    AuthenticationRefused,
    AuthorizationFailed,
    BrokerUnavailable,
    CommitFailed,
    ConnectionCheckFailed,
    KafkaFailure,
    ListenerMismatch,
    ProducerFenced,
    RecordRefused,
    TlsRefused,
    TopicExists,
    UnknownTopic,
    authorization_cause,
    refusal_cause,
)
from rollout_stream.kafka.seam import (
    AclSpec,
    Admin,
    AssignedConsumer,
    Client,
    Committed,
    GroupConsumer,
    Header,
    Offsets,
    Outgoing,
    OutgoingRecord,
    Polled,
    Producer,
    RebalanceListener,
    Record,
    SendFuture,
    TopicInfo,
    TopicPartition,
    TopicSpec,
    Written,
)

__all__ = [
    "AclSpec", "Admin", "AssignedConsumer", "AuthorizationFailed", "BrokerUnavailable", "Client",
    "CommitFailed", "Committed", "GroupConsumer", "Header", "KafkaFailure", "Offsets", "Outgoing",
    "OutgoingRecord", "Polled", "Producer", "RecordRefused",
    "ProducerFenced", "RebalanceListener", "Record", "SendFuture", "TopicExists", "TopicInfo",
    "TopicPartition", "TopicSpec", "UnknownTopic", "Written", "authorization_cause", "client_for",
    "refusal_cause",
    "ask_admin",
    "AuthenticationRefused", "ConnectionCheckFailed", "ListenerMismatch", "TlsRefused", "check_connection",
]


def check_connection(conn: Connection, timeout_s: float = 10.0) -> None:
    """Return when a bootstrap server accepts this connection's settings up to a Metadata answer (TCP, TLS,
    SASL login); raise BrokerUnreachable or a ConnectionCheckFailed naming what is wrong. One raw Kafka
    exchange, whatever client the commands use afterwards."""
    from rollout_stream.kafka.kafka_python.preflight import check_connection as check

    check(conn, timeout_s)


def client_for(conn: Connection) -> Client:
    """The client implementation a Connection names (`conn.client`): confluent-kafka (librdkafka) or
    kafka-python, its package imported when first chosen (the plugin choice, see above)."""
    if conn.client == "kafka-python":
        from rollout_stream.kafka.kafka_python import KafkaPythonClient

        return KafkaPythonClient(conn)
    from rollout_stream.kafka.confluent import ConfluentClient

    return ConfluentClient(conn)


T = TypeVar("T")


def ask_admin(admin: Admin, conn: Connection, question: Callable[[Admin], T | None]) -> T | None:
    """`question` asked of `admin`; where its client cannot ask (None: librdkafka's admin has no
    DescribeTransactions nor RemoveMembersFromConsumerGroup), of kafka-python's, on the same connection."""
    answer = question(admin)
    if answer is not None or conn.client == "kafka-python":
        return answer
    other = client_for(replace(conn, client="kafka-python")).admin(client_id=conn.client_id)
    try:
        return question(other)
    finally:
        other.close()
