"""Topic layout: create the stage's topics with limits that let large samples through."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from rollout_stream.clients import MAX_RECORD_BYTES, Connection
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka import Admin, Client, TopicExists, TopicSpec, UnknownTopic, client_for

__all__ = ["TopicSettings", "Replication", "default_replication", "replication_for", "ensure_topics",
           "ensure_changelog", "TopicMismatch", "MissingTopic", "require_topics", "missing_topics",
           "partition_count", "unreplicated_warning"]

log = logging.getLogger("rollout_stream.topics")


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """None for the replication settings: the defaults for the cluster's size (`default_replication`)."""

    partitions: int = 3
    replication_factor: int | None = None
    max_message_bytes: int = MAX_RECORD_BYTES
    dead_letter_retention_ms: int = 90 * 24 * 3600 * 1000
    min_insync_replicas: int | None = None


@dataclass(frozen=True, slots=True)
class Replication:
    """How a topic is replicated: `factor` copies of each partition, and `min_insync` of them that must have
    a write before an acks=all producer (every producer here) is told it is written."""

    factor: int
    min_insync: int

    def configs(self) -> dict[str, str]:
        return {"min.insync.replicas": str(self.min_insync)}


def default_replication(brokers: int) -> Replication:
    """The smaller of 3 and the number of brokers, and one less than that in sync, at least 1: with 3 and 2,
    one broker may be down (or restarting) while every write still reaches two brokers."""
    factor = max(1, min(3, brokers))
    return Replication(factor, max(1, factor - 1))


def replication_for(admin: Admin, factor: int | None = None, min_insync: int | None = None) -> Replication:
    """The replication asked for, each setting not given taken from `default_replication` for this cluster.
    ConfigurationError when the cluster has fewer brokers than replicas, or more in sync than replicas."""
    brokers = admin.broker_count()
    default = default_replication(brokers)
    chosen = Replication(factor or default.factor,
                         min_insync or (default.min_insync if factor is None else max(1, factor - 1)))
    if chosen.factor > brokers:
        raise ConfigurationError(
            f"--replication-factor {chosen.factor} needs {chosen.factor} brokers; the cluster has {brokers}")
    if chosen.min_insync > chosen.factor:
        raise ConfigurationError(f"--min-insync-replicas {chosen.min_insync} is more than the "
                                 f"{chosen.factor} replicas of each partition: no write could ever succeed")
    return chosen


def ensure_topics(
    conn: Connection, *, data_topics: list[str], dead_letter_topics: list[str], settings: TopicSettings
) -> list[str]:
    """Create the topics that are missing; return the names created. Existing topics are left as they are."""
    admin = _admin(conn)
    try:
        existing = admin.list_topics()
        wanted_names = [n for n in dict.fromkeys([*data_topics, *dead_letter_topics]) if n not in existing]
        if not wanted_names:
            return []
        replication = replication_for(admin, settings.replication_factor, settings.min_insync_replicas)
        common = {"max.message.bytes": str(settings.max_message_bytes), **replication.configs()}
        wanted: list[TopicSpec] = []
        for name in dict.fromkeys(data_topics):
            if name not in existing:
                wanted.append(TopicSpec(name, settings.partitions, replication.factor, common))
        for name in dict.fromkeys(dead_letter_topics):
            if name not in existing:
                configs = {**common, "retention.ms": str(settings.dead_letter_retention_ms)}
                wanted.append(TopicSpec(name, settings.partitions, replication.factor, configs))
        created: list[str] = []
        for name, error in admin.create_topics(wanted).items():
            if error is None:
                created.append(name)
            elif not isinstance(error, TopicExists):  # TopicExists: created concurrently by another worker
                raise error
        return created
    finally:
        admin.close()


def _admin(conn: Connection) -> Admin:
    return client_for(conn).admin(client_id=conn.client_id)


class MissingTopic(ConfigurationError, LookupError):
    """A topic a command reads or writes does not exist (the local and compose brokers never auto-create)."""

    def __init__(self, missing: dict[str, str], bootstrap: str, hint: str) -> None:
        self.missing = missing
        names = ", ".join(
            f"{name!r} ({option})" if option else repr(name) for name, option in missing.items()
        )
        plural = "s" if len(missing) > 1 else ""
        verb = "do" if len(missing) > 1 else "does"
        super().__init__(f"topic{plural} {names} {verb} not exist on {bootstrap}: {hint}")


