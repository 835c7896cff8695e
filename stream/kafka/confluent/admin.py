"""librdkafka's admin client: topics, their configs, group offsets, ACLs and authorized operations."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException

# confluent_kafka.admin imports these without re-exporting them (no __all__): mypy sees them as private.
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from rollout_stream.kafka.confluent.convert import _rd
from rollout_stream.kafka.confluent.errors import _translated, translate
from rollout_stream.kafka.confluent.settings import TIMEOUT_S
from rollout_stream.kafka.errors import AuthorizationFailed
from rollout_stream.kafka.seam import AclSpec, TopicInfo, TopicPartition, TopicSpec

_RESOURCE_TYPES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                   "transactional-id": ResourceType.TRANSACTIONAL_ID, "cluster": ResourceType.BROKER}
_OPERATIONS = {"Read": AclOperation.READ, "Write": AclOperation.WRITE, "Describe": AclOperation.DESCRIBE,
               "Create": AclOperation.CREATE, "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE}


def _ops(found: Any) -> frozenset[str] | None:
    if found is None:
        return None
    return frozenset(op.name for op in found)


class _Admin:
    def __init__(self, admin: AdminClient, settings: dict[str, Any]) -> None:
        self._a, self._settings = admin, settings

    def _result(self, future: Any) -> Any:
        with _translated:
            return future.result(TIMEOUT_S)

    def list_topics(self) -> set[str]:
        with _translated:
            return set(self._a.list_topics(timeout=TIMEOUT_S).topics)

    def describe_topics(
        self, names: Sequence[str], *, authorized_operations: bool = False
    ) -> list[TopicInfo]:
        from confluent_kafka import TopicCollection

        futures = self._a.describe_topics(TopicCollection(list(names)),
                                          include_authorized_operations=authorized_operations,
                                          request_timeout=TIMEOUT_S)
        out = []
        for name in names:
            try:
                desc = futures[name].result(TIMEOUT_S)
            except KafkaException as exc:
                out.append(TopicInfo(name, None, translate(exc)))
                continue
            out.append(TopicInfo(name, len(desc.partitions), None,
                                 _ops(desc.authorized_operations) if authorized_operations else None,
                                 min((len(p.replicas) for p in desc.partitions), default=None),
                                 sum(1 for p in desc.partitions if p.leader is None or p.leader.id < 0)))
        return out

    def create_topics(
        self, specs: Sequence[TopicSpec], *, timeout_s: float = 30.0
    ) -> dict[str, Exception | None]:
        if not specs:
            return {}
        futures = self._a.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.configs)) for s in specs],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        out: dict[str, Exception | None] = {}
        for name, future in futures.items():
            try:
                future.result(timeout_s)
                out[name] = None
            except KafkaException as exc:
                out[name] = translate(exc)
        for name in out:
            if out[name] is None:
                self._wait_for_leaders(name, timeout_s)
        return out

    def _wait_for_leaders(self, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            topic = self._a.list_topics(name, timeout=TIMEOUT_S).topics.get(name)
            if topic is not None and topic.error is None and topic.partitions and \
                    all(p.leader >= 0 for p in topic.partitions.values()):
                return
            time.sleep(0.05)

    def delete_topics(self, names: Sequence[str], *, timeout_s: float = 30.0) -> None:
        if not names:
            return
        for future in self._a.delete_topics(list(names), operation_timeout=timeout_s).values():
            try:
                future.result(timeout_s)
            except KafkaException:
                pass  # as kafka-python's raise_errors=False: best effort

    def topic_configs(self, name: str) -> dict[str, str]:
        futures = self._a.describe_configs([ConfigResource(ResourceType.TOPIC, name)])
        out: dict[str, str] = {}
        for future in futures.values():
            for key, entry in self._result(future).items():
                out[key] = str(entry.value)
        return out

    def group_offsets(self, groups: Sequence[str], tps: Sequence[TopicPartition]
                      ) -> dict[str, dict[TopicPartition, tuple[int, str]]]:
        # Read by a consumer of the group that never joins it, not by the admin API: librdkafka 2.16's
        # ListConsumerGroupOffsets handles some OffsetFetch errors (a coordinator loading or moving) as a
        # consumer does, through the client's consumer group, which an admin client does not have: the
        # process segfaults (rd_kafka_cgrp_op from rd_kafka_handle_OffsetFetch, seen in a core dump).
        from confluent_kafka import Consumer

        out: dict[str, dict[TopicPartition, tuple[int, str]]] = {}
        for group in groups:
            with _translated:
                consumer = Consumer({**self._settings, "group.id": group, "enable.auto.commit": False})
                try:
                    found = consumer.committed([_rd(tp) for tp in tps], timeout=TIMEOUT_S)
                finally:
                    consumer.close()
            out[group] = {TopicPartition(tp.topic, tp.partition): (tp.offset, tp.metadata or "")
                          for tp in found if tp.offset >= 0}
        return out

    def _cluster(self, authorized_operations: bool = False) -> Any:
        return self._result(self._a.describe_cluster(include_authorized_operations=authorized_operations,
                                                     request_timeout=TIMEOUT_S))

    def broker_count(self) -> int:
        return len(self._cluster().nodes)

    def broker_ready(self, port: int) -> bool:
        return any(node.port == port for node in self._cluster().nodes)

    def create_acls(self, acls: Sequence[AclSpec]) -> list[tuple[AclSpec, Exception]]:
        bindings = [
            AclBinding(
                _RESOURCE_TYPES[a.resource],
                "kafka-cluster" if a.resource == "cluster" else a.name,
                ResourcePatternType.PREFIXED if a.prefixed else ResourcePatternType.LITERAL,
                a.principal,
                a.host,
                _OPERATIONS[a.operation],
                AclPermissionType.ALLOW,
            )
            for a in acls
        ]
        failed = []
        for spec, binding in zip(acls, bindings, strict=True):
            try:
                self._a.create_acls([binding])[binding].result(TIMEOUT_S)
            except KafkaException as exc:
                failed.append((spec, translate(exc)))
        return failed

    def may_create_topic(self, name: str) -> bool:
        futures = self._a.create_topics(
            [NewTopic(name, 1, -1)], validate_only=True, request_timeout=TIMEOUT_S
        )
        try:
            futures[name].result(TIMEOUT_S)
        except KafkaException as exc:
            return exc.args[0].code() not in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                              KafkaError.CLUSTER_AUTHORIZATION_FAILED)
        return True

    def group_operations(self, group: str) -> frozenset[str] | None:
        futures = self._a.describe_consumer_groups([group], include_authorized_operations=True,
                                                   request_timeout=TIMEOUT_S)
        try:
            desc = futures[group].result(TIMEOUT_S)
        except KafkaException as exc:
            failure = translate(exc)
            if isinstance(failure, AuthorizationFailed):
                raise failure from exc
            return None
        return _ops(desc.authorized_operations)

    def cluster_operations(self) -> frozenset[str] | None:
        return _ops(self._cluster(authorized_operations=True).authorized_operations)

    def may_describe_transaction(self, transactional_id: str, budget_s: float = 10.0) -> bool | None:
        return None  # confluent-kafka's admin has no DescribeTransactions

    def remove_static_member(self, group: str, instance_id: str) -> bool | None:
        return None  # nor RemoveMembersFromConsumerGroup

    def close(self) -> None:
        """The admin client has no connection to close explicitly."""
