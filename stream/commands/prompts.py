"""`rollout-stream prompts …`: where each prompt source's epochs stand, and one prompt's attempts
(docs/loop.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Annotated

import typer

from rollout_stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions, connection_from_options
from rollout_stream.commands.local import running_local_broker
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

if TYPE_CHECKING:
    from typer._click.core import Context  # typer.Context's base, what `ctx.parent` is

__all__ = ["register"]

prompts_app = typer.Typer(
    cls=CommandGroup,
    help="Prompt sources on a train-data topic's admission log: status per epoch, one prompt's attempts.",
    invoke_without_command=True,
)

AsJson = Annotated[bool, typer.Option("--json", help="One JSON object instead of the table.")]


@dataclass(frozen=True)
class _Shared:
    """The options `prompts` and each of its commands take, merged (`_merged`)."""

    bootstrap_servers: str | None
    output_topic: str
    as_json: bool
    security: SecurityOptions


@prompts_app.callback()
@grouped_options
def prompts(
    ctx: typer.Context,
    bootstrap_servers: Bootstrap = None,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    as_json: AsJson = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Status per epoch (as `prompts status`) when no command follows. Its options apply to the command that
    follows too (`prompts --json show ID`); the command's own win."""
    if ctx.invoked_subcommand is None:
        _status(_Shared(bootstrap_servers, output_topic, as_json, security))


@prompts_app.command("status")
@grouped_options
def status(
    ctx: typer.Context,
    bootstrap_servers: Bootstrap = None,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    as_json: AsJson = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Per source and epoch: prompts waiting, in flight, trained, dead-lettered by reason, filtered,
    re-issued and exhausted, how much is settled, the rate of training and what is left."""
    _status(_merged(ctx, _Shared(bootstrap_servers, output_topic, as_json, security)))


@prompts_app.command("show")
@grouped_options
def show(
    ctx: typer.Context,
    prompt_id: Annotated[str, typer.Argument(
        metavar="ID", help="SOURCE@EPOCH/ROW, or an attempt's group key SOURCE@EPOCH.ATTEMPT/ROW.")],
    bootstrap_servers: Bootstrap = None,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    as_json: AsJson = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """One prompt: its state, and each attempt's producer, what became of it, the batch that trained it."""
    shared = _merged(ctx, _Shared(bootstrap_servers, output_topic, as_json, security))
    parsed = parse_prompt_id(prompt_id)
    if parsed is None:
        fail(f"ID {prompt_id!r}: SOURCE@EPOCH/ROW expected (e.g. gsm8k@0/17)")
    source, epoch, row = parsed
    conn = connection_from_options(shared.bootstrap_servers, shared.security, local=running_local_broker)
    topic, fold = fold_admission_log(conn, shared.output_topic)
    rec = None if fold is None else fold.prompt(source, epoch, row)
    if rec is None:
        fail(f"{prompt_id}: not handed out on {topic} (no such source, or its epoch has not reached "
             f"it)", 1)
    detail = prompt_json(source, epoch, row, rec)
    if shared.as_json:
        print(json.dumps(detail))
        return
    output_console().print(render_prompt(detail))


def _status(shared: _Shared) -> None:
    conn = connection_from_options(shared.bootstrap_servers, shared.security, local=running_local_broker)
    topic, fold = fold_admission_log(conn, shared.output_topic)
    if fold is None:
        fail(f"{topic} does not exist: no paced producer, prompt source or trainer has used "
             f"{shared.output_topic}", 1)
    report = prompts_report(topic, fold)
    if shared.as_json:
        print(json.dumps(report.to_json()))
        return
    output_console().print(render_prompts(report))


def _merged(ctx: typer.Context, own: _Shared) -> _Shared:
    """`own` (a command's options) with each option given on the command line of `prompts` itself where the
    command's own command line does not give it: `prompts --bootstrap-servers X show ID` reads X."""
    group = ctx.parent
    if group is None:
        return own

    def on_command_line(context: Context, name: str) -> bool:
        # click's ParameterSource, by name: typer does not export the enum
        return getattr(context.get_parameter_source(name), "name", None) == "COMMANDLINE"

    taken = {name: value for name, value in group.params.items()
             if on_command_line(group, name) and not on_command_line(ctx, name)}
    security_fields = {f.name for f in fields(SecurityOptions)}
    security = replace(own.security, **{k: v for k, v in taken.items() if k in security_fields})
    return replace(own, security=security, **{k: v for k, v in taken.items() if k not in security_fields})


def register(app: typer.Typer) -> None:
    app.add_typer(prompts_app, name="prompts")
