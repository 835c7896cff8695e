"""`rollout-stream broker …` as a user runs it: a subprocess per command, the broker outliving each one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata

from stream.tools.broker.local import LocalBroker
from stream.tools.broker.process import free_port, port_accepts

pytestmark = pytest.mark.kafka(timeout=60)

CLI = Path(sys.prefix) / "bin" / "rollout-stream"  # the installed entry point (.venv/bin/rollout-stream)


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 50
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=env or base_env(),
                          timeout=timeout, check=False)  # fmt: skip


def base_env(**changes: str) -> dict[str, str]:
    """This environment without settings that would redirect the broker commands."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ROLLOUT_STREAM_BROKER_") and k != "JAVA_HOME"}  # fmt: skip
    env.update(changes)
    return env


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, "expected an error line on stderr"
    assert lines[-1].startswith("error: "), result.stderr
    assert not any(line.startswith("Traceback") for line in lines), result.stderr
    return lines[-1]


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh --data-dir; whatever the test left running there is stopped afterwards."""
    path = tmp_path / "kafka"
    yield path
    LocalBroker(data_dir=path).stop(timeout=10)


@pytest.fixture
def only_java_on_path(tmp_path: Path) -> str:
    """A PATH with `java` and nothing else (so no `mvn`)."""
    bin_dir = tmp_path / "only-java"
    bin_dir.mkdir()
    java = subprocess.run(
        ["sh", "-c", "command -v java"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if not java:
        pytest.fail("java is not on PATH: the broker tests need Java >= 17")
    (bin_dir / "java").symlink_to(os.path.realpath(java))
    return str(bin_dir)


def process_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def test_start_use_status_stop(data_dir):
    port = free_port()
    started = cli("broker", "start", "--port", str(port), "--data-dir", str(data_dir))
    assert started.returncode == 0, started.stderr
    bootstrap = started.stdout.strip()
    assert bootstrap == f"127.0.0.1:{port}"  # stdout is the address alone, for $(...)
    assert "ready in" in started.stderr

    # An independent client: transaction commit + abort, read_committed, group commit.
    topic = f"cli-{uuid.uuid4().hex[:10]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}}, wait_for_metadata=True)
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"cli-{uuid.uuid4().hex}",
                             max_block_ms=20000)  # fmt: skip
    try:
        producer.init_transactions()
        for value, commit in ((b"kept", True), (b"dropped", False), (b"end", True)):
            producer.begin_transaction()
            producer.send(topic, value)
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close(timeout=5)
    tp, group = TopicPartition(topic, 0), f"g-{uuid.uuid4().hex[:10]}"
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, isolation_level="read_committed",
        auto_offset_reset="earliest", enable_auto_commit=False,
    )  # fmt: skip
    try:
        seen: list[bytes] = []
        for _ in range(100):
            seen += [r.value for records in consumer.poll(timeout_ms=200).values() for r in records]
            if b"end" in seen:
                break
        assert seen == [b"kept", b"end"]
        consumer.commit({tp: OffsetAndMetadata(len(seen), "", -1)})
        assert consumer.committed(tp) == 2
    finally:
        consumer.close()

    status = cli("broker", "status", "--data-dir", str(data_dir))
    assert status.returncode == 0, status.stderr
    assert f"bootstrap={bootstrap}" in status.stdout
    pid = int(status.stdout.split("pid=")[1].split()[0])
    assert "kafka.Kafka" in Path(f"/proc/{pid}/cmdline").read_bytes().decode()
    # The collector's log, as Kafka's scripts keep it: where a client's slowest groups are explained
    gc_log = (data_dir / "logs" / "kafkaServer-gc.log").read_text()
    assert "Using G1" in gc_log, gc_log[-2000:]

    again = cli("broker", "start", "--port", str(port), "--data-dir", str(data_dir))
    assert (again.returncode, again.stdout.strip()) == (0, bootstrap)
    assert "already running" in again.stderr

    stopped = cli("broker", "stop", "--data-dir", str(data_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert f"stopped broker pid {pid}" in stopped.stderr
    assert process_gone(pid)
    assert not port_accepts(port)

    after = cli("broker", "status", "--data-dir", str(data_dir))
    assert after.returncode == 3 and after.stdout.startswith("stopped")
    assert cli("broker", "stop", "--data-dir", str(data_dir)).returncode == 0  # stopping twice is fine


def test_port_in_use_is_a_config_error(data_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = cli("broker", "start", "--port", str(port), "--data-dir", str(data_dir))
    assert result.returncode == 2
    assert f"port {port}" in one_error_line(result) and "--port" in one_error_line(result)
    assert result.stdout == ""
    assert not (data_dir / "broker.json").exists()


def test_no_java_is_a_config_error(data_dir, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    result = cli("broker", "start", "--port", str(free_port()), "--data-dir", str(data_dir),
                 env=base_env(PATH=str(empty)))  # fmt: skip
    assert result.returncode == 2
    line = one_error_line(result)
    assert "java not found" in line and "JAVA_HOME" in line


def test_java_home_without_java_is_a_config_error(data_dir, tmp_path):
    result = cli("broker", "start", "--port", str(free_port()), "--data-dir", str(data_dir),
                 env=base_env(JAVA_HOME=str(tmp_path)))  # fmt: skip
    assert result.returncode == 2
    assert f"JAVA_HOME={tmp_path}" in one_error_line(result)


def test_no_maven_with_an_empty_jar_cache_is_a_config_error(data_dir, tmp_path, only_java_on_path):
    cache = tmp_path / "empty-cache"
    env = base_env(PATH=only_java_on_path, ROLLOUT_STREAM_CACHE=str(cache))
    result = cli("broker", "start", "--port", str(free_port()), "--data-dir", str(data_dir), env=env)
    assert result.returncode == 2
    line = one_error_line(result)
    assert "not cached" in line and "mvn" in line and str(cache) in line


def test_cached_jars_need_no_maven(only_java_on_path):
    assert cli("broker", "fetch-jars").returncode == 0  # fills the default cache if `make jars` did not
    result = cli("broker", "fetch-jars", env=base_env(PATH=only_java_on_path))
    assert result.returncode == 0, result.stderr
    assert "already cached" in result.stderr
    assert any(Path(result.stdout.strip()).glob("kafka_2.13-*.jar"))


def test_broker_dying_during_start_reports_the_cause_and_the_log(data_dir):
    result = cli("broker", "start", "--port", str(free_port()), "--data-dir", str(data_dir),
                 "--override", "authorizer.class.name=does.not.Exist")  # fmt: skip
    assert result.returncode == 1
    line = one_error_line(result)
    log = data_dir / "logs" / "broker.log"
    assert "exited with code" in line
    assert "ClassNotFoundException: does.not.Exist" in line
    assert f"tail -n 20 {log.resolve()}" in line
    assert "does.not.Exist" in log.read_text()
    assert cli("broker", "status", "--data-dir", str(data_dir)).returncode == 3


def test_override_of_a_managed_key_is_refused(data_dir):
    result = cli("broker", "start", "--data-dir", str(data_dir), "--override", "listeners=PLAINTEXT://:1")
    assert result.returncode == 2
    assert "set by rollout-stream itself" in one_error_line(result)
