"""The in-memory seam behaves as a Kafka cluster does where the worker's exactly-once logic depends on it:
offsets with transaction markers, the last stable offset, fencing, KIP-447 group checks, eager rebalances."""

from __future__ import annotations

import ast
import inspect
import threading
import typing
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout_stream.kafka import seam
from rollout_stream.kafka.errors import (
    AuthorizationFailed,
    BrokerUnavailable,
    CommitFailed,
    KafkaFailure,
    ProducerFenced,
    TopicExists,
    UnknownTopic,
    authorization_cause,
)
from rollout_stream.kafka.memory import (
    MemoryAdmin,
    MemoryAssignedConsumer,
    MemoryClient,
    MemoryCluster,
    MemoryGroupConsumer,
    MemoryProducer,
    murmur2,
    range_assignment,
)
from rollout_stream.kafka.seam import Committed, TopicPartition, TopicSpec

TP0, TP1 = TopicPartition("in", 0), TopicPartition("in", 1)
Event = tuple[str, str, frozenset[int]]


@pytest.fixture
def cluster() -> MemoryCluster:
    cluster = MemoryCluster(clock_ms=1_000)
    cluster.create_topic("in", 2)
    return cluster


class Listener:
    """Records rebalance callbacks as (name, kind, partitions); `revoking` runs inside on_revoked."""

    def __init__(self, name: str, events: list[Event], revoking: Callable[[set[int]], None] | None = None):
        self.name, self.events, self.revoking = name, events, revoking

    def on_assigned(self, partitions: set[int]) -> None:
        self.events.append((self.name, "assigned", frozenset(partitions)))

    def on_revoked(self, partitions: set[int]) -> None:
        if self.revoking is not None:
            self.revoking(partitions)
        self.events.append((self.name, "revoked", frozenset(partitions)))

    def on_lost(self, partitions: set[int]) -> None:
        self.events.append((self.name, "lost", frozenset(partitions)))


def member(cluster: MemoryCluster, name: str, events: list[Event], **kw: object) -> MemoryGroupConsumer:
    consumer = cluster.client().group_consumer("g", client_id=name, max_record_bytes=1 << 20)
    consumer.subscribe("in", Listener(name, events, **kw))  # type: ignore[arg-type]
    return consumer


def reader(cluster: MemoryCluster, *tps: TopicPartition, isolation: str = "read_committed",
           commit_group: str | None = None) -> MemoryAssignedConsumer:
    consumer = cluster.client().assigned_consumer(client_id="r", max_record_bytes=1 << 20,
                                                  isolation=isolation, commit_group=commit_group)
    consumer.assign(list(tps or (TP0,)))
    return consumer


def drain(consumer: seam.AssignedConsumer | seam.GroupConsumer, polls: int = 20) -> list[seam.Record]:
    out: list[seam.Record] = []
    for _ in range(polls):
        out += [r for records in consumer.poll(0.0).values() for r in records]
    return out


def plain(cluster: MemoryCluster) -> MemoryProducer:
    return cluster.client().producer(client_id="p", max_record_bytes=1 << 20)


def transactional(cluster: MemoryCluster, tid: str = "tx") -> MemoryProducer:
    producer = cluster.client().producer(client_id=tid, max_record_bytes=1 << 20, transactional_id=tid)
    producer.init_transactions()
    return producer


