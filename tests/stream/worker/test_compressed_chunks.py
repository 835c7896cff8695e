"""Chunked samples under compression (docs/compression.md, docs/chunks.md): RolloutProducer compresses its
chunk records itself (`compression_type`), the worker, which has no codec setting of its own, has its
train-data chunk records compressed by the broker (the topic's `compression.type`), and every sample comes
back exact. gzip: the one codec both clients have here (kafka-python lacks lz4 and zstd in the venv)."""

from __future__ import annotations

import numpy as np
import pytest
from kafka.admin import KafkaAdminClient

from rollout_stream.codec import Sample, ShapedArray, encode_sample, group_key
from rollout_stream.config import WorkerConfig
from rollout_stream.producer import RolloutProducer
from rollout_stream.reader import TrainDataReader
from tests.stream.helpers import joined, new_topics, read_topic, running_worker, train_samples, wait_until

# On both clients: each maps `compression_type` to its own setting, and decompresses with its own codecs.
pytestmark = pytest.mark.kafka(timeout=120)

CHUNK = 256 << 10


def routed(gi: int, rid: int, reward: float, tokens: int, *, size: int) -> Sample:
    """A rollout with MoE routing replay, (tokens - 1) x 48 x 8 int32: ~1.5 MB at 1,024 tokens."""
    experts = np.random.default_rng(gi * 100 + rid).integers(0, 64, (tokens - 1, 48, 8), dtype="<i4")
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=size, run_id="gz",
                  tokens=list(range(16)), response_length=8, loss_mask=[1] * 8, rollout_log_probs=[-0.5] * 8,
                  rollout_routed_experts=ShapedArray.of(experts))


def stored_bytes(bootstrap: str, topic: str) -> int:
    """What the broker holds of `topic` on disk (DescribeLogDirs), i.e. after any compression."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        dirs = admin.describe_log_dirs([topic])
    finally:
        admin.close()
    return sum(p["partition_size"] for broker in dirs for d in broker["log_dirs"] for t in d["topics"]
               if t["name"] == topic for p in t["partitions"])


def test_gzip_chunk_records_in_and_out_carry_samples_exactly(kafka_bootstrap: str) -> None:
    topics = new_topics(kafka_bootstrap, 2, "gz", output_config={"compression.type": "gzip"})
    # Group 0: two chunked rollouts (kafka-python gzips at level 9, ~1.4 MB/s: kept to ~3 MB); group 1: one
    # small rollout, a single compressed record.
    samples = [routed(0, 0, 1.0, 1_024, size=2), routed(0, 1, 0.0, 1_024, size=2),
               routed(1, 0, 0.5, 8, size=1)]
    values = [encode_sample(s) for s in samples]
    assert [len(v) > CHUNK for v in values] == [True, True, False]
    with RolloutProducer(kafka_bootstrap, topic=topics.input, chunk_bytes=CHUNK,
                         compression_type="gzip") as producer:
        futures = [producer.send(s) for s in samples]
        producer.flush(60)
    assert all(f.exception() is None for f in futures)
    raw = sum(len(v) for v in values)
    # The producer's batches are stored as sent: gzip takes the 6-bit routing ids in int32 to about a
    # quarter (uncompressed they would take `raw` bytes and more); above an eighth, so not an empty count.
    assert raw / 8 < stored_bytes(kafka_bootstrap, topics.input) < raw / 2
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          group_timeout_s=60.0, commit_interval_s=0.2, chunk_bytes=CHUNK)
    with running_worker(config) as worker:
        wait_until(lambda: worker.stats.groups_published == 2 and worker.stats.commits > 0, 60,
                   "both groups committed")
    assert sum(worker.stats.dead_lettered.values()) == 0
    out = read_topic(kafka_bootstrap, topics.output, min_count=3, timeout=60)
    assert all(len(r.value or b"") <= CHUNK for r in out) and len(out) > 3  # chunk records
    assert raw / 8 < stored_bytes(kafka_bootstrap, topics.output) < raw / 2  # gzipped by the broker
    train = {(t.sample.group_index, t.sample.rollout_id): t for t in train_samples(joined(out))}
    assert sorted(train) == [(0, 0), (0, 1), (1, 0)]
    for sample, value in zip(samples, values, strict=True):
        t = train[sample.group_index, sample.rollout_id]
        assert encode_sample(t.sample) == value and t.group_key == group_key(sample).decode()
    # The trainer's reader, on the test's client, decompresses and joins them too.
    with TrainDataReader(kafka_bootstrap, topics.output, f"trainer-{topics.input}", groups_per_batch=2,
                         start="earliest") as reader:
        batch = reader.next_batch(timeout=30)
        assert batch is not None and reader.stats.chunked_values == 2
    got = {(t.sample.group_index, t.sample.rollout_id): encode_sample(t.sample) for t in batch.samples}
    assert got == {(s.group_index, s.rollout_id): v for s, v in zip(samples, values, strict=True)}
