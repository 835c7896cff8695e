"""A secured cluster for real: SASL_SSL with SCRAM, the StandardAuthorizer and least-privilege ACLs.

Brokers of this module (started here, in tmp dirs, on free ports; the session's PLAINTEXT broker is
untouched):
  * `cluster`  LocalBroker(secure=True): SASL_SSL, users admin (super user) and worker, ACLs on
  * `expired`  the same, with a broker certificate that expired in 2020 (only for that one test)

Every principal except admin gets exactly the ACLs `rollout-stream acls` computes, nothing more, and every
process the tests start is grepped for the passwords it was given.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from kafka import TopicPartition
from kafka.admin import UserScramCredentialUpsertion
from kafka.errors import CoordinatorNotAvailableError

from rollout_stream.access import apply_permissions
from rollout_stream.acls import (
    Permission,
    producer_permissions,
    reader_permissions,
    worker_permissions,
)
from rollout_stream.broker.errors import BrokerError, PortInUse
from rollout_stream.broker.local import LocalBroker
from rollout_stream.broker.pki import issue, new_ca
from rollout_stream.broker.process import free_port
from rollout_stream.broker.secure import SecureMaterial, prepare_secure_material
from rollout_stream.clients import Connection
from rollout_stream.codec import Sample, ShapedArray, TrainSample, encode_sample
from rollout_stream.config import TopicNames
from rollout_stream.kafka import (
    AuthenticationRefused,
    KafkaFailure,
    ListenerMismatch,
    OutgoingRecord,
    TlsRefused,
    authorization_cause,
    check_connection,
    client_for,
)
from rollout_stream.kafka.kafka_python import kafka_acl, raw_admin, raw_consumer
from rollout_stream.names import changelog_topic_name
from rollout_stream.ops.synth import FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from rollout_stream.security import SecretStr, SecuritySettings
from rollout_stream.topics import TopicSettings, ensure_changelog, ensure_topics

EXE = str(Path(sys.executable).with_name("rollout-stream"))

pytestmark = pytest.mark.every_client  # the same flags and files, mapped to each client's settings


# ---- brokers ---------------------------------------------------------------------------------------
@dataclass
class Cluster:
    broker: LocalBroker
    bootstrap: str
    material: SecureMaterial

    @property
    def admin(self) -> Connection:
        return self.broker.client_connection(self.bootstrap, client_id="tests-admin")

    @property
    def admin_config(self) -> Path:
        return self.material.properties_file("admin")

    def passwords(self) -> list[str]:
        return [self.material.password(u).get_secret_value() for u in ("admin", "worker")]


def _start(data_dir: Path, **kw: object) -> tuple[LocalBroker, str]:
    last: Exception | None = None
    for _ in range(3):  # a free port can be taken between asking and binding
        broker = LocalBroker(port=free_port(), data_dir=data_dir, secure=True, **kw)  # type: ignore[arg-type]
        try:
            return broker, broker.start(timeout=120)
        except PortInUse as exc:
            last = exc
        except BrokerError as exc:
            pytest.fail(f"the secured broker did not start: {exc}", pytrace=False)
    pytest.fail(f"no free port for the secured broker: {last}", pytrace=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    broker, bootstrap = _start(tmp_path_factory.mktemp("kafka-secure"))
    try:
        yield Cluster(broker, bootstrap, broker.material())
    finally:
        broker.stop(timeout=20)


@pytest.fixture(scope="module")
def expired(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A secured broker whose certificate expired in 2020.

    Kafka refuses to start with a key store its own trust store cannot validate; trusting the expired
    certificate itself as an anchor (PKIX does not check the validity of anchors) lets it start, while
    clients, which trust only the CA, must refuse it.
    """
    data_dir = tmp_path_factory.mktemp("kafka-expired")
    material = prepare_secure_material(data_dir / "secure")
    leaf = issue(
        material.ca,
        material.directory,
        "broker",
        common_name="localhost",
        not_before="20200101000000Z",
        not_after="20200102000000Z",
    )
    anchor = data_dir / "broker-trust.pem"
    anchor.write_text(
        material.ca.cert.read_text()
        + leaf.cert.read_text().split("-----END CERTIFICATE-----")[0]
        + "-----END CERTIFICATE-----\n"
    )
    broker, bootstrap = _start(data_dir, overrides={"ssl.truststore.location": str(anchor)})
    try:
        yield Cluster(broker, bootstrap, broker.material())
    finally:
        broker.stop(timeout=20)