def missing_topics(conn: Connection, topics: list[str], client: Client | None = None) -> list[str]:
    """Topics the broker says do not exist. A topic this client may not even describe is not listed either;
    it is not reported here (its authorization error, with the ACL to grant, comes from where it is used).
    `client`: the seam's client to ask through (default: the one `conn` names)."""
    admin = _admin(conn) if client is None else client.admin(client_id=conn.client_id)
    try:
        existing = admin.list_topics()
        unlisted = [t for t in dict.fromkeys(topics) if t not in existing]
        if not unlisted:
            return []
        return [t.name for t in admin.describe_topics(unlisted) if isinstance(t.error, UnknownTopic)]
    finally:
        admin.close()


def partition_count(conn: Connection, topic: str) -> int | None:
    """The topic's partitions as the cluster describes them (None: it does not say)."""
    admin = _admin(conn)
    try:
        described = admin.describe_topics([topic])
    finally:
        admin.close()
    return described[0].partitions if described else None


def require_topics(
    conn: Connection, topics: dict[str, str], *,
    hint: str = "create it with `rollout-stream topics create` (check the name for a typo)",
) -> None:
    """Raise MissingTopic naming every topic of `topics` (name → the option that named it) that is missing."""
    missing = missing_topics(conn, list(topics))
    if missing:
        raise MissingTopic({name: topics[name] for name in missing}, conn.bootstrap_servers, hint)


class TopicMismatch(ConfigurationError, RuntimeError):
    """An existing topic cannot serve its purpose as it is (e.g. a changelog with the wrong partition
    count)."""


def ensure_changelog(conn: Connection | Client, name: str, partitions: int,
                     replication_factor: int | None = None, min_insync_replicas: int | None = None) -> bool:
    """The compacted changelog of the worker's windows: one partition per input partition (True: created).
    `conn`: where, or the client to create it with (the worker's own, which tests may run in memory).
    Replication as `replication_for` (the changelog is the windows' only copy outside the worker: it is
    replicated as the data is)."""
    admin = _admin(conn) if isinstance(conn, Connection) else conn.admin(client_id="rollout-stream")
    try:
        if name not in admin.list_topics():
            chosen = replication_for(admin, replication_factor, min_insync_replicas)
            error = admin.create_topics([TopicSpec(name, partitions, chosen.factor, {
                "cleanup.policy": "compact", "min.compaction.lag.ms": "60000",
                "max.message.bytes": str(8 * 1024 * 1024), **chosen.configs()})])[name]
            if error is None:
                return True
            if not isinstance(error, TopicExists):
                raise error
        # Created a moment ago by another worker, a topic can be listed before its partitions are: 0 is
        # "not yet" (three workers starting together on the 3-node cluster saw it), not a mismatch.
        deadline = time.monotonic() + 10
        while True:
            described = admin.describe_topics([name])
            have = (described[0].partitions or 0) if described else 0
            if have or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if have != partitions:
            raise TopicMismatch(
                f"changelog topic {name!r} has {have} partitions but the input topic has {partitions}; "
                "delete it (state is rebuilt from the input) or use a new --group-id")
        return False
    finally:
        admin.close()


def unreplicated_warning(conn: Connection | Client, topics: list[str]) -> str | None:
    """What to say when some of `topics` have a single replica on a cluster of several brokers (each of
    those partitions stops, and its unread records are out of reach, while its one broker is down); None
    when all are replicated, or on a single broker, where one replica is all there can be."""
    admin = _admin(conn) if isinstance(conn, Connection) else conn.admin(client_id="rollout-stream")
    try:
        brokers = admin.broker_count()
        if brokers < 2:
            return None
        single = [t.name for t in admin.describe_topics(list(dict.fromkeys(topics)))
                  if t.error is None and t.replication_factor == 1]
    finally:
        admin.close()
    if not single:
        return None
    wanted = default_replication(brokers)
    return (f"{', '.join(map(repr, single))} {'have' if len(single) > 1 else 'has'} replication factor 1 on "
            f"a cluster of {brokers} brokers: a partition stops whenever its one broker is down. Recreate "
            f"{'them' if len(single) > 1 else 'it'} with {wanted.factor} replicas and min.insync.replicas "
            f"{wanted.min_insync} (rollout-stream topics create; docs/scaling.md)")
