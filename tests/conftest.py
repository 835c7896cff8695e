"""Shared fixtures: a real Kafka broker for the session, fresh topics and consumer groups per test.

Where the broker comes from (first match):
  1. KAFKA_BOOTSTRAP_SERVERS=host:port        an existing cluster (checked reachable, never stopped)
  2. ROLLOUT_STREAM_TEST_BROKER=docker        testcontainers, apache/kafka:<pinned version>
  3. otherwise                                LocalBroker (Maven jars + local Java) on a free port in a
                                              tmp data dir, stopped at session end
It is started lazily, by the first test that asks for `kafka_bootstrap`. No broker is a failure, never
a skip (a skipped Kafka test never ran), with or without CI=true. Under pytest-xdist (`-n N`) the workers
share one local broker: the first to ask starts it in a data dir of the run's base temp, the others find
it there (LocalBroker.ensure_running holds a lock), and the controller stops it at the end.

Tests that use `kafka_bootstrap` get the `kafka` marker (deselect with `-m "not kafka"`), and their
call phase is bounded in time: 120 s, or `@pytest.mark.kafka(timeout=S)`.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError

from rollout_stream.broker.errors import BrokerError, PortInUse
from rollout_stream.broker.jars import kafka_version, pom_path
from rollout_stream.broker.local import LocalBroker
from rollout_stream.broker.process import free_port

KAFKA_TEST_TIMEOUT_S = 120.0

TopicFactory = Callable[..., str]
"""`topic_factory(partitions=1, *, config=None, prefix=None) -> name`: a new, uniquely named topic."""


@dataclass
class _SessionBroker:
    kind: str = ""
    bootstrap: str = ""
    start_s: float = 0.0
    failure: str = ""


_SESSION = _SessionBroker()


def _no_broker(reason: str) -> NoReturn:
    in_ci = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
    _SESSION.failure = reason
    pytest.fail(
        f"no Kafka broker for the kafka tests{' (CI: a missing broker is a failure)' if in_ci else ''}: "
        f"{reason}. Give one with KAFKA_BOOTSTRAP_SERVERS=host:port, or install Java >= 17 and Maven "
        f"(`make jars` prefetches the broker jars).",
        pytrace=False,
    )


def _check_reachable(bootstrap: str, timeout_s: float = 15.0) -> None:
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap, client_id="rollout-stream-tests",
        request_timeout_ms=int(timeout_s * 1000), bootstrap_timeout_ms=int(timeout_s * 1000),
    )  # fmt: skip
    try:
        admin.describe_cluster()
    finally:
        admin.close()


_SHARED_BROKER_DIR = "kafka-shared"
_SHARED_BROKER_KIND = "local broker (Maven jars), shared by the xdist workers"


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _shared_broker_dir(config: pytest.Config) -> Path:
    """The data dir every xdist worker of this run shares: in the controller's base temp (each worker's
    base temp is a directory inside it)."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    return (base.parent if _is_xdist_worker(config) else base) / _SHARED_BROKER_DIR


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller stops the broker its workers shared (and names it in the summary line)."""
    if _is_xdist_worker(session.config):
        return
    data_dir = _shared_broker_dir(session.config)
    if not (data_dir / "broker.json").exists():
        return
    broker = LocalBroker(data_dir=data_dir)
    status = broker.status()
    if status.running and not _SESSION.bootstrap:
        _SESSION.kind, _SESSION.bootstrap = _SHARED_BROKER_KIND, status.bootstrap or ""
    broker.stop(timeout=20.0)


def _local_broker(data_dir: Path, *, shared: bool = False) -> tuple[str, Callable[[], None] | None]:
    """A LocalBroker on a free port in `data_dir`, and how to stop it. `shared`: the run's one broker for
    every xdist worker, started by whichever asks first (ensure_running) and stopped by the controller."""
    last: PortInUse | None = None
    for _attempt in range(3):  # a free port can be taken between asking and binding
        broker = LocalBroker(port=free_port(), data_dir=data_dir)
        try:
            bootstrap = broker.ensure_running(timeout=90.0) if shared else broker.start(timeout=90.0)
        except PortInUse as exc:
            last = exc
            continue
        if shared:
            return bootstrap, None

        def stop(broker: LocalBroker = broker) -> None:
            broker.stop(timeout=20.0)

        return bootstrap, stop
    assert last is not None
    raise last


def _docker_broker() -> tuple[str, Callable[[], None]]:
    """apache/kafka in a container. Setting any KAFKA_* variable drops all of the image's defaults, so
    this is the image's single-node example in full, plus a listener advertised on the mapped host port."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.docker_client import DockerClient
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    host = DockerClient().host()
    host_port = free_port()
    env = {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://0.0.0.0:19092,HOST://0.0.0.0:9092,CONTROLLER://0.0.0.0:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://localhost:19092,HOST://{host}:{host_port}",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,HOST:PLAINTEXT",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",  # else init_transactions() hangs
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_MESSAGE_MAX_BYTES": str(64 << 20),
        "KAFKA_REPLICA_FETCH_MAX_BYTES": str(64 << 20),
        "KAFKA_LOG_DIRS": "/tmp/kraft-combined-logs",
    }
    container = DockerContainer(f"apache/kafka:{kafka_version(pom_path())}").with_bind_ports(9092, host_port)
    for key, value in env.items():
        container.with_env(key, value)
    container.waiting_for(
        LogMessageWaitStrategy(re.compile(r"Kafka Server started")).with_startup_timeout(120)
    )
    container.start()
    return f"{host}:{host_port}", container.stop