# ---- principals, topics, processes -----------------------------------------------------------------
@dataclass
class User:
    name: str
    password: str
    password_file: Path

    @property
    def principal(self) -> str:
        return f"User:{self.name}"


def new_user(cluster: Cluster, tmp_path: Path, prefix: str) -> User:
    """A SCRAM-SHA-512/256 user with no ACL at all, its password in a 0600 file."""
    name, password = f"{prefix}-{uuid.uuid4().hex[:6]}", secrets.token_urlsafe(18)
    admin = raw_admin(cluster.admin)
    try:
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):  # one credential per user and request
            result = admin.alter_user_scram_credentials(
                [UserScramCredentialUpsertion(name, mechanism, password)]
            )
            assert result == {name: None}, result
    finally:
        admin.close()
    path = tmp_path / f"{name}.password"
    path.write_text(password + "\n")
    path.chmod(0o600)
    deadline = time.monotonic() + 10  # credentials reach the broker with the metadata log
    while True:
        try:
            check_connection(as_user(cluster, User(name, password, path)))
            return User(name, password, path)
        except AuthenticationRefused:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def as_user(cluster: Cluster, user: User, mechanism: str = "SCRAM-SHA-512") -> Connection:
    return Connection(
        cluster.bootstrap,
        security=SecuritySettings(
            protocol="SASL_SSL",
            sasl_mechanism=mechanism,
            sasl_username=user.name,  # type: ignore[arg-type]
            sasl_password=SecretStr(user.password),
            ssl_cafile=cluster.material.ca.cert,
        ),
    )


def user_flags(cluster: Cluster, user: User) -> list[str]:
    return [
        "--bootstrap-servers",
        cluster.bootstrap,
        "--security-protocol",
        "SASL_SSL",
        "--sasl-mechanism",
        "SCRAM-SHA-512",
        "--sasl-username",
        user.name,
        "--sasl-password-file",
        str(user.password_file),
        "--ssl-cafile",
        str(cluster.material.ca.cert),
    ]


def new_topics(cluster: Cluster, group_id: str, partitions: int = 3) -> TopicNames:
    """Rollouts, train-data, dead-letter and the worker's changelog, created by the admin."""
    tag = uuid.uuid4().hex[:8]
    topics = TopicNames(f"sec-{tag}-rollouts", f"sec-{tag}-train", f"sec-{tag}-dlq")
    ensure_topics(
        cluster.admin,
        data_topics=[topics.input, topics.output],
        dead_letter_topics=[topics.dead_letter],
        settings=TopicSettings(partitions=partitions),
    )
    ensure_changelog(cluster.admin, changelog_topic_name(group_id, topics.input), partitions)
    return topics


def child_env() -> dict[str, str]:
    """The commands here talk to this module's own brokers: a session broker named in the environment
    (`--bootstrap-servers`' variable) must not reach them. Read at each call: ROLLOUT_STREAM_CLIENT is the
    test's client (the kafka_client fixture sets it), so the commands run on it too."""
    return {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}


# How each client names a topic the principal may not use.
TOPIC_DENIED = {"kafka-python": "TopicAuthorizationFailedError", "confluent": "TOPIC_AUTHORIZATION_FAILED"}


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EXE, *args], capture_output=True, text=True, timeout=timeout, env={**child_env(), **(env or {})}
    )


