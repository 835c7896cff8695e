"""Asking the broker what a principal may do, and saying in one line what it may not.

* `missing_permissions`: the permissions of a list (rollout_stream.acls) this connection lacks, from the
  broker's authorized operations (KIP-430), asked before the worker reads or writes anything
  (`check_worker_access`).
* `explain_denial`: an authorization error met while running, as one line that names the permission;
  `denials_explained` and `write_denials_explained` raise it as AccessDenied (exit 2).
* `apply_permissions`: create the ACLs of a list through the admin API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from rollout_stream.acls import Permission, worker_permissions
from rollout_stream.clients import Connection
from rollout_stream.config import WorkerConfig
from rollout_stream.errors import ConfigurationError, RuntimeFailure
from rollout_stream.kafka import (
    Admin,
    AuthorizationFailed,
    KafkaFailure,
    UnknownTopic,
    ask_admin,
    authorization_cause,
    client_for,
)
from rollout_stream.names import transactional_id, transactional_id_prefix

__all__ = [
    "AccessDenied",
    "AclsNotApplied",
    "apply_permissions",
    "authorization_cause",
    "check_worker_access",
    "denials_explained",
    "describe_missing",
    "explain_denial",
    "missing_permissions",
    "write_denials_explained",
]

_IMPLIES_DESCRIBE = {"READ", "WRITE", "DELETE", "ALTER", "DESCRIBE"}


# -- applying and checking -----------------------------------------------------------------------------------
class AclsNotApplied(RuntimeFailure, RuntimeError):
    """The broker refused to create some of the ACLs."""


def apply_permissions(conn: Connection, principal: str, permissions: Iterable[Permission]) -> int:
    """Create the ACLs (as `conn`, which needs ALTER on the cluster). Returns how many were sent."""
    acls = [p.acl(principal) for p in permissions]
    admin = _admin(conn)
    try:
        failed = admin.create_acls(acls)
    finally:
        admin.close()
    if failed:
        raise AclsNotApplied(
            f"the broker refused {len(failed)} of {len(acls)} ACLs: "
            + "; ".join(getattr(e, "kind", type(e).__name__) for _, e in failed)
        )
    return len(acls)


def _admin(conn: Connection) -> Admin:
    return client_for(conn).admin(client_id=conn.client_id)


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
    admin = _admin(conn)
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
                conn, admin, (transactional_ids or {}).get(p.name, p.name)
            ):
                missing.append(p)
        cluster_ops = [p for p in permissions if p.resource == "cluster"]
        if cluster_ops:
            ops = admin.cluster_operations()
            if ops is not None:
                missing += [p for p in cluster_ops if p.op_name not in ops]
    finally:
        admin.close()
    return missing


def _may_describe_transaction(conn: Connection, admin: Admin, tid: str) -> bool:
    return ask_admin(admin, conn, lambda a: a.may_describe_transaction(tid)) is not False


def _missing_on_topics(admin: Admin, topics: list[str], permissions: list[Permission]) -> list[Permission]:
    described = {t.name: t for t in admin.describe_topics(topics, authorized_operations=True)}
    missing: list[Permission] = []
    for name in topics:
        wanted = [p for p in permissions if p.resource == "topic" and p.name == name]
        info = described.get(name)
        error = info.error if info is not None else None
        ops = info.authorized_operations if info is not None else None
        if isinstance(error, AuthorizationFailed):  # not even Describe (or absent and not ours to know)
            missing += [p for p in wanted if p.operation != "Create"] or wanted
            continue
        if isinstance(error, UnknownTopic):  # describable, absent
            create = next((p for p in wanted if p.operation == "Create"), None)
            if create is None or admin.may_create_topic(name):
                continue  # created at start; ensure_topics reports its own errors
            missing.append(create)
            continue
        if ops is None:
            continue  # no authorizer, or an old broker: nothing to check
        for p in wanted:
            if p.operation == "Create":
                continue  # the topic exists
            need = p.op_name
            if need not in ops and not (need == "DESCRIBE" and _IMPLIES_DESCRIBE & set(ops)):
                missing.append(p)
    return missing


def _missing_on_group(admin: Admin, group: str, wanted: list[Permission]) -> list[Permission]:
    try:
        ops = admin.group_operations(group)
    except AuthorizationFailed:
        return wanted
    if ops is None:
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
class AccessDenied(ConfigurationError, RuntimeError):
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
    """What a worker with this configuration needs (rollout_stream.acls.worker_permissions)."""
    return worker_permissions(
        input_topic=config.topics.input,
        output_topic=config.topics.output,
        dead_letter_topic=config.topics.dead_letter,
        group_id=config.group_id,
        delivery=config.delivery,
        route_topic=config.zero_variance.topic,
        create_topics=create_topics,
        write_heads=config.write_heads,
    )


def check_worker_access(conn: Connection, config: WorkerConfig, *, create_topics: bool = True) -> None:
    """Raise AccessDenied, naming every missing permission, before the worker reads or writes anything."""
    permissions = worker_permissions_of(config, create_topics=create_topics)
    prefix = transactional_id_prefix(config.group_id)
    missing = missing_permissions(
        conn, permissions,
        transactional_ids={prefix: transactional_id(config.group_id, config.instance_id or "")},
    )
    if missing:
        principal = conn.security.principal
        raise AccessDenied(describe_missing(principal, missing, hint=acls_print_hint(principal, config)))


_DENIALS = {"topic": "a topic", "group": "the consumer group", "transactional_id": "the transactional id",
            "cluster": "the cluster"}



def explain_denial(exc: BaseException, conn: Connection, config: WorkerConfig | None = None) -> str | None:
    """One line for an authorization error the broker returned while running; None if `exc` is not one."""
    cause = authorization_cause(exc)
    if cause is None:
        return None
    exc = cause
    kind = _DENIALS.get(cause.resource, "a resource")
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
            ] or _missing_on_topics_now(conn, config)
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
    line = f"the broker refused {who}: missing {what} ({cause.kind})"
    if config is not None:
        line += "; " + acls_print_hint(conn.security.principal, config)
    return line


def _missing_on_topics_now(conn: Connection, config: WorkerConfig) -> list[tuple[str, list[str]]]:
    """The worker's topic permissions the broker says are missing now, by topic; [] when it cannot tell.
    librdkafka's transaction errors name no topic (TOPIC_AUTHORIZATION_FAILED at commit): the same question
    as the start-up check names it, as kafka-python's error does."""
    wanted = [p for p in worker_permissions_of(config) if p.resource == "topic"]
    try:
        missing = missing_permissions(conn, wanted)
    except RuntimeFailure:  # the broker could not answer: the line still says what kind of ACL is missing
        return []
    by_topic: dict[str, list[str]] = {}
    for p in missing:
        by_topic.setdefault(p.name, []).append(p.op_name)
    return list(by_topic.items())


@contextmanager
def denials_explained(conn: Connection, config: WorkerConfig | None = None) -> Iterator[None]:
    """A Kafka failure raised inside for lack of an ACL becomes AccessDenied, naming the permission."""
    try:
        yield
    except KafkaFailure as exc:
        if (denial := explain_denial(exc, conn, config)) is not None:
            raise AccessDenied(denial) from exc
        raise


@contextmanager
def write_denials_explained(conn: Connection, topic: str) -> Iterator[None]:
    """A producer refused for lack of WRITE on `topic` inside: AccessDenied, with the command to grant it."""
    try:
        yield
    except KafkaFailure as exc:
        if (cause := authorization_cause(exc)) is None:
            raise
        who = conn.security.principal or "this client"
        raise AccessDenied(
            f"the broker refused {who}: missing WRITE on topic {topic!r} ({cause.kind}); grant it: "
            f"rollout-stream acls apply --role producer --input-topic {topic} --principal ...") from exc
