"""Without --bootstrap-servers, the operator commands use the local broker of ./.kafka-data only when it runs,
and `demo`, which starts it, run outside the repository while a local broker is up elsewhere, says which
address to pass, never `--port` (it has none); none of them creates anything where it runs.

`demo`'s local broker listens on 9092; here it is asked for a port this test controls (another engineer's demo
broker may hold 9092), by handing commands/local.py a LocalBroker with that port.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rollout_stream.commands.local
from rollout_stream.broker import LocalBroker, PortInUse, running_brokers
from rollout_stream.broker.process import free_port
from rollout_stream.cli import app
from rollout_stream.commands.connection import NO_ADDRESS

runner = CliRunner()


@pytest.fixture(scope="module")
def other_broker(kafka_bootstrap, tmp_path_factory) -> Iterator[LocalBroker]:
    """A local broker running from another data dir: the session's, if it is one, else one started here."""
    found = next((b for b in running_brokers() if b.bootstrap == kafka_bootstrap), None)
    if found is not None:
        yield LocalBroker(port=found.port or 0, data_dir=found.data_dir)
        return
    broker = LocalBroker(port=free_port(), data_dir=tmp_path_factory.mktemp("other") / ".kafka-data")
    broker.start(timeout=90.0)
    try:
        yield broker
    finally:
        broker.stop(timeout=20.0)


@pytest.fixture
def elsewhere(tmp_path, monkeypatch) -> Path:
    """An empty working directory outside the repository."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _implicit_broker_on(port: int, monkeypatch) -> None:
    local = functools.partial(LocalBroker, port=port)
    monkeypatch.setattr(rollout_stream.commands.local, "LocalBroker", local)


def _without_bootstrap(args: list[str]):
    return runner.invoke(app, args, env={"KAFKA_BOOTSTRAP_SERVERS": None, "KAFKA_CONFIG_FILE": None,
                                         "COLUMNS": "200"})


def test_running_brokers_finds_a_local_broker_by_its_data_dir(other_broker):
    (found,) = [b for b in running_brokers() if b.data_dir == other_broker.data_dir]
    assert found.running and found.port == other_broker.port
    assert found.bootstrap == f"127.0.0.1:{other_broker.port}"


def test_an_operator_command_elsewhere_starts_nothing_and_says_how_to_give_an_address(
    other_broker, elsewhere
):
    result = _without_bootstrap(["dlq", "stats"])
    assert (result.exit_code, result.stdout, result.stderr.splitlines()) == (2, "", [f"error: {NO_ADDRESS}"])
    assert os.listdir(elsewhere) == []


def test_an_operator_command_uses_the_local_broker_running_here(other_broker, elsewhere, monkeypatch):
    monkeypatch.setattr(rollout_stream.commands.local, "DEFAULT_DATA_DIR", other_broker.data_dir)
    result = _without_bootstrap(["dlq", "stats", "--dead-letter-topic", "no-such-topic-here", "--json"])
    assert "no-such-topic-here" in result.stderr  # reached that broker: it has no such topic
    assert "no Kafka address" not in result.stderr
    assert os.listdir(elsewhere) == []


def test_demo_elsewhere_names_the_running_local_broker_and_the_address_to_pass(
    other_broker, elsewhere, monkeypatch
):
    _implicit_broker_on(other_broker.port, monkeypatch)
    result = _without_bootstrap(["demo"])
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    pid = other_broker.status().pid
    assert line == (
        f"error: no --bootstrap-servers given and no local broker runs from {elsewhere / '.kafka-data'}; "
        f"port {other_broker.port} is taken by the local broker from {other_broker.data_dir} (pid {pid}): "
        f"to use that one, pass --bootstrap-servers 127.0.0.1:{other_broker.port}"
    )
    assert "--port" not in line
    assert os.listdir(elsewhere) == []  # no empty .kafka-data left behind


def test_the_suggested_address_works(other_broker, elsewhere):
    result = runner.invoke(app, ["dlq", "stats", "--bootstrap-servers", f"127.0.0.1:{other_broker.port}",
                                 "--dead-letter-topic", "no-such-topic-here", "--json"],
                           env={"KAFKA_CONFIG_FILE": None})
    assert "no-such-topic-here" in result.stderr  # reached that broker: it has no such topic
    assert "no --bootstrap-servers given" not in result.stderr
    assert os.listdir(elsewhere) == []


def test_a_port_held_by_something_else_suggests_the_address_and_creates_nothing(elsewhere, monkeypatch):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        _implicit_broker_on(port, monkeypatch)
        result = _without_bootstrap(["demo"])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line == (
        f"error: no --bootstrap-servers given and no local broker runs from {elsewhere / '.kafka-data'}; it "
        f"cannot start there: port {port} on 127.0.0.1 is in use by another process (if that is Kafka, pass "
        f"--bootstrap-servers 127.0.0.1:{port})"
    )
    assert os.listdir(elsewhere) == []


def test_broker_start_on_a_taken_port_names_the_broker_there_and_creates_nothing(other_broker, elsewhere):
    data_dir = elsewhere / "new-broker"
    result = runner.invoke(
        app, ["broker", "start", "--data-dir", str(data_dir), "--port", str(other_broker.port)]
    )
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert f"in use by the local broker from {other_broker.data_dir}" in line
    assert "pick another with --port" in line  # `broker start` has one
    assert not data_dir.exists()


def test_port_in_use_carries_the_port_and_the_broker_holding_it(other_broker, elsewhere):
    with pytest.raises(PortInUse) as caught:
        LocalBroker(port=other_broker.port).ensure_running()
    assert caught.value.port == other_broker.port
    assert caught.value.holder is not None and caught.value.holder.data_dir == other_broker.data_dir
    assert not (elsewhere / ".kafka-data").exists()