def send_rollouts(conn: Connection, topic: str, groups: int, start: int = 0, seed: int = 0) -> int:
    """Clean groups (no faults) of 4 rollouts; returns the number of samples sent."""
    plan = SynthPlan(group_size=4, max_siblings=2, faults=FaultRates(), seed=seed, run_id="sec")
    sent = 0
    with RolloutProducer(conn, topic=topic) as producer:
        for records, _expected in plan_groups(plan, groups, start):
            for rec in records:
                producer.send_raw(rec.key, rec.value)
                sent += 1
    return sent


def committed_values(conn: Connection, topic: str, timeout: float = 15.0, want: int = 0) -> list[bytes]:
    """Every committed record value of `topic` (read_committed), waiting up to `timeout` for `want`."""
    consumer = raw_consumer(conn, group_id=None)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        quiet = time.monotonic()
        while time.monotonic() < deadline:
            got = [r.value for recs in consumer.poll(timeout_ms=200).values() for r in recs]
            values += got
            if got:
                quiet = time.monotonic()
            elif len(values) >= want and time.monotonic() - quiet > 1.0:
                break
        return values
    finally:
        consumer.close()


def committed_offsets(conn: Connection, group_id: str, topic: str) -> dict[int, int]:
    admin = raw_admin(conn)
    deadline = time.monotonic() + 20
    try:
        while True:
            try:
                found = admin.list_group_offsets({group_id: [TopicPartition(topic, p) for p in range(3)]})
                break
            except CoordinatorNotAvailableError:
                # A fresh broker creates its offsets topic at the first group lookup and answers "not
                # available" until that topic is loaded (seconds on a loaded machine): ask again.
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        admin.close()
    return {
        tp.partition: om.offset
        for tp, om in found.get(group_id, {}).items()
        if om.offset is not None and om.offset >= 0
    }


def assert_no_secret(texts: list[str], secret_values: list[str]) -> None:
    for text in texts:
        for secret in secret_values:
            assert secret not in text, "a password appeared in the output"


def worker_args(topics: TopicNames, group_id: str) -> list[str]:
    return [
        "--input-topic",
        topics.input,
        "--output-topic",
        topics.output,
        "--dead-letter-topic",
        topics.dead_letter,
        "--group-id",
        group_id,
        "--instance-id",
        "i1",
        "--group-timeout",
        "3",
        "--commit-interval",
        "0.3",
        "--progress-interval",
        "2",
    ]


