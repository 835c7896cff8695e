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

from rollout_stream.broker.local import LocalBroker
from rollout_stream.broker.process import free_port, port_accepts

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


def test_too_little_free_space_is_refused_before_anything_is_written(data_dir):
    old_topics = data_dir / "kafka-logs" / "t-0"
    old_topics.mkdir(parents=True)
    (old_topics / "00000000000000000000.log").write_bytes(os.urandom(3 << 20))  # no filesystem shrinks it
    more_than_any_disk = str(1 << 40)  # MiB
    result = cli("broker", "start", "--port", str(free_port()), "--data-dir", str(data_dir),
                 env=base_env(ROLLOUT_STREAM_BROKER_MIN_FREE_MIB=more_than_any_disk))  # fmt: skip
    assert result.returncode == 2
    line = one_error_line(result)
    assert f"free on the filesystem of {data_dir.resolve()}" in line
    assert "itself holds 3.0 MiB" in line and f"broker stop --data-dir {data_dir.resolve()}" in line
    assert not (data_dir / "broker.json").exists() and not (data_dir / "logs").exists()

    result = cli("broker", "start", "--port", str(free_port()), "--data-dir", str(data_dir),
                 env=base_env(ROLLOUT_STREAM_BROKER_MIN_FREE_MIB="1G"))
    assert result.returncode == 2
    assert "ROLLOUT_STREAM_BROKER_MIN_FREE_MIB='1G' is not a number of MiB" in one_error_line(result)

    cluster_dir = data_dir.parent / "cluster"
    result = cli("broker", "start", "--nodes", "3", "--port", str(free_port()),
                 "--data-dir", str(cluster_dir),
                 env=base_env(ROLLOUT_STREAM_BROKER_MIN_FREE_MIB=more_than_any_disk))  # fmt: skip
    assert result.returncode == 2
    assert f"free on the filesystem of {cluster_dir.resolve()}" in one_error_line(result)
    assert not cluster_dir.exists()  # no layout fixed by a start that was refused


# What Kafka 4.1 logs when its only log directory fills up (a development broker here, 2026-12-02).
_DISK_FULL_LOG = "\n".join([
    "[2026-12-02 01:21:23,101] ERROR Error while appending records to t-0 in dir {logs} "
    "(kafka.server.LogDirFailureChannel)",
    "java.io.IOException: No space left on device",
    "\tat org.apache.kafka.storage.internals.log.LocalLog.maybeHandleIOException(LocalLog.java:816) "
    "~[kafka-storage-4.1.1.jar:?]",
    "[2026-12-02 01:21:23,238] WARN [ReplicaManager broker=1] Stopping serving replicas in dir {logs} "
    "with uuid Some(BmcFDA20RfWzKbutCcGpSQ) because the log directory has failed. "
    "(kafka.server.ReplicaManager)",
    "[2026-12-02 01:21:23,249] ERROR Shutdown broker because all log dirs in {logs} have failed "
    "(kafka.log.LogManager)",
    "",
])


def test_status_says_when_a_broker_stopped_because_its_disk_filled_up(data_dir):
    logs = data_dir / "logs"
    logs.mkdir(parents=True)
    (logs / "broker.log").write_text(_DISK_FULL_LOG.format(logs=data_dir / "kafka-logs"))
    result = cli("broker", "status", "--data-dir", str(data_dir))
    assert result.returncode == 3 and result.stdout.startswith("stopped")
    assert "it stopped because its log directory failed: No space left on device" in result.stderr
    assert f"free on the filesystem of {data_dir.resolve()} now" in result.stderr

    # A JVM on a full disk exits before its first line: an empty log and too little room say why.
    (logs / "broker.log").rename(logs / "broker.log.1")
    (logs / "broker.log").write_text("")
    short = cli("broker", "status", "--data-dir", str(data_dir),
                env=base_env(ROLLOUT_STREAM_BROKER_MIN_FREE_MIB=str(1 << 40)))  # fmt: skip
    assert short.returncode == 3
    assert "it stopped because only " in short.stderr and "a local broker needs at least" in short.stderr
    assert cli("broker", "status", "--data-dir", str(data_dir)).stderr == ""  # room enough: no guess

    (logs / "broker.log").write_text("[2026-12-02 01:30:00,000] INFO [KafkaRaftServer nodeId=1] shut down\n")
    quiet = cli("broker", "status", "--data-dir", str(data_dir))
    assert quiet.returncode == 3 and quiet.stderr == ""


def test_override_of_a_managed_key_is_refused(data_dir):
    result = cli("broker", "start", "--data-dir", str(data_dir), "--override", "listeners=PLAINTEXT://:1")
    assert result.returncode == 2
    assert "set by rollout-stream itself" in one_error_line(result)
