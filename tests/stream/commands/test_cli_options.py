"""Option groups: options declared once as a dataclass, shown to typer in place, handed over as one value."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from rollout_stream.commands.acls import AclRequest, print_acls
from rollout_stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions
from rollout_stream.commands.dlq import ALL_RECORDS, DeadLetterFilters, list_
from rollout_stream.commands.options import CommandGroup, grouped_options, option_group
from rollout_stream.security import SecretStr

runner = CliRunner()


@option_group
@dataclass(frozen=True)
class _Pair:
    name: Annotated[str, typer.Option("--name", envvar="TEST_PAIR_NAME", help="A name.")]
    size: Annotated[int, typer.Option(help="A size.")] = 3


def _app(command) -> typer.Typer:
    app = typer.Typer(cls=CommandGroup)
    app.command("cmd")(command)
    app.command("other")(lambda: None)  # two commands: `cmd` stays a subcommand
    return app


def test_a_group_stands_where_its_parameter_stood_and_reaches_the_command_whole():
    got: list[object] = []

    @grouped_options
    def command(first: int = 1, pair: _Pair = _Pair("x"), last: bool = False) -> None:
        got.append((first, pair, last))

    assert list(inspect.signature(command).parameters) == ["first", "name", "size", "last"]
    result = runner.invoke(_app(command), ["cmd", "--name", "n", "--size", "5", "--last"])
    assert result.exit_code == 0, result.output
    assert got == [(1, _Pair("n", 5), True)]
    runner.invoke(_app(command), ["cmd"], env={"TEST_PAIR_NAME": "from-env"})
    assert got[-1] == (1, _Pair("from-env", 3), False)


def test_a_required_field_stays_required():
    @grouped_options
    def command(pair: _Pair) -> None:
        pass

    result = runner.invoke(_app(command), ["cmd"])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == (
        "root cmd: error: Missing option '--name' (env var: 'TEST_PAIR_NAME')."
    )


def test_a_direct_call_may_pass_the_group_itself():
    @grouped_options
    def command(pair: _Pair, factor: int = 2) -> int:
        return pair.size * factor

    assert command(pair=_Pair("a", 4)) == 8
    assert command(name="a", factor=3) == 9  # or its fields


def test_a_field_named_like_another_parameter_is_refused():
    def command(pair: _Pair, size: int = 1) -> None:
        pass

    with pytest.raises(TypeError, match="clash with its parameters: size"):
        grouped_options(command)


def test_the_commands_show_their_groups_in_place():
    names = list(inspect.signature(list_).parameters)
    assert names[:6] == ["bootstrap_servers", "dead_letter_topic", "reason", "group", "since", "until"]
    assert names[-1] == "ssl_check_hostname"  # the security flags where `security` stood: last
    assert list(inspect.signature(print_acls).parameters)[:3] == ["principal", "role", "group_id"]
    assert ALL_RECORDS == DeadLetterFilters() and NO_SECURITY_OPTIONS == SecurityOptions()


def test_acls_print_receives_the_whole_request():
    app = typer.Typer()
    app.command()(print_acls)
    result = runner.invoke(app, ["--principal", "User:t", "--role", "reader", "--output-topic", "o"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "# read train samples"
    assert "--allow-principal User:t --operation Read --topic o" in result.stdout
    assert AclRequest("User:t").group_id == "rollout-stream"


def test_the_sasl_password_is_a_secret_from_the_moment_it_is_read():
    got: list[SecurityOptions] = []

    @grouped_options
    def command(security: SecurityOptions = NO_SECURITY_OPTIONS) -> None:
        got.append(security)

    runner.invoke(_app(command), ["cmd", "--sasl-password", "flag-secret"])
    runner.invoke(_app(command), ["cmd"], env={"KAFKA_SASL_PASSWORD": "env-secret"})
    runner.invoke(_app(command), ["cmd"])
    assert [s.sasl_password for s in got] == [SecretStr("flag-secret"), SecretStr("env-secret"), None]
    assert "flag-secret" not in repr(got[0])