# ---- the pipeline ----------------------------------------------------------------------------------
@pytest.mark.kafka(timeout=240)
def test_pipeline_synth_worker_reader_over_sasl_ssl_with_least_privilege(cluster, tmp_path):
    """synth (producer ACLs, env vars, SCRAM-SHA-256) → run (worker ACLs, flags, password file) →
    TrainDataReader (reader ACLs): every record accounted for, and no password in anything they printed."""
    from rollout_stream.reader import TrainDataReader  # torch

    group_id = f"sec-g-{uuid.uuid4().hex[:6]}"
    tag = uuid.uuid4().hex[:8]
    topics = TopicNames(f"sec-{tag}-rollouts", f"sec-{tag}-train", f"sec-{tag}-dlq")
    outputs: list[str] = []

    # the admin creates the topics (and the worker's changelog) from the client properties file
    created = cli(
        "topics",
        "create",
        "--kafka-config",
        str(cluster.admin_config),
        "--input-topic",
        topics.input,
        "--output-topic",
        topics.output,
        "--dead-letter-topic",
        topics.dead_letter,
        "--changelog-group-id",
        group_id,
    )
    outputs += [created.stdout, created.stderr]
    assert created.returncode == 0, created.stderr
    assert f"{changelog_topic_name(group_id, topics.input)}: created" in created.stdout

    worker, producer, trainer = (new_user(cluster, tmp_path, p) for p in ("worker", "producer", "trainer"))
    granted = cli(
        "acls",
        "apply",
        "--kafka-config",
        str(cluster.admin_config),
        "--principal",
        worker.principal,
        "--group-id",
        group_id,
        "--input-topic",
        topics.input,
        "--output-topic",
        topics.output,
        "--dead-letter-topic",
        topics.dead_letter,
    )
    outputs += [granted.stdout, granted.stderr]
    assert granted.returncode == 0, granted.stderr
    apply_permissions(cluster.admin, producer.principal, producer_permissions(input_topic=topics.input))
    apply_permissions(
        cluster.admin,
        trainer.principal,
        reader_permissions(output_topic=topics.output, group_id=f"{group_id}-trainer"),
    )

    # the producer: everything from environment variables, SCRAM-SHA-256
    synth = cli(
        "synth",
        "--input-topic",
        topics.input,
        "--groups",
        "40",
        "--max-siblings",
        "3",
        "--fault-rate",
        "0.03",
        "--seed",
        "7",
        env={
            "KAFKA_BOOTSTRAP_SERVERS": cluster.bootstrap,
            "KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
            "KAFKA_SASL_USERNAME": producer.name,
            "KAFKA_SASL_PASSWORD": producer.password,
            "KAFKA_SSL_CAFILE": str(cluster.material.ca.cert),
        },
    )
    outputs += [synth.stdout, synth.stderr]
    assert synth.returncode == 0, synth.stderr
    expected = json.loads(synth.stdout.strip().splitlines()[-1])
    # One more group, from the library as the producer user: a rollout with MoE routing replay (~6 MB) goes
    # out as chunk records of 256 KiB, which the worker reassembles and writes chunked again (900 KiB).
    routed = np.random.default_rng(0).integers(0, 64, (4_095, 48, 8), dtype="<i4")
    big_group = [
        Sample(group_index=0, index=rid, rollout_id=rid, reward=1.0 - rid, group_size=2, run_id="sec-big",
               tokens=list(range(16)), response_length=8, loss_mask=[1] * 8, rollout_log_probs=[-0.5] * 8,
               rollout_routed_experts=ShapedArray.of(routed) if rid == 0 else None)
        for rid in (0, 1)
    ]
    big_value = encode_sample(big_group[0])
    assert len(big_value) > 5_000_000
    with RolloutProducer(as_user(cluster, producer), topic=topics.input, chunk_bytes=256 << 10) as sender:
        sent = [sender.send(s) for s in big_group]
        sender.flush(60)
    assert all(f.exception() is None for f in sent)
    want_groups = expected["expected_published_groups"] + 1

    # the worker: flags and a password file; debug logging, to give a leak every chance
    log = tmp_path / "worker.log"
    metrics_port = free_port()
    args = [*user_flags(cluster, worker), *worker_args(topics, group_id), "--log-level", "debug",
            "--metrics-port", str(metrics_port)]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen([EXE, "run", *args], stdout=out, stderr=out, env=child_env())
    try:
        reader = TrainDataReader(
            as_user(cluster, trainer),
            topics.output,
            f"{group_id}-trainer",
            groups_per_batch=1,
            start="earliest",
            partition_idle_ms=300,
        )
        samples = 0
        groups = 0
        big_read: list[TrainSample] = []
        try:
            deadline = time.monotonic() + 90
            while groups < want_groups and time.monotonic() < deadline:
                batch = reader.next_batch(5.0)
                if batch is not None:
                    groups += len(batch.groups)
                    samples += len(batch.samples)
                    big_read += [t for t in batch.samples if t.sample.run_id == "sec-big"]
                assert proc.poll() is None, log.read_text()[-3000:]
            chunked = reader.stats.chunked_values
        finally:
            reader.close()
        assert (groups, samples) == (want_groups, expected["expected_published_samples"] + 2)
        assert chunked == 1  # the big train sample came as chunk records, joined by the reader
        by_rid = {t.sample.rollout_id: t.sample for t in big_read}
        assert sorted(by_rid) == [0, 1]
        assert encode_sample(by_rid[0]) == big_value
        assert np.array_equal(by_rid[0].rollout_routed_experts.numpy(), routed)
        assert encode_sample(by_rid[1]) == encode_sample(big_group[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            outputs.append(response.read().decode())
        assert "group_id" in outputs[-1]  # labels are there, and (below) no password in any of them
        dead = committed_values(
            cluster.admin, topics.dead_letter, want=sum(expected["expected_dead_letters"].values())
        )
        assert len(dead) == sum(expected["expected_dead_letters"].values())
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    printed = log.read_text()
    outputs.append(printed)
    assert rc == 0, printed[-3000:]
    started = next(line for line in printed.splitlines() if "event=worker.started" in line)
    assert "security_protocol=SASL_SSL" in started and "sasl_password=**********" in started
    assert f"sasl_username={worker.name}" in started
    assert_no_secret(outputs, [worker.password, producer.password, trainer.password, *cluster.passwords()])


# ---- least privilege -------------------------------------------------------------------------------
def _without(
    permissions: list[Permission],
    resource: str,
    operation: str,
    name_of: str,
    topics: TopicNames,
    group_id: str,
) -> tuple[list[Permission], Permission]:
    name = {
        "input": topics.input,
        "output": topics.output,
        "dead_letter": topics.dead_letter,
        "changelog": changelog_topic_name(group_id, topics.input),
        "group": group_id,
        "txn": f"rollout-stream-{group_id}-",
    }[name_of]
    dropped = next(p for p in permissions if (p.resource, p.operation, p.name) == (resource, operation, name))
    return [p for p in permissions if p != dropped], dropped


def revoke(cluster: Cluster, user: User, permission: Permission) -> None:
    """Delete one ACL the user was granted, as an operator would while its clients run."""
    from kafka.admin import ACLFilter

    admin = raw_admin(cluster.admin)
    try:
        acl = kafka_acl(permission.acl(user.principal))
        admin.delete_acls(
            [ACLFilter(acl.principal, acl.host, acl.operation, acl.permission_type, acl.resource_pattern)]
        )
    finally:
        admin.close()


@pytest.mark.kafka(timeout=120)
@pytest.mark.parametrize(
    "resource,operation,name_of",
    [
        ("topic", "Read", "input"),
        ("group", "Read", "group"),
        ("topic", "Write", "output"),
        ("topic", "Write", "dead_letter"),
        ("topic", "Write", "changelog"),
        ("transactional-id", "Write", "txn"),
    ],
)
def test_a_missing_permission_is_named_and_nothing_is_read_or_written(
    cluster, tmp_path, resource, operation, name_of
):
    group_id = f"sec-g-{uuid.uuid4().hex[:6]}"
    topics = new_topics(cluster, group_id)
    user = new_user(cluster, tmp_path, "w")
    everything = worker_permissions(
        input_topic=topics.input,
        output_topic=topics.output,
        dead_letter_topic=topics.dead_letter,
        group_id=group_id,
    )
    granted, dropped = _without(everything, resource, operation, name_of, topics, group_id)
    apply_permissions(cluster.admin, user.principal, granted)
    send_rollouts(cluster.admin, topics.input, 3)

    started = time.monotonic()
    result = cli("run", *user_flags(cluster, user), *worker_args(topics, group_id), timeout=60)
    elapsed = time.monotonic() - started

    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.stderr.strip().endswith(errors[0]), result.stderr
    assert f"{user.principal} is not allowed" in errors[0]
    assert f"missing {dropped}" in errors[0], errors[0]  # e.g. "missing WRITE on topic 'sec-…-train'"
    assert "rollout-stream acls print --principal" in errors[0]
    assert elapsed < 30, f"took {elapsed:.0f}s to refuse"
    assert committed_values(cluster.admin, topics.output, timeout=3) == []
    assert committed_values(cluster.admin, topics.dead_letter, timeout=3) == []
    assert committed_offsets(cluster.admin, group_id, topics.input) == {}
    assert_no_secret([result.stdout, result.stderr], [user.password])


@pytest.mark.kafka(timeout=180)
def test_a_permission_revoked_while_running_stops_the_worker_without_losing_or_half_writing(
    cluster, tmp_path
):
    """kafka-python fails a send to a topic it may no longer describe without failing the transaction; the
    worker must abort and stop rather than commit offsets past outputs that were never written."""
    group_id = f"sec-g-{uuid.uuid4().hex[:6]}"
    topics = new_topics(cluster, group_id)
    user = new_user(cluster, tmp_path, "w")
    permissions = worker_permissions(
        input_topic=topics.input,
        output_topic=topics.output,
        dead_letter_topic=topics.dead_letter,
        group_id=group_id,
    )
    apply_permissions(cluster.admin, user.principal, permissions)
    first = send_rollouts(cluster.admin, topics.input, 5)
    log = tmp_path / "worker.log"
    args = [EXE, "run", *user_flags(cluster, user), *worker_args(topics, group_id)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out, env=child_env())
    try:
        assert len(committed_values(cluster.admin, topics.output, timeout=60, want=first)) == first

        write_output = next(p for p in permissions if p.name == topics.output)
        revoke(cluster, user, write_output)
        time.sleep(1.0)
        second = send_rollouts(cluster.admin, topics.input, 5, start=100, seed=1)
        rc = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    printed = log.read_text()
    errors = [line for line in printed.splitlines() if line.startswith("error:")]
    assert rc == 2, printed[-3000:]
    # Named on both clients: librdkafka's error names no topic, so the worker asks the broker what is missing
    assert errors and f"missing WRITE on topic '{topics.output}'" in errors[-1], printed[-3000:]
    assert "rollout-stream acls print" in errors[-1], printed[-3000:]
    # exactly the first batch, whole groups; the input offsets stop before the second batch
    assert len(committed_values(cluster.admin, topics.output, want=first)) == first
    assert sum(committed_offsets(cluster.admin, group_id, topics.input).values()) == first

    # granted again, a restarted worker publishes the second batch: nothing was lost
    apply_permissions(cluster.admin, user.principal, [write_output])
    with open(log, "ab") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=out, env=child_env())
    try:
        assert (
            len(committed_values(cluster.admin, topics.output, timeout=60, want=first + second))
            == first + second
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    assert_no_secret([log.read_text()], [user.password])


def _record(topic: str, value: bytes) -> OutgoingRecord:
    return OutgoingRecord(topic, b"k", value, partition=0)


@pytest.mark.kafka(timeout=90)
def test_a_transaction_refused_on_one_topic_names_the_refusal_at_the_next_send_or_commit(
    cluster, tmp_path, kafka_client
):
    """Once a transaction has failed, librdkafka refuses every further record with a bare state error
    ("_STATE: Erroneous state") and keeps the cause for the next transactional call. The seam raises the
    cause, at whichever call meets it first, so the worker can name the missing ACL (a CI run stopped with
    exit 1 and the state error when a send met it before the commit did)."""
    group_id = f"sec-g-{uuid.uuid4().hex[:6]}"
    topics = new_topics(cluster, group_id)
    user = new_user(cluster, tmp_path, "t")
    permissions = worker_permissions(input_topic=topics.input, output_topic=topics.output,
                                     dead_letter_topic=topics.dead_letter, group_id=group_id)
    apply_permissions(cluster.admin, user.principal, permissions)
    producer = client_for(as_user(cluster, user)).producer(
        client_id="txn-refused", max_record_bytes=1 << 20, transactional_id=f"rollout-stream-{group_id}-t")
    raised: list[BaseException] = []
    try:
        producer.init_transactions()
        producer.begin_transaction()  # both topics known to the producer, as in a running worker
        producer.send_all_in_transaction(
            [_record(topics.dead_letter, b"first"), _record(topics.output, b"first")])
        producer.commit_transaction()
        _, write_dead_letter = _without(permissions, "topic", "Write", "dead_letter", topics, group_id)
        revoke(cluster, user, write_dead_letter)
        time.sleep(1.0)
        producer.begin_transaction()
        try:
            producer.send_all_in_transaction([_record(topics.dead_letter, b"denied")])
            deadline = time.monotonic() + 10  # the refusal comes back for the partition's AddPartitionsToTxn
            while time.monotonic() < deadline:
                producer.send_all_in_transaction([_record(topics.output, b"second")])
                time.sleep(0.05)
            producer.commit_transaction()
        except KafkaFailure as exc:
            raised.append(exc)
    finally:
        producer.close(timeout=10)
    assert raised, "a transaction committed a record to a topic the principal may no longer write"
    denied = authorization_cause(raised[0])
    assert denied is not None and denied.resource == "topic", repr(raised[0])
    assert committed_values(cluster.admin, topics.output, timeout=3, want=1) == [b"first"]


# ---- failing fast: credentials and certificates ----------------------------------------------------
@pytest.mark.kafka(timeout=60)
def test_wrong_password_fails_fast_with_one_line_and_never_echoes_it(cluster, tmp_path):
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password-" + secrets.token_hex(6))
    flags = [
        "--bootstrap-servers",
        cluster.bootstrap,
        "--security-protocol",
        "SASL_SSL",
        "--sasl-mechanism",
        "SCRAM-SHA-512",
        "--sasl-username",
        "worker",
        "--sasl-password-file",
        str(wrong),
        "--ssl-cafile",
        str(cluster.material.ca.cert),
    ]
    started = time.monotonic()
    result = cli("run", *flags, "--group-id", "never")
    assert time.monotonic() - started < 20
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: authentication failed for user 'worker' with SCRAM-SHA-512 at {cluster.bootstrap}: "
        "Authentication failed during authentication due to invalid credentials with SASL mechanism "
        "SCRAM-SHA-512; check the user name and password (--sasl-password-file, KAFKA_SASL_PASSWORD)"
    ]
    assert_no_secret([result.stdout, result.stderr], [wrong.read_text(), *cluster.passwords()])


def _settings(cluster: Cluster, **changes: object) -> SecuritySettings:
    return replace(cluster.material.security("worker"), **changes)  # type: ignore[arg-type]


@pytest.mark.kafka(timeout=60)
@pytest.mark.parametrize(
    "case",
    [
        "unknown user",
        "mechanism not offered",
        "untrusted CA",
        "plaintext client",
        "TLS without SASL",
        "client certificate from another CA",
    ],
)
def test_refusals_are_classified_at_once(cluster, tmp_path, case):
    other_ca = new_ca(tmp_path, name="someone else's CA")
    stranger = issue(other_ca, tmp_path, "stranger", common_name="stranger")
    settings, error, words = {
        "unknown user": (
            _settings(cluster, sasl_username="nobody"),
            AuthenticationRefused,
            "authentication failed for user 'nobody'",
        ),
        "mechanism not offered": (
            _settings(cluster, sasl_mechanism="PLAIN"),
            AuthenticationRefused,
            "does not offer SASL mechanism PLAIN (it offers: SCRAM-SHA-512, SCRAM-SHA-256)",
        ),
        "untrusted CA": (
            _settings(cluster, ssl_cafile=other_ca.cert),
            TlsRefused,
            "not signed by a trusted CA",
        ),
        "plaintext client": (SecuritySettings(), ListenerMismatch, "the listener probably requires TLS"),
        "TLS without SASL": (
            SecuritySettings(protocol="SSL", ssl_cafile=cluster.material.ca.cert),
            ListenerMismatch,
            "the listener requires SASL authentication",
        ),
        "client certificate from another CA": (
            _settings(cluster, ssl_certfile=stranger.cert, ssl_keyfile=stranger.key),
            TlsRefused,
            "refused our client certificate",
        ),
    }[case]
    started = time.monotonic()
    with pytest.raises(error) as info:
        check_connection(Connection(cluster.bootstrap, security=settings))
    assert time.monotonic() - started < 5
    assert words in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.kafka(timeout=60)
def test_mtls_client_certificate_from_the_cluster_ca_is_accepted(cluster):
    material = cluster.material
    settings = replace(
        material.security("worker"), ssl_certfile=material.client.cert, ssl_keyfile=material.client.key
    )
    check_connection(Connection(cluster.bootstrap, security=settings))
    admin = raw_admin(Connection(cluster.bootstrap, security=settings))
    admin.close()
    # a host name the certificate lists works with verification on
    check_connection(Connection(cluster.bootstrap.replace("127.0.0.1", "localhost"), security=settings))


@pytest.mark.kafka(timeout=120)
def test_expired_broker_certificate_fails_fast(expired):
    started = time.monotonic()
    result = cli("synth", "--groups", "1", "--kafka-config", str(expired.material.properties_file("worker")))
    assert time.monotonic() - started < 20
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: TLS: the certificate {expired.bootstrap} presented has expired (certificate verify failed: "
        "certificate has expired); the broker needs a renewed certificate"
    ]
    assert_no_secret([result.stdout, result.stderr], expired.passwords())


@pytest.mark.kafka(timeout=60)
def test_acls_print_matches_what_the_worker_was_granted(cluster):
    result = cli(
        "acls",
        "print",
        "--principal",
        "User:worker",
        "--group-id",
        "g",
        "--input-topic",
        "in",
        "--output-topic",
        "out",
        "--dead-letter-topic",
        "dlq",
        "--bootstrap-servers",
        cluster.bootstrap,
    )
    assert result.returncode == 0, result.stderr
    commands = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    prefix = (
        f"kafka-acls.sh --bootstrap-server {cluster.bootstrap} --command-config admin.properties --add "
        "--allow-principal User:worker "
    )
    assert [c.removeprefix(prefix) for c in commands] == [
        "--operation Read --topic in",
        "--operation Read --group g",
        "--operation Write --topic out",
        "--operation Write --topic dlq",
        "--operation Read --operation Write --topic g-in-windows-changelog",
        "--operation Write --transactional-id rollout-stream-g- --resource-pattern-type prefixed",
    ]


@pytest.mark.kafka(timeout=90)
def test_a_producer_without_write_is_refused_not_silently_dropped(cluster, tmp_path, kafka_client):
    group_id = f"sec-g-{uuid.uuid4().hex[:6]}"
    topics = new_topics(cluster, group_id)
    user = new_user(cluster, tmp_path, "p")  # no ACL at all
    result = cli("synth", *user_flags(cluster, user), "--input-topic", topics.input, "--groups", "2")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: the broker refused {user.principal}: missing WRITE on topic '{topics.input}' "
        f"({TOPIC_DENIED[kafka_client]}); grant it: rollout-stream acls apply --role producer --input-topic "
        f"{topics.input} --principal ..."
    ]
    assert committed_values(cluster.admin, topics.input, timeout=3) == []
    assert_no_secret([result.stdout, result.stderr], [user.password])


@pytest.mark.any_client  # the bench's settings; each client's secured pipeline is tested above
@pytest.mark.kafka(timeout=150)
def test_bench_runs_over_sasl_ssl_and_never_prints_a_password(cluster):
    root = Path(__file__).resolve().parents[3]  # the workshop runs from the repository's root
    result = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--quick", "--json", "--bootstrap-servers", cluster.bootstrap,
         "--kafka-config", str(cluster.admin_config)],
        capture_output=True, text=True, timeout=140, cwd=root, env=child_env())
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert all(r["stage"]["samples_per_s"] > 0 and r["passthrough"]["samples_per_s"] > 0
               for r in report["results"])
    for secret in cluster.passwords():
        assert secret not in result.stdout and secret not in result.stderr
