"""A single-node Apache Kafka (KRaft) for development and tests, run from Maven jars in the background; also
one node of a local cluster (`cluster.py`), when given its `ClusterNode`.

Data dir layout (default ``./.kafka-data``):
    server.properties, log4j2.properties   rewritten at every start
    kafka-logs/                           the broker's log dir (formatted once)
    logs/broker.log                       JVM output + WARN-and-above log4j lines (previous run: .1)
    logs/kafkaServer-gc.log               the JVM's garbage collections, as Kafka's own scripts keep it
    cluster.json                          cluster id and controller port, kept across restarts
    broker.json                           pid/port/bootstrap of the running broker (removed on stop)
    secure/                               `secure=True` only: CA, certificates, SCRAM passwords, client
                                          properties (see stream/broker/secure.py)
"""

from __future__ import annotations

import ssl
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from rollout_stream.broker.disk import disk_cause, ran_out_of_space, require_room
from rollout_stream.broker.errors import (
    BrokerAlreadyRunning,
    BrokerConfigError,
    BrokerStartFailed,
    PortInUse,
)
from rollout_stream.broker.files import failure_cause, file_size, read_json, read_lines_from, write_json
from rollout_stream.broker.jars import KafkaJars, Progress, resolve_jars
from rollout_stream.broker.java import JavaRuntime, find_java
from rollout_stream.broker.process import (
    StopOutcome,
    arguments_after,
    command_line,
    exclusive,
    free_port,
    is_alive,
    kill,
    port_accepts,
    port_is_free,
    terminate,
)
from rollout_stream.broker.properties import ClusterNode, log4j2_properties, new_cluster_id, server_properties
from rollout_stream.broker.secure import (
    ADMIN_USER,
    SecureMaterial,
    prepare_secure_material,
    scram_format_arguments,
    secure_listener_properties,
    write_private,
)
from rollout_stream.clients import Connection
from rollout_stream.kafka import KafkaFailure, client_for

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_PORT",
    "BrokerStatus",
    "LocalBroker",
    "StopOutcome",
    "running_brokers",
]

DEFAULT_PORT = 9092
DEFAULT_DATA_DIR = Path(".kafka-data")
_TAIL_LINES = 20
_LOG_SCAN = 1 << 20  # how much of a log's end `why_stopped` reads
_MAIN_CLASS = "kafka.Kafka"


# kafka-run-class.sh's file name and decorations, rotated in less space (a development broker)
GC_LOG_NAME = "kafkaServer-gc.log"
_GC_LOG_OUTPUT = ":time,tags:filecount=5,filesize=20M"


@dataclass(frozen=True)
class BrokerStatus:
    """What `LocalBroker.status()` found in a data dir."""

    state: Literal["running", "stopped"]
    data_dir: Path
    log_path: Path
    pid: int | None = None
    port: int | None = None
    bootstrap: str | None = None
    secure: bool = False  # SASL_SSL listener, SCRAM users, ACLs on

    @property
    def running(self) -> bool:
        return self.state == "running"


