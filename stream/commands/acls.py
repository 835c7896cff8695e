"""`rollout-stream acls …`: the least-privilege ACLs of the worker, a producer or a trainer reader."""

from __future__ import annotations

import builtins
from typing import Annotated

import typer
from kafka.errors import KafkaError

from stream.access import AclsNotApplied
from stream.acls import (
    Permission,
    producer_permissions,
    reader_permissions,
    render_kafka_acls,
    worker_permissions,
)
from stream.commands.connection import (
    NO_SECURITY_OPTIONS,
    SecurityOptions,
    connection_from_options,
    connection_options,
)
from stream.commands.options import Bootstrap, DeadLetterTopic, InputTopic, OutputTopic, fail

__all__ = ["acls_app", "register"]

acls_app = typer.Typer(
    help="Least-privilege ACLs: print them as kafka-acls commands, or apply them (as an admin). "
    "`rollout-stream run` checks them at start and names what is missing.",
    no_args_is_help=True,
)

Principal = Annotated[
    str,
    typer.Option(
        "--principal",
        help="Who gets them, e.g. User:worker (a SASL user name, or "
        "the certificate's distinguished name with mTLS).",
    ),
]
Role = Annotated[
    str,
    typer.Option(
        "--role",
        help="worker (`rollout-stream run`), producer (rollout workers, "
        "`synth`) or reader (trainers: TrainDataReader).",
    ),
]
GroupId = Annotated[
    str,
    typer.Option(
        "--group-id",
        envvar="ROLLOUT_STREAM_GROUP_ID",
        help="worker: its consumer group (also names the changelog topic and the "
        "transactional ids); reader: its group id (ranks use <group>-rank<r>).",
    ),
]
RouteTopic = Annotated[
    str | None,
    typer.Option(
        "--route-topic", show_default=False, help="worker: the topic of --zero-variance route:TOPIC."
    ),
]
Delivery = Annotated[
    str,
    typer.Option(
        "--delivery",
        envvar="ROLLOUT_STREAM_DELIVERY",
        help="worker: exactly-once (changelog topic and transactional ids) or at-least-once.",
    ),
]
CreateTopics = Annotated[
    bool,
    typer.Option(
        "--create-topics",
        help="worker: also CREATE on its topics, so it may "
        "create them when missing (else an admin creates them first).",
    ),
]
IdempotentWrite = Annotated[
    bool,
    typer.Option(
        "--idempotent-write",
        help="Also IDEMPOTENT_WRITE on the cluster (only brokers older than 2.8 need it).",
    ),
]


def _permissions(
    role: str,
    input_topic: str,
    output_topic: str,
    dead_letter_topic: str,
    group_id: str,
    route_topic: str | None,
    delivery: str,
    create_topics: bool,
    idempotent_write: bool,
) -> list[Permission]:
    if not group_id:
        fail("--group-id must not be empty")
    if role == "worker":
        if delivery not in ("exactly-once", "at-least-once"):
            fail(f"--delivery must be exactly-once or at-least-once, got {delivery!r}")
        return worker_permissions(
            input_topic=input_topic,
            output_topic=output_topic,
            dead_letter_topic=dead_letter_topic,
            group_id=group_id,
            delivery=delivery,
            route_topic=route_topic,
            create_topics=create_topics,
            idempotent_write=idempotent_write,
        )
    if role == "producer":
        return producer_permissions(input_topic=input_topic, idempotent_write=idempotent_write)
    if role == "reader":
        return reader_permissions(output_topic=output_topic, group_id=group_id)
    fail(f"--role must be worker, producer or reader, got {role!r}")


def _check_principal(principal: str) -> None:
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        fail(f"--principal must look like User:NAME, got {principal!r}")


@acls_app.command("print")
def print_acls(
    principal: Principal,
    role: Role = "worker",
    group_id: GroupId = "rollout-stream",
    input_topic: InputTopic = "rollouts",
    output_topic: OutputTopic = "train-data",
    dead_letter_topic: DeadLetterTopic = "rollouts-dlq",
    route_topic: RouteTopic = None,
    delivery: Delivery = "exactly-once",
    create_topics: CreateTopics = False,
    idempotent_write: IdempotentWrite = False,
    bootstrap_servers: Bootstrap = None,
    command_config: Annotated[
        str,
        typer.Option(
            "--command-config",
            help="The admin's client properties file, as written into the printed commands.",
        ),
    ] = "admin.properties",
) -> None:
    """Print the minimal ACLs as kafka-acls.sh commands (one per resource, each with a comment saying why).

    READ and WRITE imply DESCRIBE. The transactional ids of a worker group share the prefix
    rollout-stream-<group-id>-, hence one prefixed ACL for every instance.
    """
    _check_principal(principal)
    permissions = _permissions(
        role,
        input_topic,
        output_topic,
        dead_letter_topic,
        group_id,
        route_topic,
        delivery,
        create_topics,
        idempotent_write,
    )
    for line in render_kafka_acls(
        principal,
        permissions,
        bootstrap=bootstrap_servers or "$KAFKA_BOOTSTRAP_SERVERS",
        command_config=command_config,
    ):
        builtins.print(line)


@acls_app.command("apply")
@connection_options
def apply(
    principal: Principal,
    role: Role = "worker",
    group_id: GroupId = "rollout-stream",
    input_topic: InputTopic = "rollouts",
    output_topic: OutputTopic = "train-data",
    dead_letter_topic: DeadLetterTopic = "rollouts-dlq",
    route_topic: RouteTopic = None,
    delivery: Delivery = "exactly-once",
    create_topics: CreateTopics = False,
    idempotent_write: IdempotentWrite = False,
    bootstrap_servers: Bootstrap = None,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Create the same ACLs as a principal allowed to (ALTER on the cluster)."""
    _check_principal(principal)
    permissions = _permissions(
        role,
        input_topic,
        output_topic,
        dead_letter_topic,
        group_id,
        route_topic,
        delivery,
        create_topics,
        idempotent_write,
    )
    conn = connection_from_options(bootstrap_servers, security)
    from stream.access import apply_permissions

    try:
        count = apply_permissions(conn, principal, permissions)
    except AclsNotApplied as exc:
        fail(str(exc), 1)
    except KafkaError as exc:
        fail(
            f"cannot create ACLs on {conn.bootstrap_servers} as {conn.security.principal or 'this client'}: "
            f"{type(exc).__name__}: {exc}",
            1,
        )
    builtins.print(f"granted {count} ACLs to {principal} ({role})")


def register(app: typer.Typer) -> None:
    app.add_typer(acls_app, name="acls")
