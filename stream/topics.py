"""Topic layout: create the stage's topics with limits that let large samples through."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from stream.clients import MAX_RECORD_BYTES, Connection
from stream.errors import ConfigurationError
from stream.kafka import Admin, Client, TopicExists, TopicSpec, UnknownTopic, client_for

__all__ = ["TopicSettings", "ensure_topics", "ensure_changelog", "TopicMismatch", "MissingTopic",
           "require_topics", "missing_topics"]

log = logging.getLogger("rollout_stream.topics")


@dataclass(frozen=True, slots=True)
class TopicSettings:
    partitions: int = 3
    replication_factor: int = 1
    max_message_bytes: int = MAX_RECORD_BYTES
    dead_letter_retention_ms: int = 90 * 24 * 3600 * 1000


def ensure_topics(
    conn: Connection, *, data_topics: list[str], dead_letter_topics: list[str], settings: TopicSettings
) -> list[str]:
    """Create the topics that are missing; return the names created. Existing topics are left as they are."""
    admin = _admin(conn)
    try:
        existing = admin.list_topics()
        common = {"max.message.bytes": str(settings.max_message_bytes)}
        wanted: list[TopicSpec] = []
        for name in dict.fromkeys(data_topics):
            if name not in existing:
                wanted.append(TopicSpec(name, settings.partitions, settings.replication_factor, common))
        for name in dict.fromkeys(dead_letter_topics):
            if name not in existing:
                configs = {**common, "retention.ms": str(settings.dead_letter_retention_ms)}
                wanted.append(TopicSpec(name, settings.partitions, settings.replication_factor, configs))
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


def missing_topics(conn: Connection, topics: list[str]) -> list[str]:
    """Topics the broker says do not exist. A topic this client may not even describe is not listed either;
    it is not reported here (its authorization error, with the ACL to grant, comes from where it is used)."""
    admin = _admin(conn)
    try:
        existing = admin.list_topics()
        unlisted = [t for t in dict.fromkeys(topics) if t not in existing]
        if not unlisted:
            return []
        return [t.name for t in admin.describe_topics(unlisted) if isinstance(t.error, UnknownTopic)]
    finally:
        admin.close()


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


def ensure_changelog(conn: Connection | Client, name: str, partitions: int) -> bool:
    """The compacted changelog of the worker's windows: one partition per input partition (True: created).
    `conn`: where, or the client to create it with (the worker's own, which tests may run in memory)."""
    admin = _admin(conn) if isinstance(conn, Connection) else conn.admin(client_id="rollout-stream")
    try:
        if name not in admin.list_topics():
            error = admin.create_topics([TopicSpec(name, partitions, 1, {
                "cleanup.policy": "compact", "min.compaction.lag.ms": "60000",
                "max.message.bytes": str(8 * 1024 * 1024)})])[name]
            if error is None:
                return True
            if not isinstance(error, TopicExists):
                raise error
        described = admin.describe_topics([name])
        have = (described[0].partitions or 0) if described else 0
        if have != partitions:
            raise TopicMismatch(
                f"changelog topic {name!r} has {have} partitions but the input topic has {partitions}; "
                "delete it (state is rebuilt from the input) or use a new --group-id")
        return False
    finally:
        admin.close()
