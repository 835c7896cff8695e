"""What a TrainDataReader says while it cannot make a batch, on the in-memory seam: a topic that does not
exist is an error naming it, and a batch that waits says what for."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

import rollout_stream.reader.batching as batching_module
import rollout_stream.reader.fetch as fetch_module
from rollout_stream.codec import encode_train_sample
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.reader import TrainDataReader
from rollout_stream.topics import MissingTopic
from tests.stream.reader.test_reader import train_sample


@pytest.fixture
def cluster() -> MemoryCluster:
    return MemoryCluster()


def open_reader(cluster: MemoryCluster, topic: str, groups_per_batch: int = 1) -> TrainDataReader:
    return TrainDataReader("memory:9092", topic, "trainer", groups_per_batch=groups_per_batch,
                           publish_progress=False, partition_idle_ms=50, start="earliest",
                           kafka_client=cluster.client())


def publish_group(cluster: MemoryCluster, topic: str, g: int) -> None:
    producer = cluster.client().producer(transactional_id=f"stage-{g}")
    producer.init_transactions()
    producer.begin_transaction()
    for rid in range(2):
        s = train_sample(g, rid)
        producer.send(topic, encode_train_sample(s), s.group_key.encode(), partition=0)
    producer.commit_transaction()
    producer.close()


def test_a_topic_that_does_not_exist_is_an_error_naming_it(cluster, monkeypatch):
    monkeypatch.setattr(fetch_module, "TOPIC_WAIT_S", 0.5)
    started = time.monotonic()
    with open_reader(cluster, "nc-nosuch") as reader, pytest.raises(MissingTopic) as caught:
        reader.next_batch(30)
    assert time.monotonic() - started < 10
    assert str(caught.value).startswith("topic 'nc-nosuch' does not exist on memory:9092: the reader waited "
                                        "0.5s for it"), str(caught.value)
    assert caught.value.exit_code == 2  # a setting to fix, as the commands say of a missing topic


def test_a_topic_created_while_the_reader_waits_for_it_is_read(cluster, monkeypatch):
    monkeypatch.setattr(fetch_module, "TOPIC_WAIT_S", 5.0)

    def create() -> None:
        cluster.create_topic("late", 1)
        publish_group(cluster, "late", 1)

    timer = threading.Timer(1.0, create)
    timer.start()
    with open_reader(cluster, "late") as reader:
        batch = reader.next_batch(30)
    timer.join()
    assert batch is not None and [g.key for g in batch.groups] == ["r/1"]


def test_a_batch_that_waits_says_what_it_has_and_what_it_waits_for(cluster, monkeypatch, caplog):
    monkeypatch.setattr(batching_module, "WAITING_LOG_S", 0.3)
    cluster.create_topic("few", 2)
    publish_group(cluster, "few", 1)
    caplog.set_level(logging.INFO, logger="rollout_stream.reader")
    with open_reader(cluster, "few", groups_per_batch=3) as reader:
        assert reader.next_batch(1.5) is None  # 1 group of the 3 a batch needs
    lines = [r for r in caplog.records if getattr(r, "event", None) == "batch.waiting"]
    assert 2 <= len(lines) <= 6, [r.getMessage() for r in lines]  # at most one per WAITING_LOG_S
    last = lines[-1].fields  # type: ignore[attr-defined]
    assert last["topic"] == "few" and last["groups"] == "1/3" and last["held"] == 1
    assert last["partitions_at_end"] == "0,1"  # nothing more to read: the topic holds too few groups


@pytest.mark.kafka
def test_on_the_broker_a_topic_that_does_not_exist_is_named(kafka_bootstrap, kafka_client, monkeypatch):
    monkeypatch.setattr(fetch_module, "TOPIC_WAIT_S", 1.0)
    topic = f"nc-nosuch-{uuid.uuid4().hex[:8]}"
    reader = TrainDataReader(kafka_bootstrap, topic, "trainer", groups_per_batch=1, publish_progress=False)
    with reader, pytest.raises(MissingTopic, match=f"topic '{topic}' does not exist"):
        reader.next_batch(30)


def test_a_trainer_polling_with_short_timeouts_is_told_too(cluster, monkeypatch, caplog):
    monkeypatch.setattr(batching_module, "WAITING_LOG_S", 0.5)
    cluster.create_topic("few", 1)
    caplog.set_level(logging.INFO, logger="rollout_stream.reader")
    with open_reader(cluster, "few", groups_per_batch=2) as reader:
        for _ in range(12):
            assert reader.next_batch(0.1) is None
    lines = [getattr(r, "fields", {}) for r in caplog.records if getattr(r, "event", None) == "batch.waiting"]
    assert lines and lines[-1]["groups"] == "0/2" and lines[-1]["waited_s"] >= 1, lines
