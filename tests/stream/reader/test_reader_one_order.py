"""One order for both fetch modes, on the real broker: over a backlog of chunked MoE records the stage writes
with heads (its train records' timestamps spread over the transaction, its heads written at once after
them), a reader of the heads (`fetch="own"`) and a reader of train-data (`fetch="all"`) yield the same
batches: the same groups in the same order, the same samples, the same group timestamps."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaProducer

from rollout_stream.codec import encode_sample, group_key
from rollout_stream.codec.group_heads import decode_group_head
from rollout_stream.config import WorkerConfig
from rollout_stream.names import heads_topic
from rollout_stream.reader import Batch, TrainDataReader
from tests.stream.helpers import read_topic, running_worker
from tests.stream.reader.test_reader_own_broker import CHUNK, SIZE, make_topics, moe

pytestmark = [pytest.mark.kafka(timeout=300), pytest.mark.any_client]

GROUPS, PER_BATCH = 12, 2


def batches(bootstrap: str, topic: str, fetch: str, client: str) -> list[Batch]:
    with TrainDataReader(bootstrap, topic, f"{fetch}-{uuid.uuid4().hex[:8]}", groups_per_batch=PER_BATCH,
                         start="earliest", partition_idle_ms=200, publish_progress=False, fetch=fetch,
                         client=client) as reader:  # type: ignore[arg-type]
        out = [reader.next_batch(timeout=60) for _ in range(GROUPS // PER_BATCH)]
    assert all(b is not None for b in out)
    return [b for b in out if b is not None]


def test_heads_and_train_data_give_the_same_batches(kafka_bootstrap, kafka_client):
    client = kafka_client or "confluent"
    topics = make_topics(kafka_bootstrap)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=8 << 20)
    for s in (moe(g, r) for g in range(GROUPS) for r in range(SIZE)):
        producer.send(topics.input, key=group_key(s), value=encode_sample(s))
    producer.flush()
    producer.close()
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_size=SIZE, write_heads=True,
                          group_id=f"w-{uuid.uuid4().hex[:8]}", chunk_bytes=CHUNK, commit_interval_s=0.5)
    with running_worker(config):
        heads = read_topic(kafka_bootstrap, heads_topic(topics.output), min_count=GROUPS, timeout=120)
    assert all(decode_group_head(h.value).timestamp_ms is not None for h in heads)
    own = batches(kafka_bootstrap, topics.output, "own", client)
    whole = batches(kafka_bootstrap, topics.output, "all", client)
    for a, b in zip(own, whole, strict=True):
        assert a.index == b.index and a.groups == b.groups  # keys, partitions, offsets and timestamps
        assert [(s.group_key, s.source_offset, s.sample.rollout_id) for s in a.samples] == [
            (s.group_key, s.source_offset, s.sample.rollout_id) for s in b.samples]
        assert bool((a.tokens == b.tokens).all()) and bool((a.rewards == b.rewards).all())
