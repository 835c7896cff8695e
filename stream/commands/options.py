"""Option types shared by the commands, so a flag means the same thing (and env var) everywhere.

Options that travel together (connection security, dead-letter filters, an ACL request) are declared once as
an option group: a frozen dataclass whose fields are `Annotated[..., typer.Option(...)]` with their defaults.
A command takes the whole group as one parameter and `grouped_options` shows typer its fields instead:

    @grouped_options
    def stats(..., filters: DeadLetterFilters = ALL_RECORDS, ...) -> None:

How a command fails is decided here too: a command parses its options, calls the library and lets the typed
errors of stream/errors.py propagate; `CommandGroup` turns one into `error: LINE` on stderr (`error_line`)
and its `exit_code` (2: configuration or usage, 1: runtime, 3: the dead-letter limit stopped the worker).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, TypeVar, cast, get_type_hints

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

from rollout_stream.config import INT64_MAX, TopicNames
from rollout_stream.errors import ConfigurationError, RolloutStreamError, RuntimeFailure

if TYPE_CHECKING:
    # typer's (vendored click) Context: not exported, and only CommandGroup's signatures need it.
    from typer._click.core import Command, Context, Parameter

__all__ = [
    "DEFAULT_TOPICS",
    "Bootstrap",
    "CommandGroup",
    "DeadLetterTopic",
    "DemoBootstrap",
    "GroupSize",
    "InputTopic",
    "OutputTopic",
    "WorkerBootstrap",
    "error_line",
    "fail",
    "grouped_options",
    "option_group",
]

F = TypeVar("F", bound=Callable[..., Any])
G = TypeVar("G")

# The topic defaults of the worker's configuration, so a flag's default cannot drift from what `run` uses.
DEFAULT_TOPICS = TopicNames()

# One flag and env var, three meanings of leaving it out (commands/local.py): the operator commands use the
# local broker only if it runs, `demo` starts it, `run` refuses to start.
_BOOTSTRAP = "Kafka bootstrap address(es), comma-separated."
Bootstrap = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-servers", envvar="KAFKA_BOOTSTRAP_SERVERS",
        help=f"{_BOOTSTRAP} Omitted: the local broker of ./.kafka-data if it is running (none is started).",
        show_default=False,
    ),
]
DemoBootstrap = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-servers", envvar="KAFKA_BOOTSTRAP_SERVERS",
        help=f"{_BOOTSTRAP} Omitted: the local broker of ./.kafka-data, started if it is not running.",
        show_default=False,
    ),
]
WorkerBootstrap = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-servers", envvar="KAFKA_BOOTSTRAP_SERVERS",
        help=f"{_BOOTSTRAP} Required: without one the worker refuses to start.",
        show_default=False,
    ),
]
InputTopic = Annotated[str, typer.Option("--input-topic", envvar="ROLLOUT_STREAM_INPUT_TOPIC",
                                         help="Rollout samples topic (input).")]
OutputTopic = Annotated[str, typer.Option("--output-topic", envvar="ROLLOUT_STREAM_OUTPUT_TOPIC",
                                          help="Train-data topic (normalized samples).")]
DeadLetterTopic = Annotated[str, typer.Option(
    "--dead-letter-topic", envvar="ROLLOUT_STREAM_DEAD_LETTER_TOPIC",
    help="Dead-letter topic (refused records, original bytes + reason headers).")]
GroupSize = Annotated[
    int | None,
    typer.Option("--group-size", envvar="ROLLOUT_STREAM_GROUP_SIZE",
                 help="Rollouts per prompt group, used when a record leaves group_size unset.",
                 show_default=False),
]

# Option group class -> its fields as command parameters (typer reads name, Annotated type and default).
_GROUPS: dict[type, tuple[inspect.Parameter, ...]] = {}


def option_group(cls: type[G]) -> type[G]:
    """Register a dataclass of typer options as a group that `grouped_options` expands into a command."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"option group {cls.__name__} must be a dataclass")
    hints = get_type_hints(cls, include_extras=True)  # typer needs the Annotated objects, not strings
    _GROUPS[cls] = tuple(
        inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default,
            annotation=hints[f.name],
        )
        for f in dataclasses.fields(cls)
    )
    return cls


def grouped_options(func: F) -> F:
    """Show typer each option-group parameter of `func` as its fields, in place; hand `func` the group built.

    Typer reads `__signature__`: every parameter becomes keyword-only there (typer passes keywords), so a
    required field may follow optional ones. A direct call may pass the group itself instead of its fields.
    """
    signature = inspect.signature(func, eval_str=True)
    groups = {p.name: p.annotation for p in signature.parameters.values() if _is_group(p.annotation)}
    if not groups:
        return func
    params: list[inspect.Parameter] = []
    for p in signature.parameters.values():
        if p.name in groups:
            params += _GROUPS[p.annotation]
        else:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY))
    names = [p.name for p in params]
    if clash := sorted({n for n in names if names.count(n) > 1}):
        raise TypeError(f"{func.__name__}: option group fields clash with its parameters: {', '.join(clash)}")

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        for name, group in groups.items():
            if name not in kwargs:
                given = {p.name: kwargs.pop(p.name) for p in _GROUPS[group] if p.name in kwargs}
                kwargs[name] = group(**given)
        return func(**kwargs)

    # mypy knows neither a function's __signature__ nor that this wrapper takes what `func` takes.
    wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def _is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and annotation in _GROUPS


