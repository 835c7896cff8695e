"""The seam's admin answers the same on every client (real broker)."""

from __future__ import annotations

import uuid

import pytest

from rollout_stream.clients import Connection
from rollout_stream.kafka import TopicSpec, client_for
from rollout_stream.topics import TopicMismatch, ensure_changelog


def test_topic_configs_are_the_topics_own_on_every_client(kafka_bootstrap, kafka_client):
    admin = client_for(Connection(kafka_bootstrap)).admin()
    name = f"admin-{uuid.uuid4().hex[:10]}"
    try:
        set_here = {"cleanup.policy": "compact", "retention.ms": "3600000"}
        admin.create_topics([TopicSpec(name, 1, configs=set_here)])
        configs = admin.topic_configs(name)
        # kafka-python 3 answers in another shape than 2.x: the seam once returned {} for every topic
        assert configs["cleanup.policy"] == "compact" and configs["retention.ms"] == "3600000"
        assert configs["min.insync.replicas"]  # defaults come too, not only what was set
        admin.delete_topics([name])
    finally:
        admin.close()


def test_the_changelog_is_created_once_and_a_wrong_partition_count_is_refused(kafka_bootstrap, kafka_client):
    conn = Connection(kafka_bootstrap)
    name = f"changelog-{uuid.uuid4().hex[:10]}"
    assert ensure_changelog(conn, name, 3) is True
    assert ensure_changelog(conn, name, 3) is False  # right after its creation: found, not a mismatch
    with pytest.raises(TopicMismatch, match="has 3 partitions but the input topic has 4"):
        ensure_changelog(conn, name, 4)
    client_for(conn).admin().delete_topics([name])