@pytest.fixture(scope="session")
def kafka_bootstrap(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[str]:
    """Bootstrap address of a real broker for the whole session (see the module docstring)."""
    if _SESSION.failure:  # fail every Kafka test fast and alike once the broker could not be had
        _no_broker(_SESSION.failure)
    started = time.monotonic()
    stop: Callable[[], None] | None = None
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "").strip()
    bootstrap, problem = "", ""
    try:
        if given:
            _SESSION.kind, bootstrap = "KAFKA_BOOTSTRAP_SERVERS", given
            _check_reachable(given)
        elif os.environ.get("ROLLOUT_STREAM_TEST_BROKER", "").strip().lower() == "docker":
            _SESSION.kind = "testcontainers apache/kafka"
            bootstrap, stop = _docker_broker()
        elif _is_xdist_worker(request.config):
            _SESSION.kind = _SHARED_BROKER_KIND
            bootstrap, stop = _local_broker(_shared_broker_dir(request.config), shared=True)
        else:
            _SESSION.kind = "local broker (Maven jars)"
            bootstrap, stop = _local_broker(tmp_path_factory.mktemp("kafka"))
    except BrokerError as exc:
        problem = f"{type(exc).__name__}: {exc}"
    except (KafkaError, OSError) as exc:
        problem = f"{_SESSION.kind} {given} unreachable: {type(exc).__name__}: {exc}"
    except Exception as exc:  # docker missing, image pull failure, ...: report, do not skip
        problem = f"{_SESSION.kind} could not start: {type(exc).__name__}: {exc}"
    if problem:
        _no_broker(problem)  # outside the except block: one message, no chained traceback
    _SESSION.bootstrap, _SESSION.start_s = bootstrap, time.monotonic() - started
    try:
        yield bootstrap
    finally:
        if stop is not None:
            stop()


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap: str) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="rollout-stream-tests")
    try:
        yield admin
    finally:
        admin.close()


def _slug(name: str, limit: int = 40) -> str:
    return re.sub(r"[^a-zA-Z0-9._-]+", "-", name).strip("-")[:limit] or "t"


@pytest.fixture
def topic_factory(kafka_admin: KafkaAdminClient, request: pytest.FixtureRequest) -> Iterator[TopicFactory]:
    """Create topics named `<test name>-<uuid>` with N partitions (ready: every partition has a leader).

    They are deleted after the test, best effort.
    """
    created: list[str] = []

    def make(
        partitions: int = 1, *, config: Mapping[str, str] | None = None, prefix: str | None = None
    ) -> str:
        name = f"{_slug(prefix or request.node.name)}-{uuid.uuid4().hex[:12]}"
        spec = {"num_partitions": partitions, "replication_factor": 1, "configs": dict(config or {})}
        kafka_admin.create_topics({name: spec}, timeout_ms=15000, wait_for_metadata=True)
        created.append(name)
        return name

    yield make
    if created:
        try:
            kafka_admin.delete_topics(created, timeout_ms=10000, raise_errors=False)
        except (KafkaError, OSError):
            pass  # a leftover topic on a throwaway broker is harmless


@pytest.fixture
def unique_group_id(request: pytest.FixtureRequest) -> str:
    """A consumer group id no other test (or earlier run against the same cluster) has used."""
    return f"g-{_slug(request.node.name)}-{uuid.uuid4().hex[:12]}"


# -- every Kafka test on every client the project supports --------------------------------------------------
KAFKA_CLIENTS = ("confluent", "kafka-python")


