"""`--help` of every command at every terminal width: no flag or env var name cut short, rich panels kept."""

from __future__ import annotations

import re
from typing import Any

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from rollout_stream.cli import app

runner = CliRunner()


def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    subcommands = getattr(command, "commands", {})
    return [path] + [p for name, sub in subcommands.items() for p in _commands(sub, (*path, name))]


COMMANDS = _commands(get_command(app))  # (), ("run",), ("dlq",), ("dlq", "list"), ...


def options_of(path: tuple[str, ...]) -> list[Any]:
    """The options (not arguments) of the command at `path`, as typer built them."""
    command = get_command(app)
    for name in path:
        command = command.commands[name]  # type: ignore[attr-defined]
    return [p for p in command.params if p.param_type_name == "option"]

# 60: the narrowest width that holds the longest word of any help indented below its flag
# (ROLLOUT_STREAM_NO_REWARDS_NORMALIZATION]); 80: the classic terminal; above: side by side, narrowing.
WIDTHS = [60, 72, 80, 90, 100, 110, 120, 140, 200]


def _help(path: tuple[str, ...], columns: int) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(columns), "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return result.stdout


def _whole(word: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_help_never_cuts_a_flag_or_an_environment_variable(path, columns):
    text = _help(path, columns)
    panel_lines = [line for line in text.splitlines() if line.startswith("│")]
    assert panel_lines, text  # the rich layout (panels), not click's plain one
    assert not [line for line in panel_lines if "…" in line], text
    flat = re.sub(r"\s+", " ", text.replace("│", " "))  # a wrapped help joined again
    for option in options_of(path):
        for flag in [*option.opts, *option.secondary_opts]:
            assert _whole(flag, text), (flag, text)
        if isinstance(option.envvar, str) and option.show_envvar:
            assert f"[env var: {option.envvar}]" in flat, (option.envvar, text)


def test_a_wide_terminal_keeps_typers_side_by_side_table():
    lines = _help(("run",), 200).splitlines()
    assert any("--input-topic" in line and "Rollout samples topic (input)." in line for line in lines)
    assert any("--advantage-estimator" in line and "[env var: ROLLOUT_STREAM_ADVANTAGE_ESTIMATOR]" in line
               for line in lines)


def test_a_narrow_terminal_puts_each_help_under_its_flag():
    text = _help(("run",), 80)
    assert re.search(r"│ --no-rewards-normalization +│\n│     Publish raw rewards unchanged\. +│\n"
                     r"│     \[env var: ROLLOUT_STREAM_NO_REWARDS_NORMALIZATION\] +│", text), text
    assert re.search(r"│ --progress --no-progress +│", _help(("dlq", "list"), 80))


def test_the_command_list_stays_a_table_at_80_columns():
    text = _help((), 80)
    assert re.search(r"│ dlq +Inspect the dead-letter topic", text), text


def test_every_command_is_checked():
    assert {("run",), ("dlq", "replay"), ("acls", "apply"), ("broker", "fetch-jars"), ()} <= set(COMMANDS)
