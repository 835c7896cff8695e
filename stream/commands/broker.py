"""`rollout-stream broker …`: a local Apache Kafka (one node, or a cluster with --nodes) for development and
tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from rollout_stream.broker.cluster import LocalCluster, is_cluster
from rollout_stream.broker.errors import BrokerConfigError
from rollout_stream.broker.jars import cached_jars, default_cache_root, resolve_jars
from rollout_stream.broker.local import DEFAULT_DATA_DIR, DEFAULT_PORT, LocalBroker
from rollout_stream.broker.properties import parse_override
from rollout_stream.commands.options import CommandGroup
from rollout_stream.config import check_seconds

__all__ = ["broker_app", "register"]

EXIT_NOT_RUNNING = 3  # `status`: as an LSB init script's "program is not running"

broker_app = typer.Typer(
    name="broker",
    cls=CommandGroup,
    help=(
        "Run a local Kafka for development and tests: one node, or a cluster of --nodes N (start, stop, "
        "status, kill, restart).\n\n"
        "Apache Kafka (KRaft, broker+controller in one JVM per node) from Maven Central jars, run with the "
        "local Java (>= 17). It runs in the background until `broker stop`, keeps its files in --data-dir "
        "and listens on 127.0.0.1 only.\n\n"
        "Exit codes: 0 ok, 1 runtime failure (jar download, broker died), 2 configuration "
        "(no java/mvn, port taken, under 1 GiB free disk, bad option), 3 `status`: not running."
    ),
    no_args_is_help=True,
)

DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir", envvar="ROLLOUT_STREAM_BROKER_DATA_DIR",
        help="Broker files: config, kafka-logs/ (topic data), logs/broker.log, state. Relative to the "
        "current directory.",
    ),
]  # fmt: skip


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@broker_app.command("start")
def start(
    port: Annotated[
        int,
        typer.Option(
            "--port",
            min=1,
            max=65535,
            envvar="ROLLOUT_STREAM_BROKER_PORT",
            help="PLAINTEXT port on 127.0.0.1 (the KRaft controller takes a free port of its own).",
        ),
    ] = DEFAULT_PORT,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=1.0,
            help="Seconds to wait for readiness once the JVM is launched (jar download not included). "
            "Default: 60, a cluster 120.",
            show_default=False,
        ),
    ] = None,
    override: Annotated[
        list[str] | None,
        typer.Option(
            "--override",
            metavar="KEY=VALUE",
            show_default=False,
            help="Extra server.properties entry; repeatable. E.g. --override num.partitions=3",
        ),
    ] = None,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="SASL_SSL instead of PLAINTEXT: a local CA and broker certificate, SCRAM users admin (super "
            "user) and worker, ACLs on. Fixed when --data-dir is first formatted. See docs/security.md.",
        ),
    ] = False,
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes",
            min=1,
            max=9,
            help="Nodes of a local cluster: node N on --port + N - 1, each a broker and a voter of the "
            "controller quorum, its files in --data-dir/node-N; internal topics replicated min(3, N) times. "
            "Fixed when --data-dir is first started. See docs/scaling.md.",
        ),
    ] = 1,
) -> None:
    """Start the broker in the background; print its bootstrap address (127.0.0.1:PORT) on stdout.

    The first start fetches the Kafka jars with Maven into the cache and formats --data-dir.

    Later starts reuse both: no download. Cache: $ROLLOUT_STREAM_CACHE, default ~/.cache/rollout-stream.

    Progress goes to stderr. Starting again while it runs on the same port just prints the address.

    Example: export KAFKA_BOOTSTRAP_SERVERS=$(rollout-stream broker start)

    A cluster (--nodes 3) prints the bootstrap list of every node once all are ready and the group and
    transaction coordinators answer.
    """
    if timeout is not None:
        check_seconds("--timeout", timeout)
    overrides = dict(parse_override(item) for item in override or [])  # BadOverride: exit 2
    if nodes > 1 or is_cluster(data_dir):
        if secure:
            raise BrokerConfigError("--secure is for a single node: start the cluster without it")
        cluster = LocalCluster(port=port, data_dir=data_dir, nodes=nodes, overrides=overrides,
                               progress=_stderr)
        if cluster.nodes != nodes and nodes > 1:
            raise BrokerConfigError(f"{cluster.data_dir} holds a {cluster.nodes}-node cluster: start it with "
                                    f"--nodes {cluster.nodes}, or use another --data-dir")
        print(cluster.start(timeout=timeout or 120.0), flush=True)
        return
    broker = LocalBroker(port=port, data_dir=data_dir, overrides=overrides, progress=_stderr, secure=secure)
    before = broker.status()
    if before.running and before.secure != secure:
        raise BrokerConfigError(f"the broker running from {broker.data_dir} is "
                                f"{'secured' if before.secure else 'PLAINTEXT'}: stop it first")
    bootstrap = broker.start(timeout=timeout or 60.0)  # BrokerConfigError: exit 2, other BrokerErrors: 1
    if before.running:
        _stderr(f"already running (pid {before.pid}) from {broker.data_dir}")
    if secure:
        from rollout_stream.broker.secure import describe_secure_broker

        for line in describe_secure_broker(broker.material(), bootstrap):
            _stderr(line)
    print(bootstrap, flush=True)


NodeId = Annotated[int, typer.Argument(min=1, help="The node's id (1..N), as `broker status` lists it.")]
StopTimeout = Annotated[
    float, typer.Option("--timeout", min=0.0, help="Seconds to wait for a clean shutdown before SIGKILL.")
]
_STOPPED = {"terminated": "stopped {what} pid {pid} (clean shutdown)",
            "killed": "killed {what} pid {pid} (no clean shutdown within {timeout:g} s)",
            "not_running": "{what} was not running"}


@broker_app.command("stop")
def stop(
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout: StopTimeout = 30.0,
    node: Annotated[
        int | None,
        typer.Option("--node", min=1, show_default=False,
                     help="Stop only this node of a cluster (a clean stop: its leaderships move first)."),
    ] = None,
) -> None:
    """Stop the broker running from --data-dir (SIGTERM, then SIGKILL after --timeout). Topic data stays.

    A cluster: every node at once, or only --node N.

    Stopping a broker that is not running succeeds (exit 0).

    Delete --data-dir (after stopping) to start from an empty cluster.
    """
    check_seconds("--timeout", timeout, zero=True)
    if is_cluster(data_dir):
        cluster = LocalCluster(data_dir=data_dir)
        pids = {n.node_id: n.broker.pid for n in cluster.status()}
        outcomes = ({node: cluster.stop_node(node, timeout)} if node is not None
                    else cluster.stop(timeout))  # BrokerStopFailed: exit 1
        for n, outcome in outcomes.items():
            _stderr(_STOPPED[outcome].format(what=f"node {n}", pid=pids.get(n), timeout=timeout))
        return
    if node is not None:
        raise BrokerConfigError(f"--node: {LocalBroker(data_dir=data_dir).data_dir} holds no cluster")
    broker = LocalBroker(data_dir=data_dir)
    pid = broker.status().pid
    outcome = broker.stop(timeout=timeout)  # BrokerStopFailed: exit 1
    messages = {
        "terminated": f"stopped broker pid {pid} (clean shutdown)",
        "killed": f"killed broker pid {pid} (no clean shutdown within {timeout:g} s)",
        "not_running": f"no broker running from {broker.data_dir}",
    }
    _stderr(messages[outcome])


@broker_app.command("status")
def status(data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """Print whether a broker runs from --data-dir. Exit 0 if running, 3 if not.

    Running: `running pid=… bootstrap=127.0.0.1:PORT data_dir=… log=…`. Not running: `stopped data_dir=…`.

    A cluster: a first line `cluster nodes=N running=R bootstrap=…`, then one line per node
    (`node=1 running pid=… bootstrap=… …` or `node=2 stopped …`). Exit 0 while any node runs, 3 when none.
    """
    if is_cluster(data_dir):
        cluster = LocalCluster(data_dir=data_dir)
        nodes = cluster.status()
        up = sum(n.running for n in nodes)
        print(f"cluster nodes={len(nodes)} running={up} bootstrap={cluster.bootstrap} "
              f"data_dir={cluster.data_dir}")
        for n in nodes:
            b = n.broker
            print(f"node={n.node_id} running pid={b.pid} bootstrap={b.bootstrap} log={b.log_path}"
                  if b.running else f"node={n.node_id} stopped port={n.port} data_dir={b.data_dir}")
            if not b.running and (reason := LocalBroker(data_dir=b.data_dir).why_stopped()) is not None:
                _stderr(f"node {n.node_id} stopped because {reason}")
        if not up:
            raise typer.Exit(EXIT_NOT_RUNNING)
        return
    broker = LocalBroker(data_dir=data_dir)
    result = broker.status()
    if result.running:
        print(f"running pid={result.pid} bootstrap={result.bootstrap} data_dir={result.data_dir} "
              f"log={result.log_path}" + (" security=SASL_SSL" if result.secure else ""))  # fmt: skip
        return
    print(f"stopped data_dir={result.data_dir}")
    if (reason := broker.why_stopped()) is not None:
        _stderr(f"it stopped because {reason}")
    raise typer.Exit(EXIT_NOT_RUNNING)


@broker_app.command("kill")
def kill(node: NodeId, data_dir: DataDir = DEFAULT_DATA_DIR) -> None:
    """SIGKILL one node of the cluster in --data-dir: a crash, no clean shutdown (for tests and demos).

    Start it again with `broker restart NODE` (or `broker start`, which starts every node that is down).
    """
    cluster = LocalCluster(data_dir=data_dir)  # no cluster there: exit 2
    pid = next((n.broker.pid for n in cluster.status() if n.node_id == node), None)
    if cluster.kill(node):
        _stderr(f"killed node {node} pid {pid} (SIGKILL)")
    else:
        _stderr(f"node {node} was not running")


@broker_app.command("restart")
def restart(
    node: NodeId,
    data_dir: DataDir = DEFAULT_DATA_DIR,
    timeout: Annotated[
        float, typer.Option("--timeout", min=1.0, help="Seconds to wait for readiness.")
    ] = 90.0,
    stop_timeout: Annotated[float, typer.Option(
        "--stop-timeout", min=0.0, help="Seconds to wait for a clean shutdown before SIGKILL.")] = 30.0,
) -> None:
    """Stop one node of the cluster cleanly (if it runs), start it again; print its address when ready."""
    check_seconds("--timeout", timeout)
    check_seconds("--stop-timeout", stop_timeout, zero=True)
    cluster = LocalCluster(data_dir=data_dir, progress=_stderr)
    print(cluster.restart(node, timeout=timeout, stop_timeout=stop_timeout), flush=True)


@broker_app.command("fetch-jars")
def fetch_jars() -> None:
    """Fetch the pinned Kafka jars into the cache now (needs mvn once); print the lib dir on stdout.

    Cache: $ROLLOUT_STREAM_CACHE/kafka-VERSION/lib, default root ~/.cache/rollout-stream.

    Nothing is downloaded when the cache is already complete. Use it before going offline, and in CI.
    """
    cached = cached_jars()
    jars = cached or resolve_jars(progress=_stderr)  # MavenNotFound: exit 2, JarResolutionFailed: 1
    if cached is not None:
        _stderr(
            f"Kafka {jars.version} jars already cached in {jars.lib_dir} (cache root {default_cache_root()})"
        )
    print(jars.lib_dir, flush=True)


def register(app: typer.Typer) -> None:
    app.add_typer(broker_app, name="broker")
