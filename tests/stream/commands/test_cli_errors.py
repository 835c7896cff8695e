"""Usage errors of every command: an `error:` line and a `--help` hint on stderr, exit 2, no stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollout_stream.cli import app
from tests.stream.commands.test_cli_help import COMMANDS, options_of

EXE = str(Path(sys.executable).with_name("rollout-stream"))
runner = CliRunner()


def _usage_error(args: list[str]) -> tuple[str, str]:
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    error, hint = result.stderr.splitlines()  # exactly two lines
    return error, hint


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "rollout-stream")
def test_an_unknown_option_is_one_line_naming_the_command(path):
    name = " ".join(["rollout-stream", *path])
    assert _usage_error([*path, "--no-such-flag"]) == (
        f"{name}: error: No such option: --no-such-flag",
        f"Try '{name} --help'.",
    )


# click's option parser raises "requires an argument" without the command's context: the group that
# parsed the command still names it.
@pytest.mark.parametrize(
    "path", [p for p in COMMANDS if any(not o.is_flag for o in options_of(p))], ids=" ".join
)
def test_an_option_without_its_value_is_one_line_naming_the_command(path):
    option = next(o for o in options_of(path) if not o.is_flag)
    name = " ".join(["rollout-stream", *path])
    assert _usage_error([*path, option.opts[0]]) == (
        f"{name}: error: Option '{option.opts[0]}' requires an argument.",
        f"Try '{name} --help'.",
    )


@pytest.mark.parametrize(
    "args,error",
    [
        (["run", "--commit-interval", "abc"],
         "rollout-stream run: error: Invalid value for '--commit-interval' (env var: "
         "'ROLLOUT_STREAM_COMMIT_INTERVAL'): Input should be a valid number, unable to parse string as a "
         "number"),
        (["dlq", "list", "--limit", "-1"],
         "rollout-stream dlq list: error: Invalid value for '--limit': Input should be greater than or "
         "equal to 0"),
        (["dlq", "show"], "rollout-stream dlq show: error: Missing argument 'coordinates'."),
        (["acls", "print"], "rollout-stream acls print: error: Missing option '--principal'."),
        (["dlq", "lst"], "rollout-stream dlq: error: No such command 'lst'. Did you mean 'list'?"),
        (["bogus"], "rollout-stream: error: No such command 'bogus'."),
        (["dlq", "list", "--json=yes"],
         "rollout-stream dlq list: error: Option '--json' does not take a value."),
    ],
)
def test_usage_errors_are_one_line(args, error):
    assert _usage_error(args)[0] == error


def test_a_group_without_a_command_still_prints_its_help():
    result = runner.invoke(app, ["dlq"], env={"COLUMNS": "80"})
    assert result.exit_code == 2
    assert "Usage: rollout-stream dlq [OPTIONS] COMMAND [ARGS]..." in result.stdout
    assert "│ list " in result.stdout  # the rich command list


def test_the_installed_command_prints_one_line():
    env = {**os.environ, "COLUMNS": "80"}
    done = subprocess.run(
        [EXE, "run", "--commit-interval"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "rollout-stream run: error: Option '--commit-interval' requires an argument.",
        "Try 'rollout-stream run --help'.",
    ]
