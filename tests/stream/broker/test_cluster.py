"""A local 3-node cluster (`broker start --nodes 3`): its commands, replicated topics, and the stage's
guarantees through broker and worker failures (docs/scaling.md).

One cluster for the module, started and stopped with the CLI as a user would. The chaos test runs last; it
leaves every node running again.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

from rollout_stream.broker.cluster import LocalCluster
from rollout_stream.broker.process import free_port, port_is_free
from rollout_stream.clients import Connection
from rollout_stream.config import TopicNames
from rollout_stream.names import changelog_topic_name
from rollout_stream.ops.synth import Expected, FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from rollout_stream.topics import TopicSettings, ensure_topics
from tests.stream.helpers import assert_exactly_once, read_topic, spawn_worker, train_samples

pytestmark = pytest.mark.kafka(timeout=150)

CLI = Path(sys.prefix) / "bin" / "rollout-stream"
NODES = 3


def cli(*args: str, timeout: float = 200) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUT_STREAM_BROKER_")}
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=env, timeout=timeout,
                          check=False)  # fmt: skip


def _base_port() -> int:
    """A port p with p, p+1 and p+2 free (the nodes' ports)."""
    for _ in range(50):
        base = free_port()
        if base + NODES < 65536 and all(port_is_free(base + i) for i in range(1, NODES)):
            return base
    raise AssertionError("no three consecutive free ports")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data_dir = tmp_path_factory.mktemp("cluster") / "kafka"
    base = _base_port()
    started = time.monotonic()
    result = cli("broker", "start", "--nodes", str(NODES), "--port", str(base), "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stderr
    expected = ",".join(f"127.0.0.1:{base + i}" for i in range(NODES))
    assert result.stdout.strip() == expected, result.stdout
    print(f"3-node cluster ready in {time.monotonic() - started:.1f} s", file=sys.stderr)
    try:
        yield LocalCluster(data_dir=data_dir)
    finally:
        stopped = cli("broker", "stop", "--data-dir", str(data_dir), timeout=120)
        assert stopped.returncode == 0, stopped.stderr


def node_lines(data_dir: Path) -> dict[int, str]:
    result = cli("broker", "status", "--data-dir", str(data_dir))
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"cluster nodes={NODES} "), result.stdout
    return {int(line.split()[0].removeprefix("node=")): line for line in lines[1:]}


def test_status_kill_restart_and_replicated_topics(cluster):
    assert all(" running pid=" in line for line in node_lines(cluster.data_dir).values())

    # topics create: 3 replicas and min.insync.replicas 2 by default on 3 brokers, the changelog too
    tag = f"rep-{os.getpid()}-{random.randrange(1 << 30)}"
    created = cli("topics", "create", "--bootstrap-servers", cluster.bootstrap, "--input-topic", f"{tag}-in",
                  "--output-topic", f"{tag}-out", "--dead-letter-topic", f"{tag}-dlq",
                  "--changelog-group-id", tag)
    assert created.returncode == 0, created.stderr
    assert "warning" not in created.stderr
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        names = [f"{tag}-in", f"{tag}-out", f"{tag}-dlq", f"{tag}-{tag}-in-windows-changelog"]
        for topic in admin.describe_topics(names):
            assert topic["error_code"] == 0, topic
            assert {len(p["replica_nodes"]) for p in topic["partitions"]} == {3}, topic["name"]
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
        in_sync = {n: configs["topic"][n]["min.insync.replicas"]["value"] for n in names}
        assert in_sync == dict.fromkeys(names, "2")

        # a topic with a single replica on a multi-broker cluster is named, with what to do
        admin.create_topics([NewTopic(f"{tag}-single", 3, 1)])
    finally:
        admin.close()
    warned = cli("topics", "create", "--bootstrap-servers", cluster.bootstrap, "--input-topic",
                 f"{tag}-single", "--output-topic", f"{tag}-out", "--dead-letter-topic", f"{tag}-dlq")
    assert warned.returncode == 0, warned.stderr
    assert f"warning: '{tag}-single' has replication factor 1 on a cluster of 3 brokers" in warned.stderr

    # kill: the node is down, the others serve; restart: back, ready
    killed = cli("broker", "kill", "3", "--data-dir", str(cluster.data_dir))
    assert killed.returncode == 0 and "SIGKILL" in killed.stderr, killed.stderr
    lines = node_lines(cluster.data_dir)
    assert " stopped " in lines[3] and " running " in lines[1] and " running " in lines[2]
    restarted = cli("broker", "restart", "3", "--data-dir", str(cluster.data_dir))
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.strip() == f"127.0.0.1:{cluster.node_port(3)}"
    assert " running pid=" in node_lines(cluster.data_dir)[3]


# ---- chaos ---------------------------------------------------------------------------------------------
GROUPS = 1000
PARTITIONS = 6


@dataclass
class Progress:
    """Per partition over time: the input's end offset and the window changelog's last stable offset. The
    worker writes its changelog position in every transaction that consumed records of a partition, so
    that offset moves exactly when the partition's work is committed (committed input offsets would not:
    they stay at the oldest open window, which an incomplete group holds for the whole group timeout)."""

    samples: list[tuple[float, dict[int, int], dict[int, int]]] = field(default_factory=list)

    def stalled_runs(self, partition: int) -> list[tuple[float, float]]:
        """(start, end) of each time records had arrived in the partition and no transaction committed work
        of it since (a gap in the samples, while the watcher could not ask, counts as no progress)."""
        runs: list[tuple[float, float]] = []
        since = None  # first sample that saw input not yet followed by a commit
        last_stable = input_at_commit = None
        for t, inputs, stable in self.samples:
            end, lso = inputs.get(partition, 0), stable.get(partition, 0)
            if last_stable is None:
                last_stable, input_at_commit = lso, end
            if lso != last_stable:  # a commit
                if since is not None:
                    runs.append((since, t))
                since, last_stable, input_at_commit = None, lso, end
            elif since is None and end > (input_at_commit or 0):
                since = t
        if since is not None and self.samples:
            runs.append((since, self.samples[-1][0]))
        return runs

    def stalls(self, start: float, end: float) -> dict[int, float]:
        """Per partition, the longest stall under way at `start` or begun before `end`, counted from `start`
        (it may outlast `end`: the time this fault left the partition without progress)."""
        return {p: max((e - max(s, start) for s, e in self.stalled_runs(p) if e > start and s < end),
                       default=0.0)
                for p in range(PARTITIONS)}


def watch_progress(bootstrap: str, inputs: str, changelog: str, stop: threading.Event,
                   into: Progress) -> None:
    """Every 0.25 s: the input's end offsets and the changelog's last stable offsets (read_committed)."""
    plain = committed = None
    while not stop.is_set():
        try:
            if plain is None or committed is None:
                plain = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=3000)
                committed = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=3000,
                                          isolation_level="read_committed")
            ends = plain.end_offsets([TopicPartition(inputs, p) for p in range(PARTITIONS)])
            stable = committed.end_offsets([TopicPartition(changelog, p) for p in range(PARTITIONS)])
            into.samples.append((time.monotonic(), {tp.partition: e for tp, e in ends.items()},
                                 {tp.partition: e for tp, e in stable.items()}))
        except Exception:  # noqa: BLE001 - a broker just died: ask again (a gap in the samples is a stall)
            plain = committed = None
        time.sleep(0.25)