@dataclass
class LocalBroker:
    """One broker+controller node on 127.0.0.1:`port`, its files in `data_dir`; survives the caller's exit.

    cache_dir: jar cache root (None: $ROLLOUT_STREAM_CACHE, else ~/.cache/rollout-stream).
    overrides: extra server.properties entries (not the listener/port/dir keys, which are managed here).
    progress: receives progress lines (jar download, format, start); None = silent.
    secure: a SASL_SSL listener (self-signed CA, SCRAM-SHA-512/256 users admin and worker) and the
        StandardAuthorizer with ACLs on, instead of PLAINTEXT. Fixed when the data dir is formatted.
    cluster: this is one node of a local cluster (its id, the cluster id, every voter's controller port);
        None: a single node that is its own quorum.
    """

    port: int = DEFAULT_PORT
    data_dir: Path = DEFAULT_DATA_DIR
    cache_dir: Path | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)
    # Room to grow under load: with a fixed heap of 512 MiB, a bench's load kept G1's old generation full,
    # and every client's p99 at that load was its pauses; 1 GiB still paused (docs/benchmarks.md). G1 starts
    # small and grows the heap when collections take too much of the time.
    jvm_options: tuple[str, ...] = ("-Xms512m", "-Xmx2g")
    progress: Progress | None = field(default=None, repr=False)
    secure: bool = False
    cluster: ClusterNode | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False, compare=False)
    _material: SecureMaterial | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Absolute once, so a later chdir does not move the broker; canonical, so the pid check matches.
        self.data_dir = Path(self.data_dir).expanduser().resolve()

    # -- paths --------------------------------------------------------------------------------------
    @property
    def log_path(self) -> Path:
        return self.data_dir / "logs" / "broker.log"

    @property
    def gc_log_path(self) -> Path:
        """Its collections with their pauses: a client's slowest groups were those sent during one
        (docs/benchmarks.md)."""
        return self.data_dir / "logs" / GC_LOG_NAME

    @property
    def _properties_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def _log_dirs(self) -> Path:
        return self.data_dir / "kafka-logs"

    @property
    def _state_path(self) -> Path:
        return self.data_dir / "broker.json"

    @property
    def _cluster_path(self) -> Path:
        return self.data_dir / "cluster.json"

    @property
    def secure_dir(self) -> Path:
        return self.data_dir / "secure"

    def material(self) -> SecureMaterial:
        """The certificates and credentials of the secured broker (created if missing)."""
        if self._material is None:
            self._material = prepare_secure_material(self.secure_dir)
        return self._material

    def client_connection(
        self, bootstrap: str, user: str = ADMIN_USER, client_id: str = "rollout-stream"
    ) -> Connection:
        """A Connection to this broker: PLAINTEXT, or logged in as `user` when secured."""
        if not self.secure:
            return Connection(bootstrap, client_id=client_id)
        return Connection(bootstrap, client_id=client_id, security=self.material().security(user))

    # -- queries ------------------------------------------------------------------------------------
    def status(self) -> BrokerStatus:
        """Running if the pid in broker.json is alive and is a kafka.Kafka started from this data dir."""
        state = read_json(self._state_path)
        pid = state.get("pid")
        if isinstance(pid, int) and is_alive(pid) and self._is_our_broker(pid):
            return BrokerStatus(
                "running", self.data_dir, self.log_path, pid=pid, port=state.get("port"),
                bootstrap=state.get("bootstrap"), secure=bool(state.get("secure")),
            )  # fmt: skip
        return BrokerStatus("stopped", self.data_dir, self.log_path)

    def why_stopped(self) -> str | None:
        """Why a broker that is not running stopped, when it was the disk: its log says it ran out of space,
        or its last start wrote nothing (a JVM on a full disk exits before its first line) and room is
        short."""
        lines = read_lines_from(self.log_path, max(0, file_size(self.log_path) - _LOG_SCAN))
        if ran_out_of_space(lines) or not any(line.strip() for line in lines):
            return disk_cause(self.data_dir, lines)
        return None

    def _is_our_broker(self, pid: int) -> bool:
        """Guards against pid reuse: only signal a process that is our broker."""
        cmd = command_line(pid)
        return cmd is not None and _MAIN_CLASS in cmd and str(self._properties_path) in cmd

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> str:
        """Start the broker (or return the address of the one already running here on the same port).

        Fetches the jars on first use and formats the data dir once. `timeout` bounds the wait for
        readiness (port accepts connections and a metadata request is answered), not the jar download.
        Returns the bootstrap address "127.0.0.1:PORT".
        """
        return self._start(timeout, any_port=False)

    def ensure_running(self, timeout: float = 60.0) -> str:
        """The address of the broker running from `data_dir` (whatever its port); started if there is none."""
        current = self.status()
        if current.running and current.bootstrap:
            return current.bootstrap
        return self._start(timeout, any_port=True)

    def stop(self, timeout: float = 30.0) -> StopOutcome:
        """SIGTERM and wait up to `timeout` s for a clean shutdown, then SIGKILL."""
        if not self.data_dir.is_dir():
            return "not_running"
        with exclusive(self.data_dir / ".start.lock"):
            current = self.status()
            outcome: StopOutcome = "not_running"
            if current.running and current.pid is not None:
                outcome = terminate(current.pid, timeout)
            self._state_path.unlink(missing_ok=True)
            if self._proc is not None:
                self._proc.poll()  # reap our child (no zombie, no ResourceWarning)
                self._proc = None
            return outcome

    def kill(self) -> bool:
        """SIGKILL, no clean shutdown: a crashed broker. False: it was not running."""
        with exclusive(self.data_dir / ".start.lock"):
            current = self.status()
            killed = current.pid is not None and kill(current.pid)
            self._state_path.unlink(missing_ok=True)
            if self._proc is not None:
                self._proc.poll()
                self._proc = None
            return killed

    def _start(self, timeout: float, *, any_port: bool) -> str:
        if not 0 < self.port < 65536:
            raise BrokerConfigError(f"port {self.port} is not a TCP port: use 1..65535")
        # Whatever can refuse the start is asked before the data dir exists: a refused start leaves nothing.
        if (running := self._running_address(any_port)) is not None:
            return running
        self._require_free_port()
        require_room(self.data_dir)
        java = find_java()
        jars = resolve_jars(self.cache_dir, progress=self.progress)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with exclusive(self.data_dir / ".start.lock"):  # two callers of ensure_running start one broker
            if (running := self._running_address(any_port)) is not None:
                return running
            self._state_path.unlink(missing_ok=True)
            self._require_free_port()
            self._rotate_log()
            controller_port = self._prepare(java, jars)
            return self._launch(java, jars, controller_port, timeout)

    def launch(self) -> tuple[str, float, int]:
        """Spawn the JVM without waiting for it (a node of a cluster is ready only once a quorum of voters
        runs, so every node is launched before any is waited for). Returns (bootstrap, started, log offset)
        for `wait_ready`. The caller holds the cluster's lock and has checked that the port is free."""
        java = find_java()
        jars = resolve_jars(self.cache_dir, progress=self.progress)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._state_path.unlink(missing_ok=True)
        self._rotate_log()
        controller_port = self._prepare(java, jars)
        return self._spawn(java, jars, controller_port)

    def wait_ready(self, launched: tuple[str, float, int], timeout: float) -> None:
        """Wait until the node `launch` started is ready (as `start` does); stop it if it never becomes so."""
        bootstrap, started, offset = launched
        self._await(bootstrap, started, offset, timeout)

    def _running_address(self, any_port: bool) -> str | None:
        """The address of the broker running from this data dir if it may serve this start; None: none
        runs."""
        current = self.status()
        if not (current.running and current.bootstrap):
            return None
        if any_port or current.port == self.port:
            return current.bootstrap
        raise BrokerAlreadyRunning(
            f"a broker from {self.data_dir} already runs on port {current.port} (pid {current.pid}): "
            f"use --port {current.port}, or stop it first (rollout-stream broker stop --data-dir "
            f"{self.data_dir})"
        )

    def _require_free_port(self) -> None:
        if port_is_free(self.port):
            return
        holder = next((b for b in running_brokers() if b.port == self.port), None)
        if holder is not None:
            raise PortInUse(
                f"port {self.port} on 127.0.0.1 is in use by the local broker from {holder.data_dir} (pid "
                f"{holder.pid}): pick another with --port, or stop that broker (rollout-stream broker stop "
                f"--data-dir {holder.data_dir})", port=self.port, holder=holder,
            )  # fmt: skip
        raise PortInUse(
            f"port {self.port} on 127.0.0.1 is already in use (another Kafka? see `ss -ltnp "
            f"'sport = :{self.port}'`): pick another with --port, or stop that process", port=self.port,
        )  # fmt: skip

    # -- steps of a start ---------------------------------------------------------------------------
    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def _rotate_log(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.exists() and self.log_path.stat().st_size > 0:
            self.log_path.replace(self.log_path.with_name(self.log_path.name + ".1"))

    def _prepare(self, java: JavaRuntime, jars: KafkaJars) -> int:
        """Write the config files; format the log dir if it never was. Returns the controller port."""
        cluster = read_json(self._cluster_path)
        stored = cluster.get("controller_port")
        keep = isinstance(stored, int) and stored != self.port and port_is_free(stored)
        # not the listener's, which may be chosen but not bound yet (Kafka refuses one port for both)
        controller_port = stored if keep and isinstance(stored, int) else free_port(avoid={self.port})
        if self.cluster is not None:  # the quorum's voters are fixed: every node lists every voter's port
            controller_port = self.cluster.controller_port
        formatted = (self._log_dirs / "meta.properties").exists()
        if formatted and bool(cluster.get("secure")) != self.secure:
            raise BrokerConfigError(
                f"{self.data_dir} holds a {'secured' if cluster.get('secure') else 'PLAINTEXT'} cluster: "
                f"start it {'with' if cluster.get('secure') else 'without'} --secure, or use another "
                "--data-dir")
        material = self.material() if self.secure else None
        text = server_properties(
            port=self.port,
            controller_port=controller_port,
            log_dirs=self._log_dirs,
            overrides=self.overrides,
            secure=secure_listener_properties(material, port=self.port, controller_port=controller_port)
            if material else None,
            cluster=self.cluster,
        )
        if material is not None:
            write_private(self._properties_path, text)  # holds the broker key and the admin password
            material.write_client_properties(f"127.0.0.1:{self.port}")
        else:
            self._properties_path.write_text(text)
        (self.data_dir / "log4j2.properties").write_text(log4j2_properties())
        if not formatted:
            cluster["cluster_id"] = self._format(java, jars, material)
            cluster["secure"] = self.secure
        cluster.update(controller_port=controller_port, kafka_version=jars.version)
        write_json(self._cluster_path, cluster)
        return controller_port

    def _format(self, java: JavaRuntime, jars: KafkaJars, material: SecureMaterial | None = None) -> str:
        cluster_id = self.cluster.cluster_id if self.cluster is not None else new_cluster_id()
        self._say(f"formatting {self._log_dirs} (cluster id {cluster_id})")
        tool = ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self._properties_path)]
        if self.cluster is None:  # a quorum of one; a cluster's nodes name their voters statically instead
            tool.append("--standalone")
        argfile = self.data_dir / ".format.args"
        if material is not None:
            # SCRAM users are created with the cluster (--add-scram); the java launcher reads the main class
            # and its arguments from an @argfile, so the passwords never show in the process list.
            lines = ['"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'
                     for arg in (*tool, *scram_format_arguments(material))]
            write_private(argfile, "\n".join(lines) + "\n")
            tool = [f"@{argfile}"]
        command = [
            str(java.executable), "-Xmx256m",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp", jars.classpath, *tool,
        ]  # fmt: skip
        offset = file_size(self.log_path)
        with open(self.log_path, "ab") as log:
            try:
                rc = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=120, check=False).returncode  # fmt: skip
            except subprocess.TimeoutExpired:
                rc = -1
            finally:
                argfile.unlink(missing_ok=True)
        if rc != 0:
            raise self._failure(f"formatting {self._log_dirs} failed (exit {rc})", offset)
        return cluster_id

    def _launch(self, java: JavaRuntime, jars: KafkaJars, controller_port: int, timeout: float) -> str:
        bootstrap, started, offset = self._spawn(java, jars, controller_port)
        self._await(bootstrap, started, offset, timeout)
        return bootstrap

    def _spawn(self, java: JavaRuntime, jars: KafkaJars, controller_port: int) -> tuple[str, float, int]:
        command = [
            str(java.executable), *self.jvm_options,
            "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true",
            f"-Xlog:gc*:file={self.gc_log_path}{_GC_LOG_OUTPUT}",
            f"-Dkafka.logs.dir={self.log_path.parent}",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp", jars.classpath, _MAIN_CLASS, str(self._properties_path),
        ]  # fmt: skip
        bootstrap = f"127.0.0.1:{self.port}"
        offset = file_size(self.log_path)
        started = time.monotonic()
        with open(self.log_path, "ab") as log:
            # Own session: no terminal signals (Ctrl-C in the shell that started it), outlives this process.
            self._proc = subprocess.Popen(
                command, cwd=self.data_dir, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )  # fmt: skip
        pid = self._proc.pid
        write_json(self._state_path, {
            "pid": pid, "port": self.port, "controller_port": controller_port, "bootstrap": bootstrap,
            "kafka_version": jars.version, "java": str(java.executable), "started_at": time.time(),
            "log_path": str(self.log_path), "secure": self.secure,
        })  # fmt: skip
        node = f"node {self.cluster.node_id} " if self.cluster is not None else ""
        self._say(f"starting Kafka {jars.version} {node}(pid {pid}) on {bootstrap}, log: {self.log_path}")
        return bootstrap, started, offset

    def _await(self, bootstrap: str, started: float, offset: int, timeout: float) -> None:
        assert self._proc is not None
        pid = self._proc.pid
        try:
            self._wait_ready(bootstrap, started + timeout, timeout, offset)
        except BaseException:  # also Ctrl-C: never leave a half-started broker behind
            terminate(pid, 10.0)
            self._state_path.unlink(missing_ok=True)
            self._proc.poll()
            self._proc = None
            raise
        self._say(f"{bootstrap} ready in {time.monotonic() - started:.1f} s")

    def _wait_ready(self, bootstrap: str, deadline: float, timeout: float, log_offset: int) -> None:
        assert self._proc is not None
        while True:
            rc = self._proc.poll()
            if rc is not None:
                raise self._failure(f"the broker exited with code {rc} during start", log_offset)
            if port_accepts(self.port) and self._answers_metadata(bootstrap, deadline):
                return
            if time.monotonic() >= deadline:
                raise self._failure(f"the broker did not become ready within {timeout:g} s", log_offset)
            time.sleep(0.1)

    def _answers_metadata(self, bootstrap: str, deadline: float) -> bool:
        """A metadata round trip lists this broker unfenced: clients can use it now."""
        budget_ms = int(min(5.0, max(1.0, deadline - time.monotonic())) * 1000)
        conn = self.client_connection(bootstrap, client_id="rollout-stream-broker-probe")
        tuning: dict[str, object] = {"request_timeout_ms": budget_ms, "bootstrap_timeout_ms": budget_ms}
        if self.secure:
            # Readiness only: the broker just launched here is up even if its certificate has expired (tests
            # need one), and the SCRAM login proves it knows the admin password anyway. Clients do verify.
            if conn.client == "confluent":  # librdkafka has no SSLContext: its own switch
                tuning["enable.ssl.certificate.verification"] = False
            else:
                probe_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                probe_tls.check_hostname, probe_tls.verify_mode = False, ssl.CERT_NONE
                tuning.update(ssl_context=probe_tls, ssl_check_hostname=False)
        try:
            admin = client_for(conn).admin(client_id=conn.client_id, **tuning)
            try:
                return admin.broker_ready(self.port)
            finally:
                admin.close()
        except (KafkaFailure, OSError):
            return False

    def _failure(self, what: str, log_offset: int) -> BrokerStartFailed:
        """One line: what happened, the most telling log line, where the log is."""
        lines = read_lines_from(self.log_path, log_offset)
        tail = lines[-_TAIL_LINES:]
        # A JVM on a full disk may exit before it writes a line: the free space is then the cause to name.
        cause = disk_cause(self.data_dir, lines) or failure_cause(lines)
        message = f"{what}: {cause} (last {_TAIL_LINES} log lines: tail -n {_TAIL_LINES} {self.log_path})"
        return BrokerStartFailed(message, log_path=self.log_path, log_tail=tail)


def running_brokers() -> list[BrokerStatus]:
    """The local brokers running on this machine, whatever their data dir (found by their command lines)."""
    found = []
    for _pid, properties in arguments_after(_MAIN_CLASS):
        path = Path(properties)
        if path.name == "server.properties" and path.is_absolute():
            status = LocalBroker(data_dir=path.parent).status()
            if status.running:
                found.append(status)
    return found
