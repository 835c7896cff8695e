"""`rollout-stream lag`: where producers, the stage and each trainer group are (docs/pacing.md)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from rollout_stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions, connection_from_options
from rollout_stream.commands.local import running_local_broker
from rollout_stream.commands.options import (
    DEFAULT_TOPICS,
    Bootstrap,
    InputTopic,
    OutputTopic,
    grouped_options,
)
from rollout_stream.config import check_seconds
from rollout_stream.layout import output_console
from rollout_stream.ops.lag import lag_report, render_lag

__all__ = ["register"]


@grouped_options
def lag(
    bootstrap_servers: Bootstrap = None,
    input_topic: InputTopic = DEFAULT_TOPICS.input,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    group_id: Annotated[str, typer.Option(
        "--group-id", envvar="ROLLOUT_STREAM_GROUP_ID", help="The worker group whose input lag to show.")
    ] = "rollout-stream",
    stale_after: Annotated[float, typer.Option(
        min=0.1, help="Seconds without progress after which a party is shown as stale.")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object instead of the table.")] = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Where each party is: producers' newest weight version and outstanding groups, the stage's input lag and
    open groups, each trainer group's batch, weight version, policy lag and the groups waiting for it."""
    check_seconds("--stale-after", stale_after)
    conn = connection_from_options(bootstrap_servers, security, local=running_local_broker)
    report = lag_report(conn, output_topic=output_topic, input_topic=input_topic, stage_group_id=group_id,
                        stale_after_s=stale_after)
    if as_json:
        print(json.dumps(report.to_json()))
        return
    output_console().print(render_lag(report))


def register(app: typer.Typer) -> None:
    app.command("lag")(lag)
