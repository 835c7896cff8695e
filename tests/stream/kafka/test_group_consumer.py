"""The seam's group consumer on the real broker, on each client: what the worker relies on in a rebalance."""

from __future__ import annotations

import time
from collections import defaultdict

import pytest

from rollout_stream.clients import Connection
from rollout_stream.kafka import TopicPartition, client_for
from tests.stream.helpers import new_topics

RECORDS = 200


class _Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, set[int]]] = []

    def on_assigned(self, partitions: set[int]) -> None:
        self.seen.append(("assigned", set(partitions)))

    def on_revoked(self, partitions: set[int]) -> None:
        self.seen.append(("revoked", set(partitions)))

    def on_lost(self, partitions: set[int]) -> None:
        self.seen.append(("lost", set(partitions)))


def test_a_partition_kept_through_a_rebalance_goes_on_after_the_last_record_handed_out(kafka_bootstrap):
    """The worker commits the lowest offset still held by an open window, far below what it has read, and
    keeps a partition's state when the partition stays with it. So a kept partition must not be fetched again
    from its committed offset: records read twice were dead-lettered twice (librdkafka, eager rebalance)."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="keep")
    client = client_for(Connection(kafka_bootstrap))
    producer = client.producer(client_id="keep-producer", max_record_bytes=1 << 20)

    def produce(start: int, count: int) -> None:
        for p in (0, 1):
            for i in range(start, start + count):
                producer.send(topics.input, f"{p}:{i}".encode(), partition=p)
        producer.flush()

    produce(0, RECORDS)
    group = f"g-{topics.input}"
    first_events, second_events = _Events(), _Events()
    first = client.group_consumer(group, client_id="keep-first", max_record_bytes=1 << 20,
                                  session_timeout_s=10)
    second = None
    handed: dict[int, list[int]] = defaultdict(list)
    try:
        first.subscribe(topics.input, first_events)
        deadline = time.monotonic() + 30
        while sum(map(len, handed.values())) < 2 * RECORDS and time.monotonic() < deadline:
            for tp, records in first.poll(0.2).items():
                handed[tp.partition] += [r.offset for r in records]
        assert sum(map(len, handed.values())) == 2 * RECORDS, dict(handed)
        # As the worker does with open windows: the committed offset is far below what was read.
        first.commit({TopicPartition(topics.input, p): 10 for p in (0, 1)})

        second = client.group_consumer(group, client_id="keep-second", max_record_bytes=1 << 20,
                                       session_timeout_s=10)
        second.subscribe(topics.input, second_events)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not (first.assignment() and second.assignment()
                                                   and len(first.assignment()) == 1):
            for tp, records in first.poll(0.1).items():
                handed[tp.partition] += [r.offset for r in records]
            second.poll(0.1)
        assert len(first.assignment()) == 1 and second.assignment(), (first_events.seen, second_events.seen)
        kept = next(iter(first.assignment())).partition
        assert ("revoked", {0, 1}) in first_events.seen, first_events.seen

        produce(RECORDS, 50)
        deadline = time.monotonic() + 20
        while len(handed[kept]) < RECORDS + 50 and time.monotonic() < deadline:
            for tp, records in first.poll(0.2).items():
                handed[tp.partition] += [r.offset for r in records]
            second.poll(0.05)
        time.sleep(0.5)
        for tp, records in first.poll(0.5).items():
            handed[tp.partition] += [r.offset for r in records]
        offsets = handed[kept]
        assert offsets == list(range(RECORDS + 50)), (
            f"partition {kept}: handed out {len(offsets)} records, {len(offsets) - len(set(offsets))} twice")
    finally:
        first.close()
        if second is not None:
            second.close()
        producer.close()


@pytest.mark.client("confluent")
def test_a_static_member_fenced_rejoins_anew_once_and_a_second_fence_soon_after_stands(kafka_bootstrap):
    """librdkafka#3437, on the confluent implementation: a static member can be fenced by its own retried join
    (after its session timed out, or on a worker started as a coordinator's broker stopped). The seam replaces
    the consumer, which rejoins with the same instance id and gets its partitions back; fenced again within
    REFENCED_WITHIN_S, the fencing stands (another live member takes the id back and forth)."""
    from confluent_kafka import KafkaError

    topics = new_topics(kafka_bootstrap, partitions=2, prefix="fenced")
    client = client_for(Connection(kafka_bootstrap, client="confluent"))
    events = _Events()
    consumer = client.group_consumer(f"g-{topics.input}", client_id="fenced", max_record_bytes=1 << 20,
                                     session_timeout_s=10, instance_id="fenced-0")
    try:
        consumer.subscribe(topics.input, events)
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.1)
        assert consumer.assignment()
        # as consume() hands it over: code _FATAL, the fatal flag unset (a cluster chaos run exited on it)
        fenced = KafkaError(KafkaError._FATAL, "Static consumer fenced by other consumer with same "
                            "group.instance.id")
        other = KafkaError(KafkaError._FATAL, "Fatal error: an unrelated fault")
        assert not consumer._recovered(other), "a fatal error that is no fencing is not recovered"
        assert consumer._recovered(fenced)
        deadline = time.monotonic() + 30
        while len(consumer.assignment()) < 2 and time.monotonic() < deadline:
            consumer.poll(0.1)
        assert {tp.partition for tp in consumer.assignment()} == {0, 1}
        assert events.seen[-1] == ("assigned", {0, 1}), events.seen
        assert any(kind == "lost" for kind, _ in events.seen), "the listener heard its partitions were lost"
        assert not consumer._recovered(fenced), "fenced again right after its rejoin: another has the id"
    finally:
        consumer.close()


@pytest.mark.client("confluent")
def test_two_live_members_given_one_instance_id_stop_fencing_each_other(kafka_bootstrap):
    """The fencing librdkafka reports when another live consumer joins with this one's instance id is
    recovered once (it may be librdkafka#3437's own rejoin); the two then take the id from each other, and the
    first member fenced again within REFENCED_WITHIN_S of its rejoin fails with the fencing."""
    from rollout_stream.kafka import KafkaFailure

    topics = new_topics(kafka_bootstrap, partitions=2, prefix="twice")
    client = client_for(Connection(kafka_bootstrap, client="confluent"))
    members = [client.group_consumer(f"g-{topics.input}", client_id=f"twice-{n}", max_record_bytes=1 << 20,
                                     session_timeout_s=10, instance_id="twice-0") for n in range(2)]
    failed: list[tuple[int, KafkaFailure]] = []
    try:
        members[0].subscribe(topics.input, _Events())
        deadline = time.monotonic() + 30
        while not members[0].assignment() and time.monotonic() < deadline:
            members[0].poll(0.1)
        assert members[0].assignment()
        members[1].subscribe(topics.input, _Events())
        deadline = time.monotonic() + 60
        while not failed and time.monotonic() < deadline:
            for n, member in enumerate(members):
                try:
                    member.poll(0.1)
                except KafkaFailure as exc:
                    failed.append((n, exc))
        assert failed, "two live members shared one instance id for 60 s and neither stopped"
        assert "group.instance.id" in str(failed[0][1]), failed
        assert all(m._rejoined_at is not None for m in members), "each was fenced once and rejoined first"
    finally:
        for member in members:
            member.close()
