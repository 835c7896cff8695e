"""`rollout-stream acls …`: the least-privilege ACLs of the worker, a producer or a trainer reader."""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Annotated

import typer

from rollout_stream.acls import (
    Permission,
    producer_permissions,
    reader_permissions,
    render_kafka_acls,
    worker_permissions,
)
from rollout_stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions, connection_from_options
from rollout_stream.commands.local import running_local_broker
from rollout_stream.commands.options import (
    DEFAULT_TOPICS,
    Bootstrap,
    CommandGroup,
    DeadLetterTopic,
    InputTopic,
    OutputTopic,
    fail,
    grouped_options,
    option_group,
)
from rollout_stream.errors import described
from rollout_stream.kafka import KafkaFailure

__all__ = ["AclRequest", "acls_app", "register"]

acls_app = typer.Typer(
    cls=CommandGroup,
    help="Least-privilege ACLs: print them as kafka-acls commands, or apply them (as an admin). "
    "`rollout-stream run` checks them at start and names what is missing.",
    no_args_is_help=True,
)


@option_group
@dataclass(frozen=True)
class AclRequest:
    """Who gets which role's ACLs, and the topics, group and features that role uses."""

    principal: Annotated[
        str,
        typer.Option(
            "--principal",
            help="Who gets them, e.g. User:worker (a SASL user name, or "
            "the certificate's distinguished name with mTLS).",
        ),
    ]
    role: Annotated[
        str,
        typer.Option(
            "--role",
            help="worker (`rollout-stream run`), producer (rollout workers, "
            "`synth`) or reader (trainers: TrainDataReader).",
        ),
    ] = "worker"
    group_id: Annotated[
        str,
        typer.Option(
            "--group-id",
            envvar="ROLLOUT_STREAM_GROUP_ID",
            help="worker: its consumer group (also names the changelog topic and the "
            "transactional ids); reader: its group id (ranks use <group>-rank<r>).",
        ),
    ] = "rollout-stream"
    input_topic: InputTopic = DEFAULT_TOPICS.input
    output_topic: OutputTopic = DEFAULT_TOPICS.output
    dead_letter_topic: DeadLetterTopic = DEFAULT_TOPICS.dead_letter
    route_topic: Annotated[
        str | None,
        typer.Option(
            "--route-topic", show_default=False, help="worker: the topic of --zero-variance route:TOPIC."
        ),
    ] = None
    delivery: Annotated[
        str,
        typer.Option(
            "--delivery",
            envvar="ROLLOUT_STREAM_DELIVERY",
            help="worker: exactly-once (changelog topic and transactional ids) or at-least-once.",
        ),
    ] = "exactly-once"
    create_topics: Annotated[
        bool,
        typer.Option(
            "--create-topics",
            help="worker: also CREATE on its topics, so it may "
            "create them when missing (else an admin creates them first).",
        ),
    ] = False
    idempotent_write: Annotated[
        bool,
        typer.Option(
            "--idempotent-write",
            help="Also IDEMPOTENT_WRITE on the cluster (only brokers older than 2.8 need it).",
        ),
    ] = False
    heads: Annotated[
        bool,
        typer.Option(
            "--heads",
            help="worker: WRITE on <output topic>.heads (`run --write-heads`); reader: READ on it "
            "(TrainDataReader(fetch='own')).",
        ),
    ] = False
    paced: Annotated[
        bool,
        typer.Option(
            "--paced",
            help="producer: paced to a trainer of --output-topic (docs/pacing.md): READ and WRITE on its "
            "progress topic.",
        ),
    ] = False


def _permissions(request: AclRequest) -> list[Permission]:
    """The request's ACLs, or `error: …` for a malformed principal, an unknown role or delivery."""
    kind, sep, name = request.principal.partition(":")
    if not sep or not kind or not name:
        fail(f"--principal must look like User:NAME, got {request.principal!r}")
    if not request.group_id:
        fail("--group-id must not be empty")
    if request.role == "worker":
        if request.delivery not in ("exactly-once", "at-least-once"):
            fail(f"--delivery must be exactly-once or at-least-once, got {request.delivery!r}")
        return worker_permissions(
            input_topic=request.input_topic,
            output_topic=request.output_topic,
            dead_letter_topic=request.dead_letter_topic,
            group_id=request.group_id,
            delivery=request.delivery,
            route_topic=request.route_topic,
            create_topics=request.create_topics,
            idempotent_write=request.idempotent_write,
            write_heads=request.heads,
        )
    if request.role == "producer":
        return producer_permissions(
            input_topic=request.input_topic, idempotent_write=request.idempotent_write,
            paced_to_output_topic=request.output_topic if request.paced else None,
        )
    if request.role == "reader":
        return reader_permissions(output_topic=request.output_topic, group_id=request.group_id,
                                  fetch_own=request.heads)
    fail(f"--role must be worker, producer or reader, got {request.role!r}")


@acls_app.command("print")
@grouped_options
def print_acls(
    request: AclRequest,
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
    permissions = _permissions(request)
    for line in render_kafka_acls(
        request.principal,
        permissions,
        bootstrap=bootstrap_servers or "$KAFKA_BOOTSTRAP_SERVERS",
        command_config=command_config,
    ):
        builtins.print(line)


@acls_app.command("apply")
@grouped_options
def apply(
    request: AclRequest,
    bootstrap_servers: Bootstrap = None,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Create the same ACLs as a principal allowed to (ALTER on the cluster)."""
    permissions = _permissions(request)
    conn = connection_from_options(bootstrap_servers, security, local=running_local_broker)
    from rollout_stream.access import apply_permissions

    as_who = conn.security.principal or "this client"
    with described(KafkaFailure, f"cannot create ACLs on {conn.bootstrap_servers} as {as_who}"):
        count = apply_permissions(conn, request.principal, permissions)  # AclsNotApplied: exit 1
    builtins.print(f"granted {count} ACLs to {request.principal} ({request.role})")


def register(app: typer.Typer) -> None:
    app.add_typer(acls_app, name="acls")
