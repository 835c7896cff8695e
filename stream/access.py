"""Asking the broker what a principal may do, and saying in one line what it may not.

* `missing_permissions`: the permissions of a list (stream.acls) this connection lacks, from the broker's
  authorized operations (KIP-430), asked before the worker reads or writes anything (`check_worker_access`).
* `explain_denial`: an authorization error met while running, as one line that names the permission.
* `apply_permissions`: create the ACLs of a list through the admin API.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from typing import Any

from kafka.errors import (
    AuthorizationError,
    ClusterAuthorizationFailedError,
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    GroupAuthorizationFailedError,
    KafkaError,
    NotCoordinatorError,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailedError,
    TransactionalIdNotFoundError,
)

from stream.acls import Permission, worker_permissions
from stream.names import transactional_id, transactional_id_prefix
from stream.clients import Connection, make_admin
from stream.config import WorkerConfig

__all__ = [
    "AccessDenied",
    "AclsNotApplied",
    "apply_permissions",
    "authorization_cause",
    "check_worker_access",
    "describe_missing",
    "explain_denial",
    "missing_permissions",
]

_IMPLIES_DESCRIBE = {"READ", "WRITE", "DELETE", "ALTER", "DESCRIBE"}


# -- applying and checking -----------------------------------------------------------------------------------
class AclsNotApplied(RuntimeError):
    """The broker refused to create some of the ACLs."""


def apply_permissions(conn: Connection, principal: str, permissions: Iterable[Permission]) -> int:
    """Create the ACLs (as `conn`, which needs ALTER on the cluster). Returns how many were sent."""
    acls = [p.acl(principal) for p in permissions]
    admin = make_admin(conn)
    try:
        result = admin.create_acls(acls)
    finally:
        admin.close()
    failed = result.get("failed", [])
    if failed:
        raise AclsNotApplied(
            f"the broker refused {len(failed)} of {len(acls)} ACLs: "
            + "; ".join(f"{type(e).__name__ if isinstance(e, BaseException) else e}" for e in failed)
        )
    return len(acls)


def missing_permissions(
    conn: Connection, permissions: list[Permission], *, transactional_ids: dict[str, str] | None = None
) -> list[Permission]:
    """The permissions this connection's principal lacks, asked of the broker (KIP-430 authorized operations).

    A topic that does not exist counts as missing unless the principal may create it. A transactional id
    is checked by describing it (`transactional_ids` maps a prefix to the concrete id to try); only Describe
    can be verified that way, a missing Write still shows at the producer's first transaction, before
    anything is written. Without an authorizer on the broker nothing is missing.
    """
    missing: list[Permission] = []
    admin = make_admin(conn)
    try:
        topics = list(dict.fromkeys(p.name for p in permissions if p.resource == "topic"))
        if topics:
            missing += _missing_on_topics(admin, topics, permissions)
        for group in dict.fromkeys(p.name for p in permissions if p.resource == "group" and not p.prefixed):
            missing += _missing_on_group(
                admin, group, [p for p in permissions if p.name == group and p.resource == "group"]
            )
        for p in permissions:
            if p.resource == "transactional-id" and not _may_describe_transaction(
                admin, (transactional_ids or {}).get(p.name, p.name)
            ):
                missing.append(p)
        cluster_ops = [p for p in permissions if p.resource == "cluster"]
        if cluster_ops:
            ops = admin.describe_cluster().get("authorized_operations")
            if isinstance(ops, list):
                missing += [p for p in cluster_ops if p.op_name not in ops]
    finally:
        admin.close()
    return missing


def _may_describe_transaction(admin: Any, tid: str, budget_s: float = 10.0) -> bool:
    deadline = time.monotonic() + budget_s
    while True:
        try:
            admin.describe_transactions([tid])
            return True
        except TransactionalIdAuthorizationFailedError:
            return False
        except TransactionalIdNotFoundError:
            return True  # allowed to describe it; it has just never been used
        except (CoordinatorNotAvailableError, CoordinatorLoadInProgressError, NotCoordinatorError):
            if time.monotonic() >= deadline:  # a fresh cluster creates __transaction_state on first use
                return True  # unknown: the producer's init_transactions reports a refusal itself
            time.sleep(0.25)


def _missing_on_topics(admin: Any, topics: list[str], permissions: list[Permission]) -> list[Permission]:
    described = {t["name"]: t for t in admin.describe_topics(topics)}
    missing: list[Permission] = []
    for name in topics:
        wanted = [p for p in permissions if p.resource == "topic" and p.name == name]
        info = described.get(name, {})
        error = info.get("error_code", 0)
        ops = info.get("authorized_operations")
        if error == 29:  # TOPIC_AUTHORIZATION_FAILED: not even Describe (or absent and not ours to know)
            missing += [p for p in wanted if p.operation != "Create"] or wanted
            continue
        if error == 3:  # UNKNOWN_TOPIC_OR_PARTITION: describable, absent
            create = next((p for p in wanted if p.operation == "Create"), None)
            if create is None or _may_create(admin, name):
                continue  # created at start; ensure_topics reports its own errors
            missing.append(create)
            continue
        if not isinstance(ops, list):
            continue  # no authorizer, or an old broker: nothing to check
        for p in wanted:
            if p.operation == "Create":
                continue  # the topic exists
            need = p.op_name
            if need not in ops and not (need == "DESCRIBE" and _IMPLIES_DESCRIBE & set(ops)):
                missing.append(p)
    return missing


def _may_create(admin: Any, topic: str) -> bool:
    result = admin.create_topics(
        {topic: {"num_partitions": 1, "replication_factor": -1}},
        validate_only=True,
        raise_errors=False,
    )
    codes = [t.get("error_code", 0) for t in result.get("topics", [])]
    return 29 not in codes and 31 not in codes


def _missing_on_group(admin: Any, group: str, wanted: list[Permission]) -> list[Permission]:
    try:
        described = admin.describe_groups([group]).get(group, {})
    except GroupAuthorizationFailedError:
        return wanted
    except KafkaError:
        return []  # coordinator not available and the like: the consumer will report it
    if described.get("error") and "GROUP_AUTHORIZATION_FAILED" in str(described["error"]):
        return wanted
    ops = described.get("authorized_operations")
    if not isinstance(ops, list):
        return []
    return [p for p in wanted if p.op_name not in ops]


def describe_missing(principal: str | None, missing: list[Permission], *, hint: str = "") -> str:
    """One line: who lacks what, and how to grant it."""
    who = principal or "this client"
    what = ", ".join(str(p) for p in missing)
    return f"{who} is not allowed to use {len(missing)} resource(s) it needs: missing {what}" + (
        f"; {hint}" if hint else ""
    )


# -- the worker's start-up check and its runtime errors ------------------------------------------------------
class AccessDenied(RuntimeError):
    """The principal lacks permissions the worker needs; the message names them and how to grant them."""


def acls_print_hint(principal: str | None, config: WorkerConfig) -> str:
    topics = config.topics
    parts = [
        f"rollout-stream acls print --principal {principal or 'User:NAME'}",
        f"--group-id {config.group_id}",
        f"--input-topic {topics.input}",
        f"--output-topic {topics.output}",
        f"--dead-letter-topic {topics.dead_letter}",
    ]
    if config.delivery != "exactly-once":
        parts.append(f"--delivery {config.delivery}")
    if config.zero_variance.topic:
        parts.append(f"--route-topic {config.zero_variance.topic}")
    return "the ACLs it needs: " + " ".join(parts)


def worker_permissions_of(config: WorkerConfig, *, create_topics: bool = False) -> list[Permission]:
    """What a worker with this configuration needs (stream.acls.worker_permissions)."""
    return worker_permissions(
        input_topic=config.topics.input,
        output_topic=config.topics.output,
        dead_letter_topic=config.topics.dead_letter,
        group_id=config.group_id,
        delivery=config.delivery,
        route_topic=config.zero_variance.topic,
        create_topics=create_topics,
    )


def check_worker_access(conn: Connection, config: WorkerConfig, *, create_topics: bool = True) -> None:
    """Raise AccessDenied, naming every missing permission, before the worker reads or writes anything."""
    permissions = worker_permissions_of(config, create_topics=create_topics)
    prefix = transactional_id_prefix(config.group_id)
    missing = missing_permissions(
        conn, permissions, transactional_ids={prefix: transactional_id(config.group_id, config.instance_id or "")}
    )
    if missing:
        principal = conn.security.principal
        raise AccessDenied(describe_missing(principal, missing, hint=acls_print_hint(principal, config)))


_DENIALS = {
    TopicAuthorizationFailedError: "a topic",
    GroupAuthorizationFailedError: "the consumer group",
    TransactionalIdAuthorizationFailedError: "the transactional id",
    ClusterAuthorizationFailedError: "the cluster",
}


def authorization_cause(exc: BaseException | None) -> AuthorizationError | None:
    """The authorization error behind `exc`, also where kafka-python wraps it ("Cannot perform send
    because at least one previous transactional or idempotent request has failed", TopicAuthorization…)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, AuthorizationError):
            return exc
        nested = next((a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)), None)
        exc = nested or exc.__cause__ or exc.__context__
    return None


