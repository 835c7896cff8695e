"""kafka-python's admin client: topics, their configs, group offsets, ACLs (`kafka_acl` maps ours) and
authorized operations."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import kafka.errors as ke
from kafka import KafkaAdminClient
from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    MemberToRemove,
    ResourcePattern,
    ResourceType,
)

from rollout_stream.kafka.errors import AuthorizationFailed, KafkaFailure, UnknownTopic
from rollout_stream.kafka.kafka_python.convert import _ktp
from rollout_stream.kafka.kafka_python.errors import _translated, translate
from rollout_stream.kafka.seam import AclSpec, TopicInfo, TopicPartition, TopicSpec

_RESOURCE_TYPES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                   "transactional-id": ResourceType.TRANSACTIONAL_ID, "cluster": ResourceType.CLUSTER}
_ERROR_CODES = {3: UnknownTopic, 29: AuthorizationFailed}


class _Admin:
    def __init__(self, admin: KafkaAdminClient) -> None:
        self._a = admin

    def list_topics(self) -> set[str]:
        with _translated:
            return set(self._a.list_topics())

    def describe_topics(
        self, names: Sequence[str], *, authorized_operations: bool = False
    ) -> list[TopicInfo]:
        with _translated:
            found = self._a.describe_topics(list(names))
        out = []
        for t in found:
            code = t.get("error_code", 0)
            error: Exception | None = None
            if code:
                cls = _ERROR_CODES.get(code, KafkaFailure)
                error = (AuthorizationFailed(f"topic {t['name']!r}", resource="topic",
                                             kind="TopicAuthorizationFailedError")
                         if cls is AuthorizationFailed
                         else cls(f"topic {t['name']!r}", kind=ke.for_code(code).__name__))
            ops = _operations(t.get("authorized_operations")) if authorized_operations else None
            parts = [] if code else list(t.get("partitions") or ())
            out.append(TopicInfo(t["name"], None if code else len(parts), error, ops,
                                 min((len(p.get("replica_nodes") or ()) for p in parts), default=None),
                                 sum(1 for p in parts if p.get("leader_id", -1) < 0)))
        return out

    def create_topics(
        self, specs: Sequence[TopicSpec], *, timeout_s: float = 30.0
    ) -> dict[str, Exception | None]:
        out: dict[str, Exception | None] = {}
        for spec in specs:  # one by one: one refusal must not hide whether the others were created
            try:
                with _translated:
                    self._a.create_topics({spec.name: {"num_partitions": spec.partitions,
                                                       "replication_factor": spec.replication_factor,
                                                       "configs": dict(spec.configs)}},
                                          timeout_ms=int(timeout_s * 1000), wait_for_metadata=True)
                out[spec.name] = None
            except KafkaFailure as exc:
                out[spec.name] = exc
        return out

    def delete_topics(self, names: Sequence[str], *, timeout_s: float = 30.0) -> None:
        with _translated:
            self._a.delete_topics(list(names), timeout_ms=int(timeout_s * 1000), raise_errors=False)

    def topic_configs(self, name: str) -> dict[str, str]:
        from kafka.admin import ConfigResource, ConfigResourceType

        with _translated:
            found = self._a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)],
                                             config_filter="all")
        # kafka-python 3 answers {"topic": {name: {key: {"value": ...}}}}
        entries = found.get("topic", {}).get(name, {}) if isinstance(found, dict) else {}
        return {k: str(v.get("value") if isinstance(v, dict) else v) for k, v in entries.items()}

    def group_offsets(self, groups: Sequence[str], tps: Sequence[TopicPartition]
                      ) -> dict[str, dict[TopicPartition, tuple[int, str]]]:
        with _translated:
            found = self._a.list_group_offsets({g: [_ktp(tp) for tp in tps] for g in groups})
        return {g: {TopicPartition(*tp): (om.offset, om.metadata or "") for tp, om in found.get(g, {}).items()
                    if om.offset is not None and om.offset >= 0} for g in groups}

    def broker_count(self) -> int:
        with _translated:
            return len(self._a.describe_cluster().get("brokers", ()))

    def broker_ready(self, port: int) -> bool:
        with _translated:
            brokers = self._a.describe_cluster().get("brokers", [])
        return any(b.get("port") == port and not b.get("is_fenced") for b in brokers)

    def create_acls(self, acls: Sequence[AclSpec]) -> list[tuple[AclSpec, Exception]]:
        kacls = [kafka_acl(a) for a in acls]
        with _translated:
            result = self._a.create_acls(kacls)
        failed = []
        for acl, error in result.get("failed", []):
            spec = acls[kacls.index(acl)] if acl in kacls else None
            if spec is not None:
                failed.append((spec, translate(error) if isinstance(error, Exception)
                               else KafkaFailure(str(error))))
        return failed

    def may_create_topic(self, name: str) -> bool:
        with _translated:
            result = self._a.create_topics({name: {"num_partitions": 1, "replication_factor": -1}},
                                           validate_only=True, raise_errors=False)
        codes = [t.get("error_code", 0) for t in result.get("topics", [])]
        return 29 not in codes and 31 not in codes  # TOPIC_ / CLUSTER_AUTHORIZATION_FAILED

    def group_operations(self, group: str) -> frozenset[str] | None:
        try:
            described = self._a.describe_groups([group]).get(group, {})
        except ke.GroupAuthorizationFailedError as exc:
            raise translate(exc) from exc
        except ke.KafkaError:
            return None  # coordinator not available and the like: the consumer will report it
        if described.get("error") and "GROUP_AUTHORIZATION_FAILED" in str(described["error"]):
            raise AuthorizationFailed(
                f"group {group!r}", resource="group", kind="GroupAuthorizationFailedError"
            )
        return _operations(described.get("authorized_operations"))

    def cluster_operations(self) -> frozenset[str] | None:
        with _translated:
            return _operations(self._a.describe_cluster().get("authorized_operations"))

    def may_describe_transaction(self, transactional_id: str, budget_s: float = 10.0) -> bool:
        deadline = time.monotonic() + budget_s
        while True:
            try:
                self._a.describe_transactions([transactional_id])
                return True
            except ke.TransactionalIdAuthorizationFailedError:
                return False
            except ke.TransactionalIdNotFoundError:
                return True  # allowed to describe it; it has just never been used
            except (
                ke.CoordinatorNotAvailableError, ke.CoordinatorLoadInProgressError, ke.NotCoordinatorError
            ):
                if time.monotonic() >= deadline:  # a fresh cluster creates __transaction_state on first use
                    return True
                time.sleep(0.25)

    def remove_static_member(self, group: str, instance_id: str) -> bool:
        with _translated:
            result = self._a.remove_group_members(
                group, [MemberToRemove(group_instance_id=instance_id, reason="stopped for good")]
            )
        error = next(iter(result.values()), ke.NoError)
        if error is ke.UnknownMemberIdError:
            return False
        if error is not ke.NoError:
            raise translate(error(f"removing member {instance_id!r} from group {group!r}"))
        return True

    def close(self) -> None:
        self._a.close()


def _operations(ops: Any) -> frozenset[str] | None:
    if not isinstance(ops, (list, set, frozenset, tuple)):
        return None  # no authorizer, or an old broker: nothing to check
    return frozenset(str(o).upper().rsplit(".", 1)[-1] for o in ops)


def kafka_acl(spec: AclSpec) -> ACL:
    """kafka-python's ACL for one of ours."""
    pattern = ACLResourcePatternType.PREFIXED if spec.prefixed else ACLResourcePatternType.LITERAL
    return ACL(principal=spec.principal, host=spec.host,
               operation=getattr(ACLOperation, _op_name(spec.operation)),
               permission_type=ACLPermissionType.ALLOW,
               resource_pattern=ResourcePattern(_RESOURCE_TYPES[spec.resource], spec.name, pattern))


def _op_name(operation: str) -> str:
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(operation)).upper()