# ---- records and topics --------------------------------------------------------------------------------
def test_sends_are_read_back_in_offset_order_with_their_fields(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    producer.send("in", b"a", b"k", partition=0, headers=[("h", b"1")])
    cluster.clock_ms = 2_000
    producer.send("in", b"b", partition=0)
    producer.send("in", b"c", partition=0, timestamp_ms=5)
    records = drain(reader(cluster))
    assert [(r.offset, r.value, r.timestamp) for r in records] == [(0, b"a", 1_000), (1, b"b", 2_000),
                                                                   (2, b"c", 5)]
    assert isinstance(records[0], seam.Record)
    assert records[0].key == b"k" and records[0].headers == (("h", b"1"),)


def test_keyed_sends_take_the_java_clients_partition() -> None:
    cluster = MemoryCluster()
    cluster.create_topic("t", 1000)
    producer = plain(cluster)
    assert murmur2(b"21") == -973932308 & 0xFFFFFFFF and murmur2(b"foobar") == -790332482 & 0xFFFFFFFF
    assert producer.partition_for("t", b"21") == (-973932308 & 0x7FFFFFFF) % 1000
    producer.send("t", b"v", b"21")
    assert [r.partition for r in cluster.records("t")] == [(-973932308 & 0x7FFFFFFF) % 1000]
    assert producer.partition_for("missing", b"21") is None and producer.partitions_for("missing") is None


@given(st.binary(max_size=64))
def test_murmur2_matches_kafka_python(key: bytes) -> None:
    from kafka.partitioner.default import murmur2 as kafka_murmur2  # type: ignore[import-untyped]

    assert murmur2(key) == kafka_murmur2(key) & 0xFFFFFFFF


def test_unknown_topics_are_refused_never_created(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    with pytest.raises(UnknownTopic):
        producer.send("missing", b"v")
    with pytest.raises(UnknownTopic):
        producer.send("in", b"v", partition=2)
    with pytest.raises(UnknownTopic):
        reader(cluster, TopicPartition("missing", 0)).poll(0.0)
    with pytest.raises(UnknownTopic):
        reader(cluster).end_offsets([TopicPartition("missing", 0)])
    assert reader(cluster).partitions_for_topic("missing") is None
    assert cluster.client().admin(client_id="a").list_topics() == {"in"}


def test_topic_limits_and_timestamp_type_apply(cluster: MemoryCluster) -> None:
    cluster.create_topic("small", 1, **{"max.message.bytes": "10", "message.timestamp.type": "LogAppendTime"})
    producer = plain(cluster)
    too_big = producer.send("small", b"x" * 11)
    fits = producer.send("small", b"x" * 10, timestamp_ms=5)
    assert not too_big.done()  # known at the flush, as a broker's answer is
    producer.flush()
    assert isinstance(too_big.exception(), KafkaFailure) and fits.done() and fits.exception() is None
    assert [(r.offset, r.timestamp) for r in cluster.records("small")] == [(0, 1_000)]


def test_admin_topics_configs_and_offsets(cluster: MemoryCluster) -> None:
    admin = cluster.client().admin(client_id="a")
    compact = TopicSpec("log", 3, configs={"cleanup.policy": "compact"})
    created = admin.create_topics([TopicSpec("in", 1), compact])
    assert isinstance(created["in"], TopicExists) and created["log"] is None
    present, missing = admin.describe_topics(["log", "nope"], authorized_operations=True)
    assert (present.partitions, present.error) == (3, None)
    assert "WRITE" in (present.authorized_operations or ())
    assert missing.partitions is None and isinstance(missing.error, UnknownTopic)
    assert admin.topic_configs("log")["cleanup.policy"] == "compact"
    assert admin.topic_configs("in")["cleanup.policy"] == "delete"
    reader(cluster, commit_group="g").commit({TP0: Committed(4, "m")})
    assert admin.group_offsets(["g", "h"], [TP0, TP1]) == {"g": {TP0: (4, "m")}, "h": {}}
    admin.delete_topics(["in", "nope"])
    assert admin.list_topics() == {"log"} and admin.group_offsets(["g"], [TP0]) == {"g": {}}
    assert admin.broker_count() == 1
    assert admin.create_acls([seam.AclSpec("User:x", "topic", "log", "Read")]) == []


# ---- transactions --------------------------------------------------------------------------------------
def test_read_committed_never_sees_aborted_records_and_skips_markers(cluster: MemoryCluster) -> None:
    producer = transactional(cluster)
    for values, commit in (([b"a", b"b"], True), ([b"x"], False), ([b"c"], True)):
        producer.begin_transaction()
        for v in values:
            producer.send("in", v, partition=0)
        producer.commit_transaction() if commit else producer.abort_transaction()
    committed = reader(cluster)
    assert [(r.offset, r.value) for r in drain(committed)] == [(0, b"a"), (1, b"b"), (5, b"c")]
    assert committed.fetch_position(TP0) == 7 == committed.highwater(TP0)  # past the last marker
    everything = drain(reader(cluster, isolation="read_uncommitted"))
    assert [r.offset for r in everything] == [0, 1, 3, 5]  # markers at 2, 4 and 6 are never records


def test_an_open_transaction_holds_read_committed_at_the_last_stable_offset(cluster: MemoryCluster) -> None:
    producer = transactional(cluster)
    producer.begin_transaction()
    producer.send("in", b"open", partition=0)
    plain(cluster).send("in", b"plain", partition=0)
    committed, uncommitted = reader(cluster), reader(cluster, isolation="read_uncommitted")
    assert drain(committed) == [] and committed.highwater(TP0) == 0 == committed.end_offsets([TP0])[TP0]
    assert committed.backlog() == 0 and committed.position(TP0) == 0
    assert [r.value for r in drain(uncommitted)] == [b"open", b"plain"] and uncommitted.highwater(TP0) == 2
    producer.commit_transaction()
    assert [(r.offset, r.value) for r in drain(committed)] == [(0, b"open"), (1, b"plain")]
    assert committed.fetch_position(TP0) == 3


def test_init_transactions_aborts_and_fences_the_older_producer(cluster: MemoryCluster) -> None:
    zombie = transactional(cluster)
    zombie.begin_transaction()
    zombie.send("in", b"zombie", partition=0)
    successor = transactional(cluster)  # same transactional id: a newer epoch
    assert cluster.records("in", isolation="read_uncommitted")[0].value == b"zombie"
    assert reader(cluster).end_offsets([TP0])[TP0] == 2  # aborted: the marker ended the transaction
    meta = reader(cluster, commit_group="g").group_metadata()
    for call in (zombie.begin_transaction, zombie.commit_transaction, zombie.abort_transaction,
                 lambda: zombie.send("in", b"v", partition=0),
                 lambda: zombie.send_offsets_to_transaction({TP0: 1}, meta)):
        with pytest.raises(ProducerFenced):
            call()
    successor.begin_transaction()
    successor.send("in", b"new", partition=0)
    successor.commit_transaction()
    assert [r.value for r in cluster.records("in")] == [b"new"]


def test_transaction_calls_out_of_order_are_refused(cluster: MemoryCluster) -> None:
    producer = cluster.client().producer(client_id="p", max_record_bytes=1 << 20, transactional_id="tx")
    with pytest.raises(KafkaFailure, match="init_transactions"):
        producer.begin_transaction()
    producer.init_transactions()
    with pytest.raises(KafkaFailure, match="begin_transaction"):
        producer.send("in", b"v")
    with pytest.raises(KafkaFailure):
        producer.commit_transaction()
    producer.begin_transaction()
    with pytest.raises(KafkaFailure):
        producer.begin_transaction()
    with pytest.raises(KafkaFailure):
        plain(cluster).init_transactions()


def test_offsets_sent_to_a_transaction_commit_only_with_it(cluster: MemoryCluster) -> None:
    producer, consumer = transactional(cluster), reader(cluster, commit_group="g")
    producer.begin_transaction()
    producer.send_offsets_to_transaction({TP0: 3}, consumer.group_metadata())
    producer.abort_transaction()
    assert consumer.committed(TP0) is None
    producer.begin_transaction()
    producer.send_offsets_to_transaction({TP0: Committed(5, "meta")}, consumer.group_metadata())
    assert consumer.committed(TP0) is None
    producer.commit_transaction()
    assert consumer.committed(TP0) == Committed(5, "meta")
    assert cluster.committed("g") == {TP0: Committed(5, "meta")}


def test_a_refused_send_fails_its_future_and_makes_the_transaction_abort_only(cluster: MemoryCluster) -> None:
    sender = plain(cluster)
    denied = AuthorizationFailed("no WRITE", resource="topic")
    cluster.fail_sends("in", denied)
    future = sender.send("in", b"refused", partition=0)
    assert not future.done() and future.exception() is None
    sender.flush()
    assert future.done() and future.exception() is denied
    assert sender.send("in", b"next", partition=0) and [r.value for r in cluster.records("in")] == [b"next"]
    cluster.fail_sends("in", BrokerUnavailable("down"), at_once=True)
    with pytest.raises(BrokerUnavailable):
        sender.send("in", b"v")

    producer = transactional(cluster)
    producer.begin_transaction()
    producer.send("in", b"kept", partition=1)
    cluster.fail_sends("in", denied)
    producer.send("in", b"refused", partition=1)
    with pytest.raises(KafkaFailure) as raised:
        producer.commit_transaction()
    assert authorization_cause(raised.value) is denied
    producer.abort_transaction()
    assert [r.value for r in cluster.records("in")] == [b"next"]


def test_an_injected_commit_failure_leaves_the_transaction_to_abort_or_retry(cluster: MemoryCluster) -> None:
    producer = transactional(cluster)
    producer.begin_transaction()
    producer.send("in", b"a", partition=0)
    cluster.fail_next_commit(BrokerUnavailable("timed out"))  # retriable: commit again
    with pytest.raises(BrokerUnavailable):
        producer.commit_transaction()
    producer.commit_transaction()
    producer.begin_transaction()
    producer.send("in", b"b", partition=0)
    cluster.fail_next_commit(KafkaFailure("refused"))
    with pytest.raises(KafkaFailure):
        producer.commit_transaction()
    with pytest.raises(KafkaFailure):
        producer.commit_transaction()  # abort-only now
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send("in", b"c", partition=0)
    cluster.fail_next_commit(ProducerFenced("fenced"))
    with pytest.raises(ProducerFenced):
        producer.commit_transaction()
    with pytest.raises(ProducerFenced):
        producer.begin_transaction()
    assert [r.value for r in cluster.records("in")] == [b"a"]


# ---- consumer groups -----------------------------------------------------------------------------------
def test_range_assignment_by_join_order() -> None:
    plan = range_assignment([("b", "in"), ("a", "in"), ("c", "in"), ("x", "other")], {"in": 5, "other": 1})
    assert plan == {"b": {TopicPartition("in", 0), TopicPartition("in", 1)},
                    "a": {TopicPartition("in", 2), TopicPartition("in", 3)},
                    "c": {TopicPartition("in", 4)}, "x": {TopicPartition("other", 0)}}


def test_revoke_commit_lands_before_the_new_owner_reads(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    for i in range(5):
        producer.send("in", b"%d" % i, partition=1)
    events: list[Event] = []

    def commit_positions(partitions: set[int]) -> None:
        known = {tp: a.fetch_position(tp) for tp in (TopicPartition("in", p) for p in partitions)}
        a.commit({tp: pos for tp, pos in known.items() if pos >= 0})

    a = member(cluster, "a", events, revoking=commit_positions)
    first = a.poll(0.0, max_records=3)  # joins, is assigned both, reads 3 of 5
    assert [r.offset for r in first[TP1]] == [0, 1, 2] and a.assignment() == {TP0, TP1}
    b = member(cluster, "b", events)
    assert b.poll(0.0) == {} and b.assignment() == set()  # joined; waits for a to revoke
    a.poll(0.0)
    assert cluster.committed("g")[TP1] == Committed(3)
    assert [r.offset for r in drain(b)] == [3, 4]
    assert events == [("a", "assigned", frozenset({0, 1})), ("a", "revoked", frozenset({0, 1})),
                      ("a", "assigned", frozenset({0})), ("b", "assigned", frozenset({1}))]


def test_partitions_kept_across_a_rebalance_keep_their_position_and_pause(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    for _ in range(4):
        producer.send("in", b"v", partition=0)
    a = member(cluster, "a", [])
    a.poll(0.0, max_records=2)  # nothing committed
    a.pause([TP0, TP1])
    cluster.rebalance("g")
    assert a.poll(0.0) == {} and a.fetch_position(TP0) == 2  # revoked and assigned again, still paused
    a.resume([TP0, TP1])
    assert [r.offset for r in drain(a)] == [2, 3]


def test_a_kicked_member_hears_on_lost_and_its_metadata_is_refused(cluster: MemoryCluster) -> None:
    events: list[Event] = []
    a, b = member(cluster, "a", events), member(cluster, "b", events)
    a.poll(0.0), b.poll(0.0), a.poll(0.0), b.poll(0.0)
    assert (a.assignment(), b.assignment()) == ({TP0}, {TP1})
    zombie = a.group_metadata()
    cluster.kick(a)
    b.poll(0.0)
    assert b.assignment() == {TP0, TP1}
    producer = transactional(cluster)
    producer.begin_transaction()
    with pytest.raises(CommitFailed):
        producer.send_offsets_to_transaction({TP0: 1}, zombie)  # KIP-447: the zombie cannot commit
    with pytest.raises(KafkaFailure):
        producer.commit_transaction()
    producer.abort_transaction()
    with pytest.raises(CommitFailed):
        a.commit({TP0: 1})
    events.clear()
    a.poll(0.0)  # on_lost, then rejoins: a new member, a new rebalance
    b.poll(0.0), a.poll(0.0)
    assert events == [("a", "lost", frozenset({0})), ("b", "revoked", frozenset({0, 1})),
                      ("b", "assigned", frozenset({0})), ("a", "assigned", frozenset({1}))]
    assert cluster.committed("g") == {}


def test_metadata_of_an_older_generation_is_refused(cluster: MemoryCluster) -> None:
    a = member(cluster, "a", [])
    a.poll(0.0)
    before = a.group_metadata()
    cluster.rebalance("g")
    a.poll(0.0)
    producer = transactional(cluster)
    producer.begin_transaction()
    with pytest.raises(CommitFailed, match="stale"):
        producer.send_offsets_to_transaction({TP0: 1}, before)
    producer.abort_transaction()
    producer.begin_transaction()
    producer.send_offsets_to_transaction({TP0: 1}, a.group_metadata())
    producer.commit_transaction()
    assert cluster.committed("g") == {TP0: Committed(1)}


def test_close_revokes_then_leaves(cluster: MemoryCluster) -> None:
    events: list[Event] = []
    a, b = member(cluster, "a", events), member(cluster, "b", events)
    a.poll(0.0), b.poll(0.0), a.poll(0.0), b.poll(0.0)
    events.clear()
    a.close()
    b.poll(0.0)
    assert events == [("a", "revoked", frozenset({0})), ("b", "revoked", frozenset({1})),
                      ("b", "assigned", frozenset({0, 1}))]
    with pytest.raises(KafkaFailure):
        a.poll(0.0)


def test_a_group_with_live_members_refuses_commits_from_outside(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    for _ in range(3):
        producer.send("in", b"v", partition=0)
    outsider = reader(cluster, commit_group="g")
    outsider.commit({TP0: 2})  # an empty group only stores offsets
    a = member(cluster, "a", [])
    assert [r.offset for r in a.poll(0.0)[TP0]] == [2]  # it starts from the group's commit
    with pytest.raises(CommitFailed):
        outsider.commit({TP0: 3})


# ---- fetching ------------------------------------------------------------------------------------------
def test_pause_resume_and_backlog(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    for i in range(6):
        producer.send("in", b"v", partition=i % 2)
    consumer = reader(cluster, TP0, TP1)
    consumer.pause([TP0])
    polled = consumer.poll(0.0, max_records=1)
    assert list(polled) == [TP1] and consumer.backlog() == 2
    consumer.pause([TP1])
    assert consumer.poll(0.0) == {} and consumer.backlog() == 0
    consumer.resume([TP0, TP1])
    assert {r.partition for r in drain(consumer)} == {0, 1} and consumer.backlog() == 0
    with pytest.raises(KafkaFailure):
        consumer.pause([TopicPartition("in", 9)])


def test_a_new_assignment_is_not_paused(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    for _ in range(3):
        producer.send("in", b"v", partition=0)
    consumer = reader(cluster, TP0)
    consumer.pause([TP0])
    consumer.assign_at(TP0, 1)  # as librdkafka and kafka-python do, through their seams
    assert [r.offset for r in drain(consumer)] == [1, 2]


def test_seeks_resolve_lazily(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    producer.send("in", b"a", partition=0)
    consumer = reader(cluster)
    consumer.seek_to_end([TP0])
    producer.send("in", b"b", partition=0)  # before the poll that resolves "end"
    assert drain(consumer) == [] and consumer.position(TP0) == 2
    consumer.seek_to_beginning([TP0])
    assert [r.value for r in drain(consumer)] == [b"a", b"b"]
    consumer.seek(TP0, 1)
    assert [r.value for r in drain(consumer)] == [b"b"]
    consumer.seek(TP0, 9)  # out of range: auto_offset_reset (earliest)
    assert [r.value for r in drain(consumer)] == [b"a", b"b"]


def test_offsets_for_times(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    for stamp in (10, 30, 20):
        producer.send("in", b"v", partition=0, timestamp_ms=stamp)
    assert reader(cluster).offsets_for_times({TP0: 15}) == {TP0: 1}  # the first at or after, by offset
    assert reader(cluster).offsets_for_times({TP0: 31, TP1: 0}) == {TP0: None, TP1: None}


def test_a_consumer_reads_what_another_thread_sends(cluster: MemoryCluster) -> None:
    producer = plain(cluster)
    sender = threading.Thread(target=lambda: [producer.send("in", b"v", partition=0) for _ in range(300)])
    consumer, seen = reader(cluster), list[int]()
    sender.start()
    while len(seen) < 300:
        seen += [r.offset for records in consumer.poll(0.01).values() for r in records]
    sender.join()
    assert seen == list(range(300))


# ---- the seam ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol, implementation", [
    (seam.GroupConsumer, MemoryGroupConsumer), (seam.AssignedConsumer, MemoryAssignedConsumer),
    (seam.Producer, MemoryProducer), (seam.Admin, MemoryAdmin), (seam.Client, MemoryClient)])
def test_each_class_takes_what_the_seam_passes(protocol: type, implementation: type) -> None:
    for name in _protocol_methods(protocol):
        wanted = inspect.signature(getattr(protocol, name)).parameters
        given = inspect.signature(getattr(implementation, name)).parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in given.values())
        for param in wanted.values():
            if param.kind is param.VAR_KEYWORD:
                assert takes_kwargs, f"{implementation.__name__}.{name} takes no **{param.name}"
                continue
            assert param.name in given, f"{implementation.__name__}.{name} lacks {param.name}"
            assert given[param.name].kind is param.kind, f"{implementation.__name__}.{name}({param.name})"
            if param.default is not param.empty:
                assert given[param.name].default is not param.empty, f"{name}({param.name}) needs a default"


def _protocol_methods(protocol: type) -> set[str]:
    skip = {object, typing.Protocol, typing.Generic}
    return {n for klass in protocol.__mro__ if klass not in skip
            for n, v in vars(klass).items() if callable(v) and not n.startswith("_")}


def test_nothing_in_the_package_imports_the_memory_cluster() -> None:
    """It is for tests: no command may run on it. And it needs no client library."""
    root = Path(__file__).resolve().parents[3]
    memory = root / "stream" / "kafka" / "memory"
    for path in sorted((root / "stream").rglob("*.py")):
        names = _imported(path, root)
        if memory in path.parents:
            assert not {n for n in names if n.split(".")[0] == "kafka"}, f"{path} imports a client library"
        else:
            assert not {n for n in names if n.startswith("rollout_stream.kafka.memory")}, f"{path} imports it"


def _imported(path: Path, root: Path) -> set[str]:
    folder, *inner = path.relative_to(root).parent.parts
    package = ["rollout_stream", *inner]  # stream/ installs as rollout_stream
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: from the importing module's package, up level - 1
                module = ".".join(package[:len(package) - node.level + 1] + ([module] if module else []))
            names |= {module} | {f"{module}.{a.name}" for a in node.names}
    return names
