"""Admin on the memory cluster: topics, their configs, group offsets; ACLs accepted and never enforced."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rollout_stream.kafka.errors import KafkaFailure, TopicExists
from rollout_stream.kafka.memory._log import BROKER_DEFAULTS, Partition, Topic, unknown_topic
from rollout_stream.kafka.seam import AclSpec, TopicInfo, TopicPartition, TopicSpec

if TYPE_CHECKING:
    from rollout_stream.kafka.memory._cluster import MemoryCluster

__all__ = ["ALL_OPERATIONS", "MemoryAdmin"]

ALL_OPERATIONS = frozenset({"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS",
                            "ALTER_CONFIGS"})


class MemoryAdmin:
    """The seam's Admin."""

    def __init__(self, cluster: MemoryCluster) -> None:
        self._cluster = cluster

    def list_topics(self) -> set[str]:
        with self._cluster.lock:
            return set(self._cluster._log.topics)

    def describe_topics(self, names: Sequence[str], *, authorized_operations: bool = False
                        ) -> list[TopicInfo]:
        with self._cluster.lock:
            counts = {name: self._cluster._log.count(name) for name in names}
        return [TopicInfo(name, n, None, ALL_OPERATIONS if authorized_operations else None, 1) if n
                else TopicInfo(name, None, unknown_topic(f"topic {name!r}")) for name, n in counts.items()]

    def create_topics(self, specs: Sequence[TopicSpec], *, timeout_s: float = 30.0
                      ) -> dict[str, Exception | None]:
        out: dict[str, Exception | None] = {}
        with self._cluster.lock:
            log = self._cluster._log
            for spec in specs:
                if spec.name in log.topics:
                    out[spec.name] = TopicExists(f"topic {spec.name!r} already exists",
                                                 kind="TopicAlreadyExistsError")
                elif spec.partitions < 1:
                    out[spec.name] = KafkaFailure(f"{spec.partitions} partitions for {spec.name!r}",
                                                  kind="InvalidPartitionsError")
                else:
                    log.topics[spec.name] = Topic([Partition() for _ in range(spec.partitions)],
                                                  {**BROKER_DEFAULTS, **spec.configs})
                    self._cluster._groups.rebalance_subscribers(spec.name)
                    out[spec.name] = None
        return out

    def delete_topics(self, names: Sequence[str], *, timeout_s: float = 30.0) -> None:
        """Delete the topics that exist (others are ignored) and the group offsets committed for them."""
        with self._cluster.lock:
            for name in names:
                if self._cluster._log.topics.pop(name, None) is not None:
                    self._cluster._groups.forget_topic(name)
                    self._cluster._groups.rebalance_subscribers(name)

    def topic_configs(self, name: str) -> dict[str, str]:
        with self._cluster.lock:
            topic = self._cluster._log.topics.get(name)
            if topic is None:
                raise unknown_topic(f"topic {name!r}")
            return dict(topic.configs)

    def group_offsets(self, groups: Sequence[str], tps: Sequence[TopicPartition]
                      ) -> dict[str, dict[TopicPartition, tuple[int, str]]]:
        out = {}
        with self._cluster.lock:
            for group_id in groups:
                committed = self._cluster._groups.group(group_id).committed
                found = ((TopicPartition(*tp), committed.get(TopicPartition(*tp))) for tp in tps)
                out[group_id] = {tp: (c.offset, c.metadata) for tp, c in found if c is not None}
        return out

    def broker_count(self) -> int:
        return 1

    def broker_ready(self, port: int) -> bool:
        return True  # its one broker is always up, whatever port a test names

    def create_acls(self, acls: Sequence[AclSpec]) -> list[tuple[AclSpec, Exception]]:
        return []

    # No authorizer: everything is allowed, and operations are not reported (as a broker without one does).
    def may_create_topic(self, name: str) -> bool:
        return True

    def group_operations(self, group: str) -> frozenset[str] | None:
        return None

    def cluster_operations(self) -> frozenset[str] | None:
        return None

    def may_describe_transaction(self, transactional_id: str, budget_s: float = 10.0) -> bool:
        return True

    def remove_static_member(self, group: str, instance_id: str) -> bool:
        return False  # its members are all dynamic: a closed consumer has left already

    def close(self) -> None:
        pass