def input_leaders(bootstrap: str, topic: str) -> Counter[int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        [described] = admin.describe_topics([topic])
        return Counter(p["leader_id"] for p in described["partitions"])
    finally:
        admin.close()


def stopped(worker: subprocess.Popen, timeout: float = 60.0) -> int | None:
    """The exit code of a worker told to stop; None (and SIGKILLed, never left behind) if it did not."""
    try:
        return worker.wait(timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(10)
        return None


def latest_log(logs: list[Path], instance: str) -> Path:
    return [path for path in logs if path.name.startswith(f"{instance}-")][-1]


def wait_working(log_file: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log_file.exists() and "event=partition.restored" in log_file.read_text():
            return
        time.sleep(0.2)
    raise AssertionError(f"worker never got to work: {log_file.read_text()[-2000:]}")


class ExitWatch:
    """Says when a worker exits unbidden, at that moment: the others take over its partitions, so otherwise
    only the exit codes at the end tell (a worker that died a minute before the end, 2026-12-01)."""

    def __init__(self, workers: dict[str, subprocess.Popen], faults: list[tuple[str, float]]) -> None:
        self.workers, self.faults = workers, faults
        self.exits: list[str] = []
        self.bidden: set[int] = set()  # pids the test kills or stops itself
        self._done: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        started = time.monotonic()
        while not self._stop.wait(0.5):
            for name, worker in list(self.workers.items()):
                code = worker.poll()
                if code is None or worker.pid in self._done or worker.pid in self.bidden:
                    continue
                self._done.add(worker.pid)
                last = self.faults[-1][0] if self.faults else "none"
                line = (f"{time.monotonic() - started:.0f} s in: worker {name} (pid {worker.pid}) exited "
                        f"with {code}; last fault before it: {last}")
                self.exits.append(line)
                print(f"cluster chaos: {line}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.mark.kafka(timeout=480)
@pytest.mark.every_client
@pytest.mark.any_client  # the clients' own exactly-once runs are the chaos tests; here, the cluster's faults
def test_exactly_once_on_the_cluster_through_broker_and_worker_failures(cluster, tmp_path, kafka_client):
    """3 workers, 6 partitions, RF 3 / min ISR 2; SIGKILL of the broker leading most input partitions, its
    restart, SIGKILL of a worker, a clean stop of another broker: every outcome exactly once."""
    cluster.start()  # every node up (an earlier test may have left one down)
    bootstrap = cluster.bootstrap
    rng = random.Random(20261130)
    tag = f"cchaos-{kafka_client}-{os.getpid()}-{rng.randrange(1 << 30)}"
    topics = TopicNames(f"{tag}-rollouts", f"{tag}-train", f"{tag}-dlq")
    ensure_topics(Connection(bootstrap), data_topics=[topics.input, topics.output],
                  dead_letter_topics=[topics.dead_letter], settings=TopicSettings(partitions=PARTITIONS))
    group_id = f"cchaos-{tag}"
    plan = SynthPlan(group_size=4, max_siblings=2, tokens=8, faults=FaultRates.uniform(0.03), seed=17,
                     run_id="cchaos")
    expected = Expected()
    batches = []
    published_keys = set()
    for records, exp in plan_groups(plan, GROUPS):
        expected.add(exp)
        batches.append(records)
        if exp.published_groups:
            published_keys.add(records[0].key.decode())

    futures: list = []
    produce_errors: list[BaseException] = []

    def produce() -> None:
        try:
            with RolloutProducer(bootstrap, topic=topics.input) as p:
                for i, records in enumerate(batches):
                    futures.extend(p.send_raw(r.key, r.value) for r in records)
                    if i % 10 == 9:
                        time.sleep(0.9)  # ~90 s of input: every fault happens while records arrive
                p.flush(timeout=120)
        except BaseException as exc:  # surfaced below
            produce_errors.append(exc)

    # The group timeout outlasts a broker failover: a group whose last members wait in the producer while
    # their partition has no leader (~10-20 s) must not time out as incomplete (it would, rightly, with 4 s).
    args = ("--group-timeout", "30", "--commit-interval", "0.2", "--session-timeout", "10")
    logs: list[Path] = []

    def start(instance: str) -> subprocess.Popen:
        logs.append(tmp_path / f"{instance}-{len(logs)}.log")
        return spawn_worker(bootstrap, topics, group_id, *args, "--instance-id", instance, log_path=logs[-1])

    progress, stop_watch = Progress(), threading.Event()  # watched from before the first record
    changelog = changelog_topic_name(group_id, topics.input)
    watcher = threading.Thread(target=watch_progress, args=(bootstrap, topics.input, changelog, stop_watch,
                                                            progress), daemon=True)
    faults: list[tuple[str, float]] = []
    workers = {name: start(name) for name in ("w1", "w2", "w3")}
    exits = ExitWatch(workers, faults)
    for log_file in list(logs):
        wait_working(log_file)
    producer = threading.Thread(target=produce)
    producer.start()
    watcher.start()
    try:
        time.sleep(6)
        leaders = input_leaders(bootstrap, topics.input)
        victim = leaders.most_common(1)[0][0]
        faults.append((f"SIGKILL broker {victim} (leader of {leaders[victim]} of {PARTITIONS} input "
                       f"partitions)", time.monotonic()))
        assert cluster.kill(victim)
        time.sleep(12)
        faults.append((f"restart broker {victim}", time.monotonic()))
        cluster.restart(victim, timeout=120)
        time.sleep(4)
        faults.append(("SIGKILL worker w2", time.monotonic()))
        exits.bidden.add(workers["w2"].pid)
        workers["w2"].send_signal(signal.SIGKILL)
        workers["w2"].wait(10)
        time.sleep(3)
        workers["w2"] = start("w2")  # back under the same instance id
        time.sleep(6)
        other = next(n for n in cluster.node_ids if n != victim)
        faults.append((f"clean stop of broker {other}", time.monotonic()))
        assert cluster.stop_node(other, timeout=60) == "terminated"
        time.sleep(10)
        faults.append((f"start broker {other}", time.monotonic()))
        cluster.restart(other, timeout=120)
        producer.join(150)
        assert not producer.is_alive() and not produce_errors, produce_errors
        unacknowledged = [f for f in futures if not f.done() or f.exception() is not None]
        assert not unacknowledged, (f"{len(unacknowledged)} sends not acknowledged: "
                                    f"{unacknowledged[0].exception()}")

        total = expected.published_samples
        dead = sum(expected.dead_letters.values())
        train = train_samples(read_topic(bootstrap, topics.output, min_count=total, timeout=120, settle=3))
        dlq = read_topic(bootstrap, topics.dead_letter, min_count=dead, timeout=30, settle=2)
        faults.append(("end", time.monotonic()))
    finally:
        stop_watch.set()
        exits.stop()
        for w in workers.values():
            w.send_signal(signal.SIGTERM)
        codes = {name: stopped(w) for name, w in workers.items()}
        cluster.start()  # whatever happened, leave every node running for the next test

    assert len(progress.samples) > 100, "the progress watcher could not sample the group's offsets"
    report = []
    for (what, at), (_, until) in zip(faults, faults[1:], strict=False):
        stalls = progress.stalls(at, until)
        worst = max(stalls.values())
        report.append(f"{what}: longest stall {worst:.1f} s, partitions stalled > 2 s: "
                      f"{sum(1 for s in stalls.values() if s > 2)}")
    print("\n".join(["cluster chaos, time without progress per fault:", *report]), file=sys.stderr)
    (tmp_path / "stalls.txt").write_text("\n".join(report) + "\n")

    unclean = {name: code for name, code in codes.items() if code != 0}
    assert not unclean, "\n".join([f"workers that did not stop cleanly: {unclean}", *exits.exits, *(
        f"--- the end of {name}'s log:\n" + "\n".join(latest_log(logs, name).read_text().splitlines()[-12:])
        for name in unclean)])
    missing = published_keys - {t.group_key for t in train}
    assert not missing, {k: [(r.headers["x-dlq-reason"], r.partition, r.offset) for r in dlq
                             if r.key is not None and r.key.decode() == k] for k in sorted(missing)[:5]}
    assert_exactly_once(train, dlq, expected)
