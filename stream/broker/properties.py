"""What the local broker runs with: server.properties for a single KRaft node or one node of a local cluster,
and a quiet log4j2 config."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rollout_stream.broker.errors import BadOverride
from rollout_stream.topics import default_replication

__all__ = [
    "ClusterNode",
    "MANAGED_KEYS",
    "MAX_MESSAGE_BYTES",
    "log4j2_properties",
    "new_cluster_id",
    "parse_override",
    "server_properties",
]

MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # rollout samples of 32 MiB must fit, with headroom

# Set from the LocalBroker's own fields; an override would break start, readiness or stop.
MANAGED_KEYS = frozenset({
    "process.roles", "node.id", "controller.quorum.bootstrap.servers", "controller.quorum.voters",
    "listeners", "advertised.listeners", "inter.broker.listener.name", "controller.listener.names",
    "listener.security.protocol.map", "log.dirs", "log.dir",
})  # fmt: skip

# Single node: every internal topic has replication factor 1 (else init_transactions() hangs),
# one partition for the internal topics and no rebalance delay keep start and first use fast. A node of a
# cluster replaces the replication keys (_cluster_defaults) and keeps the others.
_SINGLE_NODE_DEFAULTS: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # A typo in a topic name must be an error naming the topic, not a new one-partition topic; the tools
    # create only the topics they own, and only when asked (the compose broker does the same).
    "auto.create.topics.enable": "false",
    "log.cleaner.dedupe.buffer.size": str(2 * 1024 * 1024),  # default allocates 128 MiB at start
    "message.max.bytes": str(MAX_MESSAGE_BYTES),
    "replica.fetch.max.bytes": str(MAX_MESSAGE_BYTES),
}


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One node of a local multi-node cluster: every node is a broker and one of the controller quorum's
    voters (`voters`: node id → controller port on 127.0.0.1), all formatted with the same `cluster_id`."""

    node_id: int
    cluster_id: str
    voters: Mapping[int, int]

    @property
    def controller_port(self) -> int:
        return self.voters[self.node_id]

    @property
    def quorum_voters(self) -> str:
        return ",".join(f"{node}@127.0.0.1:{port}" for node, port in sorted(self.voters.items()))


def _cluster_defaults(brokers: int) -> dict[str, str]:
    """Internal and new topics replicated as docs/scaling.md says; few internal partitions (fast start) but
    more than one, so group and transaction coordinators live on different brokers and a broker's death
    moves some of them, as in production."""
    replication = default_replication(brokers)
    factor, min_isr = replication.factor, replication.min_insync
    return {
        "offsets.topic.replication.factor": str(factor),
        "offsets.topic.num.partitions": "3",
        "transaction.state.log.replication.factor": str(factor),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": "3",
        "share.coordinator.state.topic.replication.factor": str(factor),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "default.replication.factor": str(factor),
        "min.insync.replicas": str(min_isr),
        "unclean.leader.election.enable": "false",  # a lagging replica never becomes leader: no lost writes
    }


def new_cluster_id() -> str:
    """16 random bytes, URL-safe base64 without padding (22 chars), as `kafka-storage random-uuid` prints."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):  # the format tool would read "-…" as an option
            return cluster_id


def parse_override(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` → (key, value); BadOverride (a ValueError) with a readable message otherwise."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise BadOverride(f"broker property override {text!r} is not KEY=VALUE")
    if key in MANAGED_KEYS:
        raise BadOverride(f"broker property {key} is set by rollout-stream itself (use --port / --data-dir)")
    return key, value.strip()


def server_properties(
    *, port: int, controller_port: int, log_dirs: Path, overrides: Mapping[str, str] | None = None,
    secure: Mapping[str, str] | None = None, cluster: ClusterNode | None = None,
) -> str:
    """A combined broker+controller node on 127.0.0.1 (PLAINTEXT `port`, CONTROLLER `controller_port`).

    `secure`: entries that replace the PLAINTEXT listeners
    (rollout_stream.broker.secure.secure_listener_properties).
    `cluster`: this node is one of several (its id, the static quorum of voters, replicated internal topics)
    instead of a single node with a quorum of one.
    """
    overrides = overrides or {}
    for key in overrides:
        if key in MANAGED_KEYS:
            raise ValueError(f"broker property {key} is set by rollout-stream itself")
    listeners = f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}"
    quorum = (
        {"controller.quorum.voters": cluster.quorum_voters} if cluster is not None
        else {"controller.quorum.bootstrap.servers": f"127.0.0.1:{controller_port}"}
    )
    props: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": str(cluster.node_id if cluster is not None else 1),
        **quorum,
        "listeners": listeners,
        "advertised.listeners": listeners,
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dirs),
        **_SINGLE_NODE_DEFAULTS,
        **(_cluster_defaults(len(cluster.voters)) if cluster is not None else {}),
        **(secure or {}),
        **overrides,
    }
    lines = ["# Written by rollout-stream at every `broker start`; edits are overwritten."]
    lines += [f"{key}={_escape(value)}" for key, value in props.items()]
    return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    """Java .properties escaping for the characters that would change the meaning of a value."""
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def log4j2_properties() -> str:
    """WARN and above to the console, which the launcher redirects to the data dir's broker.log."""
    return "\n".join([
        "status = warn",
        "shutdownHook = disable",  # else "Unable to register Log4j shutdown hook" on every SIGTERM
        "appender.console.type = Console",
        "appender.console.name = STDOUT",
        "appender.console.layout.type = PatternLayout",
        "appender.console.layout.pattern = [%d] %p %m (%c)%n",
        "rootLogger.level = WARN",
        "rootLogger.appenderRef.stdout.ref = STDOUT",
        "",
    ])  # fmt: skip
