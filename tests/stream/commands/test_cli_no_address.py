"""No command silently starts a Kafka broker (docs/spec.md §4.8): given no address, `run` refuses to start and
the operator commands use the local broker of ./.kafka-data only when it is already running; both say how to
give one in a line. `prompts`' options reach the command that follows it.

In-process (CliRunner), with no KAFKA_BOOTSTRAP_SERVERS and the working directory an empty temporary one.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollout_stream.cli import app

runner = CliRunner()
NO_ADDRESS = (
    "error: no Kafka address: pass --bootstrap-servers HOST:PORT (or set KAFKA_BOOTSTRAP_SERVERS); "
    "for a local broker run `rollout-stream demo` or `rollout-stream broker start`"
)
UNREACHABLE = "127.0.0.1:1"  # nothing listens on port 1

# every command that connects, with what it needs besides an address
OPERATOR_COMMANDS = [
    ["topics", "create"],
    ["synth", "--groups", "1"],
    ["dlq", "stats"],
    ["dlq", "list"],
    ["dlq", "show", "0:0"],
    ["dlq", "replay", "--dry-run"],
    ["tail"],
    ["lag"],
    ["prompts"],
    ["prompts", "status"],
    ["prompts", "show", "toy@0/1"],
    ["acls", "apply", "--principal", "User:t", "--role", "reader"],
]


@pytest.fixture
def empty_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _without_address(args: list[str]):
    return runner.invoke(app, args, env={"KAFKA_BOOTSTRAP_SERVERS": None, "KAFKA_CONFIG_FILE": None,
                                         "COLUMNS": "200"})


def test_run_without_an_address_refuses_to_start_in_one_line(empty_dir):
    result = _without_address(["run"])
    assert (result.exit_code, result.stdout, result.stderr.splitlines()) == (2, "", [NO_ADDRESS])
    assert os.listdir(empty_dir) == []


def test_run_with_only_a_kafka_config_without_bootstrap_servers_refuses_too(empty_dir):
    config = empty_dir / "client.properties"
    config.write_text("security.protocol=PLAINTEXT\n")
    result = _without_address(["run", "--kafka-config", str(config)])
    assert (result.exit_code, result.stderr.splitlines()) == (2, [NO_ADDRESS])
    assert os.listdir(empty_dir) == ["client.properties"]


def test_lag_without_an_address_and_no_local_broker_starts_nothing(empty_dir):
    result = _without_address(["lag"])
    assert (result.exit_code, result.stdout, result.stderr.splitlines()) == (2, "", [NO_ADDRESS])
    assert not (empty_dir / ".kafka-data").exists()
    assert os.listdir(empty_dir) == []


@pytest.mark.parametrize("args", OPERATOR_COMMANDS, ids=" ".join)
def test_no_operator_command_starts_a_broker(args, empty_dir):
    result = _without_address(args)
    assert (result.exit_code, result.stderr.splitlines()) == (2, [NO_ADDRESS]), result.output
    assert os.listdir(empty_dir) == []


def test_a_stopped_local_broker_is_not_started(empty_dir):
    """./.kafka-data holds a broker that is not running (its pid is gone): still the same line."""
    data = empty_dir / ".kafka-data"
    data.mkdir()
    gone = {"pid": 2**22 + 1, "port": 9092, "bootstrap": "127.0.0.1:9092"}  # above Linux's largest pid
    (data / "broker.json").write_text(json.dumps(gone))
    result = _without_address(["dlq", "stats"])
    assert (result.exit_code, result.stderr.splitlines()) == (2, [NO_ADDRESS])
    assert sorted(os.listdir(data)) == ["broker.json"]


# ---- prompts: the group's options reach its commands -----------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["prompts", "--bootstrap-servers", UNREACHABLE, "show", "toy@0/1"],
        ["prompts", "--bootstrap-servers", UNREACHABLE, "status"],
        ["prompts", "--bootstrap-servers", UNREACHABLE, "--json", "show", "toy@0/1"],
    ],
    ids=" ".join,
)
def test_prompts_options_reach_the_command_that_follows(args, empty_dir):
    result = _without_address(args)
    assert result.exit_code == 1, result.output
    assert f"cannot reach Kafka at {UNREACHABLE}" in result.stderr


def test_a_commands_own_option_wins_over_the_groups(empty_dir):
    result = _without_address(["prompts", "--bootstrap-servers", "127.0.0.1:2", "show", "toy@0/1",
                               "--bootstrap-servers", UNREACHABLE])
    assert result.exit_code == 1, result.output
    assert f"cannot reach Kafka at {UNREACHABLE}" in result.stderr


@pytest.mark.kafka(timeout=60)
def test_prompts_json_before_the_command_prints_json(kafka_bootstrap, empty_dir):
    output = f"prompts-json-{uuid.uuid4().hex[:8]}"
    topics = ["--output-topic", output, "--input-topic", f"{output}-in",
              "--dead-letter-topic", f"{output}-dlq"]
    created = runner.invoke(app, ["topics", "create", "--bootstrap-servers", kafka_bootstrap, *topics,
                                  "--partitions", "1"])
    assert created.exit_code == 0, created.output  # the admission log among them, empty
    group = ["prompts", "--bootstrap-servers", kafka_bootstrap, "--output-topic", output, "--json"]
    status = runner.invoke(app, [*group, "status"])
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["sources"] == []
    table = runner.invoke(app, [*group[:-1], "status"], env={"COLUMNS": "120"})
    assert table.exit_code == 0 and not table.stdout.startswith("{"), table.output
    shown = runner.invoke(app, [*group, "show", "toy@0/1"])
    assert shown.exit_code == 1
    assert f"not handed out on {output}.admission" in shown.stderr