def fail(message: str, code: Literal[1, 2] = 2) -> NoReturn:
    """Refuse what the command was given (exit 2: a ConfigurationError), or fail at run time (1)."""
    raise (ConfigurationError if code == 2 else RuntimeFailure)(message)


def error_line(exc: RolloutStreamError) -> str:
    """The line a command failing with `exc` prints on stderr: what it was doing, what failed, what to do."""
    line = f"{exc.doing}: {exc}" if exc.doing else str(exc)
    return f"error: {line}; {exc.advice}" if exc.advice else f"error: {line}"


@contextmanager
def _errors_in_one_line(command_path: Callable[[], str]) -> Iterator[None]:
    """A failure as one line on stderr and a non-zero exit, never a traceback: the one place that decides.

    A RolloutStreamError: `error: LINE` (`error_line`) and its `exit_code`. A usage error: `PATH: error:
    MESSAGE` and `Try 'PATH --help'.`, exit 2; typer would draw a rich box around it, and a script or a log
    wants a line it can grep. `command_path` names the command being parsed, for the errors click's option
    parser raises without a context (`Option '--commit-interval' requires an argument.`).
    """
    try:
        yield
    except RolloutStreamError as exc:
        print(error_line(exc), file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None
    except typer.TyperException as exc:  # click's errors: unknown option or command, bad or missing value
        if type(exc).__name__ == "NoArgsIsHelpError":  # no arguments: typer has printed the help, exits 2
            raise
        ctx = getattr(exc, "ctx", None)  # the misused command's context, when click attached it
        path = ctx.command_path if ctx is not None else command_path()
        message = " ".join(line.strip() for line in exc.format_message().splitlines())
        print(f"{path}: error: {message}\nTry '{path} --help'.", file=sys.stderr)
        raise typer.Exit(exc.exit_code) from None


def _number_kind(param: Parameter) -> type | None:
    """int or float when `param` takes one number (`int | None` included), else None."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if annotation in (int, float):
        return cast(type, annotation)
    kinds = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    return kinds[0] if len(kinds) == 1 and kinds[0] in (int, float) else None


def _finite_number(ctx: Context, param: Parameter, value: Any) -> Any:
    """Every number a command takes is finite and fits an int64: the common ground of what Kafka, msgspec,
    the clock and Python's waits carry (a value past it ended in a traceback: OverflowError). What a flag's
    own unit allows besides is checked where the flag is used (stream/config.py `check_seconds`, ...)."""
    name = param.opts[0] if isinstance(param, TyperOption) else (param.name or "value")  # as typer names it
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a finite number, got {value}")
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ConfigurationError(f"{name} must fit in 64 bits (-2**63 to 2**63-1), got {value}")
    return value


def _uniform_value_names(params: list[Parameter], ctx: Context) -> list[Parameter]:
    """Name every option's value in `--help` as typer's `<type>` does, and only values.

    A flag takes no value, so it shows none (typer prints `<bool>`); a repeatable option shows the type of one
    value (`<str>`, not `<list[str]>`); a metavar given in words (`KEY=VALUE`) is written the same way
    (`<key=value>`). Every parameter that takes a number is also given `_finite_number` as its check, the
    same for every command. Idempotent: the parameters are typer's own objects, prepared once.
    """
    for param in params:
        if isinstance(param, TyperOption | TyperArgument) and param.callback is None and _number_kind(param):
            param.callback = _finite_number
        if not isinstance(param, TyperOption):
            continue
        if param.is_flag:
            param.metavar = ""
        elif param.metavar is None and param.multiple:
            param.metavar = re.sub(r"^<list\[(.*)\]>$", r"<\1>", param.display_type(ctx))
        elif param.metavar and not param.metavar.startswith("<"):
            param.metavar = f"<{param.metavar.lower()}>"
    return params


class CommandGroup(TyperGroup):
    """The class of every command group (`Typer(cls=CommandGroup)`): failures and usage errors in one line
    with their exit code, one way of naming values in every command's `--help`, and one check of every
    number a command takes (finite, within an int64).

    A group parses its own arguments in `make_context` and has each subcommand parse its own in `invoke`,
    so the group that catches an error knows which command was being parsed.
    """

    def get_params(self, ctx: Context) -> list[Parameter]:
        return _uniform_value_names(super().get_params(ctx), ctx)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _uniform_value_names(command.get_params(ctx), ctx)
        return command

    def make_context(
        self, info_name: str | None, args: list[str], parent: Context | None = None, **extra: Any
    ) -> Context:
        def path() -> str:
            return " ".join(p for p in (parent.command_path if parent else "", info_name or "") if p)

        with _errors_in_one_line(path):
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: Context) -> Any:
        def path() -> str:
            return " ".join(p for p in (ctx.command_path, ctx.invoked_subcommand or "") if p)

        with _errors_in_one_line(path):
            return super().invoke(ctx)
