"""Flags are checked where they are read, and a refused value names its own flag.

No broker needed: every value here is refused before a connection is made, and the one bootstrap address
that is dialled is dialled through a stand-in socket.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollout_stream.cli import app
from rollout_stream.clients import BadBootstrap, Connection, bootstrap_addresses
from rollout_stream.config import ConfigError, TopicNames, WorkerConfig
from rollout_stream.kafka.kafka_python import client_settings
from tests.stream.commands.test_cli_help import options_of

runner = CliRunner()
README = Path(__file__).resolve().parents[3] / "README.md"


def _invoke(args: list[str], env: dict[str, str] | None = None):
    # No broker in the environment: a value that slipped through would dial it instead of failing here.
    return runner.invoke(app, args, env={"COLUMNS": "200", "KAFKA_BOOTSTRAP_SERVERS": None, **(env or {})})


def _usage_error(args: list[str], env: dict[str, str] | None = None) -> str:
    """The error line of a usage error that typer reports (then `Try '… --help'.`), exit 2."""
    result = _invoke(args, env)
    assert result.exit_code == 2, (result.exit_code, result.output)
    error, hint = result.stderr.splitlines()
    assert hint.startswith("Try 'rollout-stream ")
    return error


def _refused(args: list[str]) -> str:
    """The one `error:` line of a value the command refused after parsing, exit 2."""
    result = _invoke(args)
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    return line


# ---- synth ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flag,value,says",
    [
        ("--rate", "-5", "greater than or equal to 0"),
        ("--group-size", "0", "greater than or equal to 1"),
        ("--group-size", "4097", "less than or equal to 4096"),  # the worker's largest group
        ("--tokens", "0", "greater than or equal to 1"),
        ("--max-siblings", "0", "greater than or equal to 1"),
        ("--groups", "-1", "greater than or equal to 0"),
        ("--fault-rate", "2", "less than or equal to 1"),
        ("--fault-rate", "-0.1", "greater than or equal to 0"),
        ("--late-rate", "1.5", "less than or equal to 1"),
    ],
)
def test_synth_refuses_a_bad_number_naming_its_own_flag(flag, value, says):
    error = _usage_error(["synth", flag, value])
    assert error.startswith(f"rollout-stream synth: error: Invalid value for '{flag}'"), error
    assert says in error


def test_synth_group_size_from_the_environment_is_checked_too():
    error = _usage_error(["synth"], env={"ROLLOUT_STREAM_GROUP_SIZE": "0"})
    assert "'--group-size' (env var: 'ROLLOUT_STREAM_GROUP_SIZE')" in error


def test_fault_rate_says_what_each_fault_gets_and_the_largest_that_fits():
    line = _refused(["synth", "--fault-rate", "0.2"])
    assert line == (
        "error: --fault-rate 0.2 gives each of the 7 kinds of fault that share of groups, 1.4 in all; "
        "at most one fault per group: use --fault-rate <= 1/7 (0.1428)"
    )


def test_fault_rates_that_add_up_past_one_are_named():
    line = _refused(["synth", "--malformed-rate", "0.6", "--late-rate", "0.5"])
    assert line.startswith("error: --malformed-rate 0.6, --late-rate 0.5 add up to 1.1; at most one fault "
                           "per group"), line


def test_every_rate_flag_of_synth_says_what_it_does():
    rates = [o for o in options_of(("synth",)) if o.opts[0].endswith("-rate")]
    assert len(rates) == 9  # --rate, --fault-rate and one per kind of fault
    for option in rates:
        assert option.help and len(option.help) > 20, option.opts


def test_synth_group_size_help_is_about_what_synth_sends():
    (option,) = [o for o in options_of(("synth",)) if o.opts == ["--group-size"]]
    (worker,) = [o for o in options_of(("run",)) if o.opts == ["--group-size"]]
    assert "to send" in option.help and option.help != worker.help
    assert option.default == 4 and option.show_default


# ---- run: every refused value names its flag ---------------------------------------------------------
@pytest.mark.parametrize(
    "fields,flag",
    [
        ({"max_open_bytes": 0}, "--max-open-mib"),
        ({"max_open_bytes": 1 << 20}, "--max-open-mib"),  # less than one record of the largest size
        ({"max_open_groups": 0}, "--max-open-groups"),
        ({"progress_interval_s": 0}, "--progress-interval"),
        ({"topics": TopicNames("a", "a", "b")}, "--input-topic"),
        ({"topics": TopicNames("a", "b", "b")}, "--output-topic"),
        ({"group_size": 0}, "--group-size"),
        ({"group_timeout_s": -1}, "--group-timeout"),
        ({"commit_interval_s": 0}, "--commit-interval"),
        ({"commit_max_records": 0}, "--commit-max-records"),
        ({"session_timeout_s": 1}, "--session-timeout"),
        ({"closed_group_retention_s": 1}, "--closed-group-retention"),
        ({"metrics_port": 0}, "--metrics-port"),
        ({"instance_id": "a b"}, "--instance-id"),
        ({"advantage_estimator": "x"}, "--advantage-estimator"),
        ({"reward_key": ""}, "--reward-key"),
        ({"group_id": ""}, "--group-id"),
        ({"bootstrap_servers": " "}, "--bootstrap-servers"),
    ],
)
def test_a_configuration_error_starts_with_its_flag(fields, flag):
    with pytest.raises(ConfigError) as caught:
        WorkerConfig(**fields)
    assert str(caught.value).startswith(flag), str(caught.value)


def test_max_open_mib_zero_is_one_line_naming_the_flag_with_the_smallest_allowed():
    line = _refused(["run", "--max-open-mib", "0", "--bootstrap-servers", "127.0.0.1:1"])
    assert line == ("error: --max-open-mib must be at least 64 (room for one record of the largest size), "
                    "got 0")


def test_the_readme_shows_the_two_error_formats_as_the_cli_prints_them():
    readme = README.read_text()
    refused = _refused(["run", "--max-open-mib", "0", "--bootstrap-servers", "127.0.0.1:1"])
    assert f"$ rollout-stream run --max-open-mib 0\n{refused}\n" in readme
    result = _invoke(["run", "--commit-interval", "abc"])
    assert f"$ rollout-stream run --commit-interval abc\n{result.stderr}" in readme


# ---- bootstrap addresses: one parser ------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,addresses",
    [
        ("localhost", [("localhost", 9092)]),
        ("localhost:9094", [("localhost", 9094)]),
        (" a:1 , b ,", [("a", 1), ("b", 9092)]),
        ("[::1]", [("::1", 9092)]),
        ("[::1]:19092", [("::1", 19092)]),
        ("k-0.svc:9093,k-1.svc:9093", [("k-0.svc", 9093), ("k-1.svc", 9093)]),
    ],
)
def test_bootstrap_addresses_default_to_port_9092(text, addresses):
    assert bootstrap_addresses(text) == addresses


@pytest.mark.parametrize(
    "text,says",
    [
        ("localhost:abc", "the port 'abc' is not a TCP port"),
        ("localhost:0", "the port '0' is not a TCP port"),
        ("localhost:65536", "the port '65536' is not a TCP port"),
        ("localhost:", "the port '' is not a TCP port"),
        (":9092", "has no host"),
        ("PLAINTEXT://kafka:9092", "without a scheme"),
        ("::1", "in brackets, [::1]:9092"),
        ("[::1", "is not [IPv6-address]:port"),
        (" , ", "no address given"),
    ],
)
def test_a_bad_bootstrap_address_is_named(text, says):
    with pytest.raises(BadBootstrap, match=re.escape(says)):
        bootstrap_addresses(text)


def test_a_connection_spells_its_addresses_one_way():
    assert Connection("localhost, [::1]").bootstrap_servers == "localhost:9092,[::1]:9092"
    assert client_settings(Connection("localhost"))["bootstrap_servers"] == ["localhost:9092"]


@pytest.mark.parametrize("path", [("synth",), ("dlq", "stats"), ("topics", "create"), ("tail",), ("run",)],
                         ids=" ".join)
def test_a_bad_bootstrap_flag_is_a_usage_error_naming_the_flag(path):
    line = _refused([*path, "--bootstrap-servers", "localhost:abc"])
    flag = "--bootstrap-servers (or KAFKA_BOOTSTRAP_SERVERS)"
    assert line.startswith(f"error: {flag}: 'localhost:abc': the port 'abc' is not a TCP port"), line
    assert "invalid literal" not in line


def test_a_bad_bootstrap_in_a_kafka_config_file_names_the_file(tmp_path):
    config = tmp_path / "client.properties"
    config.write_text("bootstrap.servers=kafka:nine\n")
    line = _refused(["dlq", "stats", "--kafka-config", str(config)])
    assert line.startswith(f"error: bootstrap.servers in {config}: 'kafka:nine': the port 'nine'"), line


def test_bootstrap_without_a_port_dials_9092(monkeypatch):
    dialled: list[tuple[str, int]] = []

    def refuse(address, *args, **kwargs):
        dialled.append(address)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(socket, "create_connection", refuse)
    result = _invoke(["dlq", "stats", "--bootstrap-servers", "localhost"])
    assert result.exit_code == 1, result.output
    assert dialled == [("localhost", 9092)]
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: cannot reach Kafka at localhost:9092 (localhost:9092: "), line
    assert "invalid literal" not in line