def _test_clients() -> list[str]:
    only = os.environ.get("ROLLOUT_STREAM_TEST_CLIENTS", "").strip()
    return [c for c in KAFKA_CLIENTS if not only or c in only.split(",")]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Tests on the session's broker, and those marked `every_client` (with brokers of their own: secured,
    # restarted). Unmarked tests with brokers of their own run on the default client; a test of one client's
    # implementation (marked `client`) on that client alone.
    on_every = ("kafka_bootstrap" in metafunc.fixturenames
                or metafunc.definition.get_closest_marker("every_client") is not None)
    if on_every and "kafka_client" in metafunc.fixturenames:
        one = metafunc.definition.get_closest_marker("client")
        clients = [c for c in _test_clients() if one is None or c == one.args[0]]
        metafunc.parametrize("kafka_client", clients, indirect=True)


def _long_on_this_client(item: pytest.Item) -> bool:
    """A test marked `any_client` (what it shows does not depend on the client library; the seam's
    contract tests and the per-client pipelines show each client) runs in `make test` on the first client
    only; its other clients' runs are in the long tier."""
    if item.get_closest_marker("any_client") is None:
        return False
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "kafka_client" in params and params["kafka_client"] != _test_clients()[0]


@pytest.fixture(autouse=True)
def kafka_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """The client library this Kafka test runs on (parametrized over both): set as ROLLOUT_STREAM_CLIENT, the
    default of every Connection, so in-process clients and CLI subprocesses alike use it."""
    client = getattr(request, "param", None)
    if client is not None:
        monkeypatch.setenv("ROLLOUT_STREAM_CLIENT", client)
    return client


# -- the `kafka` marker: added to tests that use the broker, and a time bound for them ---------------
# Under `pytest -n N --dist loadfile` a file's tests run in one worker, so a module fixture (a secured
# broker, a 3-node cluster, a published backlog) is set up once. The files that take longest go first so
# that no worker starts one of them when the others are nearly done; a stale list only costs speed.
_LONGEST_FILES_FIRST = (
    "tests/stream/broker/test_cluster.py",
    "tests/stream/prompts/test_prompt_deployment.py",
    "tests/stream/worker/test_broker_faults.py",
    "tests/stream/worker/test_chaos.py",
    "tests/stream/prompts/test_staleness_grains.py",
    "tests/stream/security/test_security.py",
    "tests/stream/pacing/test_pacing_deployment.py",
    "tests/stream/worker/test_chunked_pipeline.py",
    "tests/stream/worker/test_chunked_chaos.py",
    "tests/examples/test_verl_data_path.py",
    "tests/stream/worker/test_fencing.py",
    "tests/stream/worker/test_worker_process.py",
    "tests/stream/ops/test_dlq.py",
    "tests/stream/worker/test_worker.py",
    "tests/codec/test_head.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: object, error: object | None) -> None:
    """How a worker that died ended (its exit status or signal): a death prints nothing of its own."""
    if error is None:
        return
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    try:
        code = popen.wait(timeout=10) if popen is not None else None
    except Exception as exc:  # noqa: BLE001 - a diagnostic must not break the run
        code = f"unknown ({type(exc).__name__})"
    killed = isinstance(code, int) and code < 0
    how = f"signal {signal.Signals(-code).name}" if killed else f"exit status {code}"  # type: ignore[operator]
    print(f"\nxdist worker {getattr(getattr(node, 'gateway', None), 'id', '?')} died: {how} ({error})",
          file=sys.stderr, flush=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.file_scheduling import CrashSafeFileScheduling

    return CrashSafeFileScheduling(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if (
            "kafka_bootstrap" in getattr(item, "fixturenames", ())
            and item.get_closest_marker("kafka") is None
        ):
            item.add_marker(pytest.mark.kafka)
        if _long_on_this_client(item):
            item.add_marker(pytest.mark.long)
    rank = {path: i for i, path in enumerate(_LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: file order kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("kafka")
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if marker is None or not usable:
        return (yield)
    limit = float(marker.kwargs.get("timeout", KAFKA_TEST_TIMEOUT_S))

    def on_alarm(_signum: int, _frame: object) -> None:
        pytest.fail(f"{item.nodeid} exceeded its {limit:g} s time bound (kafka tests must not hang)")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """One line that shows whether the Kafka tests really ran, and against what."""
    counts: dict[str, int] = {}
    for outcome in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"):
        reports = terminalreporter.stats.get(outcome, [])
        n = sum(1 for r in reports if "kafka" in getattr(r, "keywords", {}) and
                (getattr(r, "when", "call") == "call" or outcome in ("error", "skipped")))  # fmt: skip
        if n:
            counts[outcome] = n
    if not counts and not _SESSION.kind:
        return
    ran = ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) or "none ran"
    if _SESSION.bootstrap:
        where = f"{_SESSION.kind} at {_SESSION.bootstrap}, ready in {_SESSION.start_s:.1f} s"
    else:
        where = f"no broker: {_SESSION.failure or 'not started'}"
    terminalreporter.write_sep("-", f"kafka tests: {ran} ({where})")
