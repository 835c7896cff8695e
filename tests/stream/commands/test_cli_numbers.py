"""Every number every command takes: a value outside the flag's range is one `error:` line naming the flag and
exit 2, never a traceback, and nothing is started.

No broker needed: every value fed here is refused before a connection is made (the commands that connect are
pointed at a port nothing listens on, so a value that slipped through fails with exit 1, not 2), and the
broker commands get an empty --data-dir.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.main import get_command
from typer.testing import CliRunner

from rollout_stream.cli import app
from rollout_stream.clients import MAX_RECORD_BYTES
from rollout_stream.commands.synth import MAX_TOKENS
from rollout_stream.config import INT32_MAX, INT64_MAX, MAX_SECONDS
from rollout_stream.core.dead_letter_limit import MAX_WINDOW
from rollout_stream.core.validate import MAX_GROUP_SIZE, MAX_SIBLING_COUNT
from tests.stream.commands.test_cli_help import COMMANDS

runner = CliRunner()
UNREACHABLE = ["--bootstrap-servers", "127.0.0.1:1"]
INF = math.inf


@dataclass(frozen=True)
class Range:
    """The values a flag takes: low..high (floats: `low_open` excludes low)."""

    kind: type
    low: float
    high: float
    low_open: bool = False


def ints(low: int, high: int = INT64_MAX) -> Range:
    return Range(int, low, high)


def seconds(low: float = 0.0, high: float = MAX_SECONDS, *, low_open: bool = True) -> Range:
    return Range(float, low, high, low_open)


def floats(low: float, high: float = INF, *, low_open: bool = False) -> Range:
    return Range(float, low, high, low_open)


# (command, flag) -> its range. A flag missing here fails `test_every_number_flag_is_covered`.
RANGES: dict[tuple[str, str], Range] = {
    ("run", "--group-size"): ints(1, MAX_GROUP_SIZE),
    ("run", "--group-timeout"): seconds(),
    ("run", "--commit-interval"): seconds(high=30),  # half the transaction timeout, under exactly-once
    ("run", "--progress-interval"): seconds(),
    ("run", "--closed-group-retention"): seconds(600, low_open=False),  # twice the default group timeout
    ("run", "--session-timeout"): seconds(6, 1800, low_open=False),
    ("run", "--partitions"): ints(1, INT32_MAX),
    ("run", "--commit-max-records"): ints(1),
    ("run", "--max-open-groups"): ints(1),
    ("run", "--max-open-mib"): ints(64, INT64_MAX >> 20),
    ("run", "--chunk-kib"): ints(1, MAX_RECORD_BYTES >> 10),
    ("run", "--metrics-port"): ints(1, 65535),
    ("run", "--max-dead-letter-ratio"): floats(0, 1),
    ("run", "--dead-letter-window"): ints(1, MAX_WINDOW),
    ("demo", "--groups"): ints(0),
    ("demo", "--group-size"): ints(1, MAX_GROUP_SIZE),
    ("demo", "--max-siblings"): ints(1, MAX_SIBLING_COUNT),
    ("demo", "--fault-rate"): floats(0, 1 / 7),
    ("demo", "--rate"): floats(0),
    ("demo", "--group-timeout"): seconds(),
    ("synth", "--groups"): ints(0),
    ("synth", "--group-size"): ints(1, MAX_GROUP_SIZE),
    ("synth", "--max-siblings"): ints(1, MAX_SIBLING_COUNT),
    ("synth", "--tokens"): ints(1, MAX_TOKENS),
    ("synth", "--rate"): floats(0),
    ("synth", "--start-index"): ints(0, INT64_MAX - 100),  # 100: synth's default --groups
    ("synth", "--seed"): ints(-INT64_MAX - 1),
    **{("synth", f"--{kind}-rate"): floats(0, 1) for kind in (
        "fault", "malformed", "invalid", "shared-reward", "conflicting-duplicate", "incomplete", "late",
        "duplicate")},
    ("tail", "--groups"): ints(1),
    ("tail", "--partition-idle-ms"): ints(0, MAX_SECONDS * 1000),
    ("lag", "--stale-after"): seconds(0.1, low_open=False),
    ("broker start", "--port"): ints(1, 65535),
    ("broker start", "--timeout"): seconds(1, low_open=False),
    ("broker start", "--nodes"): ints(1, 9),
    ("broker stop", "--timeout"): seconds(low_open=False),
    ("broker stop", "--node"): ints(1),
    ("broker kill", "node"): ints(1),
    ("broker restart", "node"): ints(1),
    ("broker restart", "--timeout"): seconds(1, low_open=False),
    ("broker restart", "--stop-timeout"): seconds(low_open=False),
    ("topics create", "--partitions"): ints(1, INT32_MAX),
    ("topics create", "--replication-factor"): ints(1, 2**15 - 1),
    ("topics create", "--min-insync-replicas"): ints(1, INT32_MAX),
    ("topics create", "--max-message-mib"): ints(1, INT32_MAX >> 20),
    ("topics create", "--dead-letter-retention-days"): seconds(high=MAX_SECONDS / 86400),
    ("dlq stats", "--top"): ints(0),
    ("dlq list", "--limit"): ints(0),
    ("dlq show", "--context"): ints(0, INT32_MAX),
    ("dlq replay", "--limit"): ints(0),
    ("dlq replay", "--rate"): floats(0),
    ("dlq replay", "--max-replays"): ints(1),
    ("dlq replay", "--rows"): ints(0),
}


def _numbers() -> set[tuple[str, str]]:
    """(command, flag) of every parameter of every command that takes a number."""
    found = set()
    for path in COMMANDS:
        command = get_command(app)
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        for param in getattr(command, "params", []):
            annotation = param.type_descriptor.annotation
            kinds = {annotation} | set(getattr(annotation, "__args__", ()))
            if kinds & {int, float}:
                found.add((" ".join(path), param.opts[0] if param.param_type_name == "option"
                           else param.name))
    return found


def test_every_number_flag_is_covered():
    assert _numbers() == set(RANGES)


def outside(r: Range) -> st.SearchStrategy[str]:
    """Values a flag of range `r` must refuse, as typed on a command line: non-finite, huge, below its
    range (zero and negative where the range starts above them)."""
    if r.kind is int:
        below = st.integers(max_value=int(r.low) - 1)
        above = st.integers(min_value=int(r.high) + 1)
        numbers = st.one_of(below, above, st.just(10**30), st.just(-(10**30))).filter(
            lambda v: not r.low <= v <= r.high)
        return st.one_of(numbers.map(str), st.sampled_from(["inf", "-inf", "nan", "1e308"]))
    below = st.floats(max_value=r.low, exclude_max=not r.low_open, allow_nan=False)
    above = st.floats(min_value=r.high, exclude_min=True) if r.high < INF else st.just(INF)
    return st.one_of(below, above, st.sampled_from([INF, -INF, math.nan])).map(repr)


def command_line(command: str, flag: str, value: str, tmp: str) -> list[str]:
    path = command.split()
    if path[0] == "broker":
        args = [*path, "--data-dir", tmp]
        if flag == "node":
            return [*args, "--", value]
        return [*args, flag, value, *(["1"] if path[1] == "restart" else [])]
    extra = ["0:0"] if command == "dlq show" else []
    return [*path, *extra, *UNREACHABLE, flag, value]


@pytest.mark.parametrize(("command", "flag"), sorted(RANGES), ids=str)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_number_outside_its_range_is_one_error_line_naming_its_flag(command, flag, data, tmp_path):
    value = data.draw(outside(RANGES[(command, flag)]), label="value")
    args = command_line(command, flag, value, str(tmp_path / "broker"))
    result = runner.invoke(app, args, env={"COLUMNS": "200", "KAFKA_BOOTSTRAP_SERVERS": None})
    assert result.exit_code == 2, (args, result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), (args, result.exception)
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, (args, result.stderr)
    assert flag in errors[0], (args, errors[0])
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "broker").exists()  # nothing was started


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["run", "--group-timeout", "inf"], "error: --group-timeout must be a finite number, got inf"),
        (["run", "--group-timeout", "1e308"],
         "error: --group-timeout must be a number of seconds above 0 and at most 3153600000 (100 years), got "
         "1e+308"),
        (["run", "--commit-interval", "1e308"],
         "error: --commit-interval must be a number of seconds above 0 and at most 3153600000 (100 years), "
         "got 1e+308"),
        (["run", "--commit-interval", "60"],
         "error: --commit-interval must be at most 30 seconds under exactly-once (half the 60 s transaction "
         "timeout, after which the broker aborts a transaction), got 60"),
        (["run", "--max-open-groups", "99999999999999999999"],
         "error: --max-open-groups must fit in 64 bits (-2**63 to 2**63-1), got 99999999999999999999"),
        (["topics", "create", "--max-message-mib", "4096"],
         "error: --max-message-mib must be between 1 and 2047 MiB (max.message.bytes is an int32), got 4096"),
    ],
)
def test_the_line_says_what_the_flag_takes(args, line):
    env = {"COLUMNS": "200", "KAFKA_BOOTSTRAP_SERVERS": None}
    result = runner.invoke(app, [*args, *UNREACHABLE], env=env)
    assert (result.exit_code, result.stderr.splitlines()) == (2, [line])
