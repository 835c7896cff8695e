"""Replication defaults (docs/spec.md §4.7) and a cluster node's configuration, without a broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_stream.broker.properties import ClusterNode, server_properties
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.topics import Replication, default_replication, ensure_changelog, replication_for


@pytest.mark.parametrize(("brokers", "factor", "in_sync"), [(1, 1, 1), (2, 2, 1), (3, 3, 2), (5, 3, 2)])
def test_defaults_are_the_smaller_of_3_and_the_brokers_and_one_less_in_sync(brokers, factor, in_sync):
    assert default_replication(brokers) == Replication(factor, in_sync)


class _Brokers:
    def __init__(self, count: int) -> None:
        self.count = count

    def broker_count(self) -> int:
        return self.count


def test_what_is_asked_for_wins_and_impossible_settings_are_refused():
    assert replication_for(_Brokers(3)) == Replication(3, 2)  # type: ignore[arg-type]
    assert replication_for(_Brokers(3), 2) == Replication(2, 1)  # type: ignore[arg-type]
    assert replication_for(_Brokers(3), None, 1) == Replication(3, 1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="needs 3 brokers; the cluster has 1"):
        replication_for(_Brokers(1), 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="more than the 2 replicas"):
        replication_for(_Brokers(3), 2, 3)  # type: ignore[arg-type]


def test_the_changelog_gets_min_insync_replicas_of_the_cluster():
    cluster = MemoryCluster()
    client = cluster.client()
    assert ensure_changelog(client, "g-in-windows-changelog", 2)
    admin = client.admin()
    assert admin.topic_configs("g-in-windows-changelog")["min.insync.replicas"] == "1"  # one memory broker
    [info] = admin.describe_topics(["g-in-windows-changelog"])
    assert (info.partitions, info.replication_factor, info.leaderless) == (2, 1, 0)


def test_a_cluster_node_lists_every_voter_and_replicates_the_internal_topics():
    node = ClusterNode(2, "abcdefghijklmnopqrstuv", {1: 7001, 2: 7002, 3: 7003})
    text = server_properties(port=9093, controller_port=node.controller_port, log_dirs=Path("/data"),
                             cluster=node)
    props = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:7001,2@127.0.0.1:7002,3@127.0.0.1:7003"
    assert "controller.quorum.bootstrap.servers" not in props
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9093,CONTROLLER://127.0.0.1:7002"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "default.replication.factor"):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"
    single = server_properties(port=9092, controller_port=9999, log_dirs=Path("/data"))
    assert "transaction.state.log.replication.factor=1" in single and "node.id=1" in single
