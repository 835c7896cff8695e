"""`rollout-stream prompts …`: where each prompt source's epochs stand, and one prompt's attempts
(docs/loop.md)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from rollout_stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions, connection_from_options
from rollout_stream.commands.options import (
    DEFAULT_TOPICS,
    Bootstrap,
    CommandGroup,
    OutputTopic,
    fail,
    grouped_options,
)
from rollout_stream.layout import output_console
from rollout_stream.ops.prompts import (
    fold_admission_log,
    parse_prompt_id,
    prompt_json,
    prompts_report,
    render_prompt,
    render_prompts,
)

__all__ = ["register"]

prompts_app = typer.Typer(
    cls=CommandGroup,
    help="Prompt sources on a train-data topic's admission log: status per epoch, one prompt's attempts.",
    invoke_without_command=True,
)

AsJson = Annotated[bool, typer.Option("--json", help="One JSON object instead of the table.")]


@prompts_app.callback()
@grouped_options
def prompts(
    ctx: typer.Context,
    bootstrap_servers: Bootstrap = None,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    as_json: AsJson = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Status per epoch (as `prompts status`) when no command follows."""
    if ctx.invoked_subcommand is None:
        status(bootstrap_servers=bootstrap_servers, output_topic=output_topic, as_json=as_json,
               security=security)


@prompts_app.command("status")
@grouped_options
def status(
    bootstrap_servers: Bootstrap = None,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    as_json: AsJson = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Per source and epoch: prompts waiting, in flight, trained, dead-lettered by reason, filtered,
    re-issued and exhausted, how much is settled, the rate of training and what is left."""
    conn = connection_from_options(bootstrap_servers, security)
    topic, fold = fold_admission_log(conn, output_topic)
    if fold is None:
        fail(f"{topic} does not exist: no paced producer, prompt source or trainer has used "
             f"{output_topic}", 1)
    report = prompts_report(topic, fold)
    if as_json:
        print(json.dumps(report.to_json()))
        return
    output_console().print(render_prompts(report))


@prompts_app.command("show")
@grouped_options
def show(
    prompt_id: Annotated[str, typer.Argument(
        metavar="ID", help="SOURCE@EPOCH/ROW, or an attempt's group key SOURCE@EPOCH.ATTEMPT/ROW.")],
    bootstrap_servers: Bootstrap = None,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    as_json: AsJson = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """One prompt: its state, and each attempt's producer, what became of it, the batch that trained it."""
    parsed = parse_prompt_id(prompt_id)
    if parsed is None:
        fail(f"ID {prompt_id!r}: SOURCE@EPOCH/ROW expected (e.g. gsm8k@0/17)")
    source, epoch, row = parsed
    conn = connection_from_options(bootstrap_servers, security)
    topic, fold = fold_admission_log(conn, output_topic)
    rec = None if fold is None else fold.prompt(source, epoch, row)
    if rec is None:
        fail(f"{prompt_id}: not handed out on {topic} (no such source, or its epoch has not reached "
             f"it)", 1)
    detail = prompt_json(source, epoch, row, rec)
    if as_json:
        print(json.dumps(detail))
        return
    output_console().print(render_prompt(detail))


def register(app: typer.Typer) -> None:
    app.add_typer(prompts_app, name="prompts")