def explain_denial(exc: BaseException, conn: Connection, config: WorkerConfig | None = None) -> str | None:
    """One line for an authorization error the broker returned while running; None if `exc` is not one."""
    cause = authorization_cause(exc)
    if cause is None:
        return None
    exc = cause
    kind = next((what for cls, what in _DENIALS.items() if isinstance(exc, cls)), "a resource")
    who = conn.security.principal or "this client"
    if kind == "a topic":
        what = "an ACL on a topic"
        if config is not None:
            needs: dict[str, list[str]] = {}
            for p in worker_permissions_of(config):
                if p.resource == "topic":
                    needs.setdefault(p.name, []).append(p.op_name)
            named = [
                (name, ops)
                for name, ops in needs.items()
                if re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", str(exc))
            ]
            if named:
                what = ", ".join(f"{'/'.join(ops)} on topic {name!r}" for name, ops in named)
    elif kind == "the consumer group":
        what = f"READ on group {config.group_id!r}" if config else "READ on the consumer group"
    elif kind == "the transactional id":
        what = (
            f"WRITE on transactional id {transactional_id(config.group_id, config.instance_id or '')!r}"
            if config
            else "WRITE on the transactional id"
        )
    elif kind == "the cluster":
        what = "an operation on the cluster"
    else:
        what = f"a permission ({exc})"
    line = f"the broker refused {who}: missing {what} ({type(exc).__name__})"
    if config is not None:
        line += "; " + acls_print_hint(conn.security.principal, config)
    return line
