"""A local multi-node Apache Kafka (KRaft) cluster: N nodes from the same jars, for development and tests.

Every node is a broker and a controller: the controller quorum is the N nodes themselves (three voters for
three nodes), so losing any one node, the active controller included, leaves a majority that elects a new
one. Why that and not a dedicated controller: docs/scaling.md "The local cluster".

Data dir layout (``--data-dir``):
    nodes.json        node count, cluster id, every node's broker and controller port (fixed at first start:
                      the quorum's voters are listed statically in every node's config)
    .cluster.lock     one start/stop/kill/restart at a time
    node-<id>/        one node's own data dir, laid out as a single broker's (stream/broker/local.py)

Node `id` listens on 127.0.0.1:(port + id - 1); the bootstrap list names every node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_stream.broker.disk import require_room
from rollout_stream.broker.errors import BrokerConfigError, BrokerStartFailed, PortInUse
from rollout_stream.broker.files import read_json, write_json
from rollout_stream.broker.jars import Progress
from rollout_stream.broker.local import DEFAULT_DATA_DIR, DEFAULT_PORT, BrokerStatus, LocalBroker
from rollout_stream.broker.process import StopOutcome, exclusive, free_port, port_is_free
from rollout_stream.broker.properties import ClusterNode, new_cluster_id
from rollout_stream.clients import Connection
from rollout_stream.kafka import KafkaFailure, TopicPartition, client_for

__all__ = ["CLUSTER_JVM_OPTIONS", "INTERNAL_TOPICS", "LocalCluster", "NodeStatus", "is_cluster"]

# Three JVMs next to the workers on 2 cores: a small heap (the page cache holds the data, not the heap) and
# one GC thread each, so a collection on one node does not take both cores from the others.
CLUSTER_JVM_OPTIONS = ("-Xms128m", "-Xmx384m", "-XX:ParallelGCThreads=1", "-XX:ConcGCThreads=1",
                       "-XX:CICompilerCount=2")  # fmt: skip
INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")
_NODES_FILE = "nodes.json"


def is_cluster(data_dir: Path) -> bool:
    """True when `data_dir` holds a multi-node cluster (its nodes.json), not a single broker."""
    return (Path(data_dir).expanduser() / _NODES_FILE).is_file()


@dataclass(frozen=True)
class NodeStatus:
    """One node of the cluster: its id and what its own data dir says."""

    node_id: int
    broker: BrokerStatus
    port: int

    @property
    def running(self) -> bool:
        return self.broker.running


@dataclass
class LocalCluster:
    """`nodes` broker+controller nodes under `data_dir`, node `id` on 127.0.0.1:(port + id - 1).

    The node count, cluster id and ports are fixed by the first start (nodes.json); later starts reuse them.
    """

    port: int = DEFAULT_PORT
    data_dir: Path = DEFAULT_DATA_DIR
    nodes: int = 3
    cache_dir: Path | None = None
    overrides: Mapping[str, str] = field(default_factory=dict)
    progress: Progress | None = field(default=None, repr=False)
    _brokers: dict[int, LocalBroker] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).expanduser().resolve()
        layout = read_json(self.data_dir / _NODES_FILE)
        if layout:  # an existing cluster decides its own size and ports
            self.nodes = int(layout["nodes"])
            self.port = int(layout["ports"][0])
        if self.nodes < 2:
            raise BrokerConfigError(
                f"a cluster has at least 2 nodes, got {self.nodes} (one node: omit --nodes)")

    # -- layout -------------------------------------------------------------------------------------
    @property
    def node_ids(self) -> list[int]:
        return list(range(1, self.nodes + 1))

    def node_port(self, node_id: int) -> int:
        return self.port + node_id - 1

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.node_port(n)}" for n in self.node_ids)

    def node_dir(self, node_id: int) -> Path:
        return self.data_dir / f"node-{node_id}"

    def _layout(self) -> dict[str, Any]:
        """nodes.json, written on the first start: the cluster id and every voter's controller port."""
        path = self.data_dir / _NODES_FILE
        layout = read_json(path)
        if not layout:
            if (self.data_dir / "kafka-logs").exists():
                raise BrokerConfigError(f"{self.data_dir} holds a single-node broker: use another --data-dir "
                                        "for a cluster, or start it without --nodes")
            self.data_dir.mkdir(parents=True, exist_ok=True)
            taken = {self.node_port(n) for n in self.node_ids}
            controllers: list[int] = []
            while len(controllers) < self.nodes:
                controllers.append(free_port(avoid=taken | set(controllers)))
            layout = {"nodes": self.nodes, "cluster_id": new_cluster_id(),
                      "ports": [self.node_port(n) for n in self.node_ids], "controller_ports": controllers}
            write_json(path, layout)
        return layout

    def node(self, node_id: int) -> LocalBroker:
        """The LocalBroker of node `node_id` (one object per node, so it reaps the JVM it started)."""
        if node_id not in self.node_ids:
            raise BrokerConfigError(f"node {node_id} is not one of this cluster's nodes 1..{self.nodes}")
        if node_id not in self._brokers:
            layout = self._layout()
            voters = {n: int(p) for n, p in zip(self.node_ids, layout["controller_ports"], strict=True)}
            role = ClusterNode(node_id, str(layout["cluster_id"]), voters)
            self._brokers[node_id] = LocalBroker(
                port=self.node_port(node_id), data_dir=self.node_dir(node_id), cache_dir=self.cache_dir,
                overrides=self.overrides, jvm_options=CLUSTER_JVM_OPTIONS, progress=self.progress,
                cluster=role,
            )  # fmt: skip
        return self._brokers[node_id]

    # -- queries ------------------------------------------------------------------------------------
    def status(self) -> list[NodeStatus]:
        """Every node, running or not (nothing is created: a data dir that holds no cluster lists none)."""
        if not is_cluster(self.data_dir):
            return []
        return [NodeStatus(n, LocalBroker(data_dir=self.node_dir(n)).status(), self.node_port(n))
                for n in self.node_ids]

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> str:
        """Start every node that is not running, wait until all are ready and the internal topics have
        leaders; return the bootstrap list. `timeout` bounds the wait once the JVMs are launched."""
        if not all(LocalBroker(data_dir=self.node_dir(n)).status().running for n in self.node_ids):
            require_room(self.data_dir)  # before the lock and the layout: a refused start leaves nothing
        with exclusive(self.data_dir / ".cluster.lock"):
            down = [n for n in self.node_ids if not self.node(n).status().running]
            for n in down:
                self._require_free(n)
            launched: dict[int, tuple[str, float, int]] = {}
            deadline = time.monotonic() + timeout
            try:
                for n in down:  # all launched first: a node is ready only once a majority of voters runs
                    launched[n] = self.node(n).launch()
                deadline = time.monotonic() + timeout
                for n, started in launched.items():
                    self.node(n).wait_ready(started, max(1.0, deadline - time.monotonic()))
                if down:
                    self._await_internal_topics(deadline)
            except BaseException:  # never leave half a cluster behind
                for n in launched:
                    self.node(n).stop(timeout=10.0)
                raise
        return self.bootstrap

    def stop(self, timeout: float = 30.0) -> dict[int, StopOutcome]:
        """Stop every node at once (SIGTERM, SIGKILL after `timeout`): one by one, the last nodes would wait
        for a quorum that is already gone."""
        outcomes: dict[int, StopOutcome] = {}
        if not is_cluster(self.data_dir):
            return outcomes
        with exclusive(self.data_dir / ".cluster.lock"):
            def stop_one(n: int) -> None:
                outcomes[n] = self.node(n).stop(timeout)

            threads = [threading.Thread(target=stop_one, args=(n,)) for n in self.node_ids]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        return dict(sorted(outcomes.items()))

    def stop_node(self, node_id: int, timeout: float = 30.0) -> StopOutcome:
        """A clean stop of one node (SIGTERM: controlled shutdown moves its leaderships first)."""
        self._require_cluster()
        with exclusive(self.data_dir / ".cluster.lock"):
            return self.node(node_id).stop(timeout)

    def kill(self, node_id: int) -> bool:
        """SIGKILL one node: a crash, no controlled shutdown. False: it was not running."""
        self._require_cluster()
        with exclusive(self.data_dir / ".cluster.lock"):
            return self.node(node_id).kill()

    def restart(self, node_id: int, timeout: float = 90.0, stop_timeout: float = 30.0) -> str:
        """Stop one node cleanly if it runs, start it again and wait until it is ready; its address."""
        self._require_cluster()
        with exclusive(self.data_dir / ".cluster.lock"):
            broker = self.node(node_id)
            broker.stop(stop_timeout)
            self._require_free(node_id)
            require_room(self.data_dir)
            broker.wait_ready(broker.launch(), timeout)
            return f"127.0.0.1:{self.node_port(node_id)}"

    # -- steps --------------------------------------------------------------------------------------
    def _require_cluster(self) -> None:
        if not is_cluster(self.data_dir):
            raise BrokerConfigError(f"no cluster in {self.data_dir}: start one with `rollout-stream broker "
                                    f"start --nodes 3 --data-dir {self.data_dir}`")

    def _require_free(self, node_id: int) -> None:
        port = self.node_port(node_id)
        if not port_is_free(port):
            raise PortInUse(f"port {port} of node {node_id} on 127.0.0.1 is already in use: pick another "
                            f"base port with --port (nodes take {self.port}..{self.node_port(self.nodes)})",
                            port=port)  # fmt: skip
        layout = self._layout()
        controller = int(layout["controller_ports"][node_id - 1])
        if not port_is_free(controller):
            raise PortInUse(f"controller port {controller} of node {node_id} is taken by another process: "
                            f"stop it, or start the cluster from a new --data-dir", port=controller)

    def _await_internal_topics(self, deadline: float) -> None:
        """Until the group and transaction coordinators answer and the internal topics have a leader for
        every partition (they are created on first use: asking for a coordinator creates them)."""
        conn = Connection(self.bootstrap, client_id="rollout-stream-cluster-probe")
        client = client_for(conn)
        admin = client.admin(client_id=conn.client_id)
        try:
            while True:
                try:
                    # A group's committed offsets, asked as a consumer asks them, create __consumer_offsets.
                    # Not DescribeGroups: librdkafka's admin request to a coordinator whose connection drops
                    # (nodes still starting) can abort the process (rd_kafka_enq_once_del_source_return).
                    admin.group_offsets([conn.client_id], [TopicPartition(INTERNAL_TOPICS[0], 0)])
                    producer = client.producer(client_id=conn.client_id, max_record_bytes=1 << 20,
                                               transactional_id="rollout-stream-cluster-probe")
                    try:
                        producer.init_transactions()  # creates __transaction_state, finds its coordinator
                    finally:
                        producer.close(timeout=5)
                    found = admin.describe_topics(list(INTERNAL_TOPICS))
                    if all(t.error is None and t.partitions and not t.leaderless for t in found):
                        return
                except KafkaFailure:
                    pass
                if time.monotonic() >= deadline:
                    raise BrokerStartFailed(
                        f"the cluster's nodes are up but {' and '.join(INTERNAL_TOPICS)} have no leader yet: "
                        f"see the nodes' logs ({self.data_dir}/node-*/logs/broker.log)")
                time.sleep(0.5)
        finally:
            admin.close()
