"""Heads cover train-data, or the reader knows, on the real broker: the stage writes heads for 10 groups;
restarted without `--write-heads` it refuses to start; groups an older stage published without heads leave a
`fetch="own"` trainer level with the heads, and `lag` shows it behind train-data by their records; the
trainer stops with one line instead of skipping them; the stage with heads again publishes the groups the
refused one left, and a whole-topic trainer reads every group."""

from __future__ import annotations

import uuid
from dataclasses import replace

import numpy as np
import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic

import rollout_stream.reader.coverage as coverage
from rollout_stream.clients import Connection
from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.names import heads_topic, progress_topic
from rollout_stream.ops.lag import lag_report
from rollout_stream.reader import TrainDataReader, UncoveredRecords
from rollout_stream.worker import Worker
from rollout_stream.worker.heads_in_use import HeadsInUse
from tests.stream.helpers import read_topic, running_worker
from tests.stream.reader.test_reader import publish, train_sample

pytestmark = [pytest.mark.kafka(timeout=300), pytest.mark.any_client]

SIZE = 2


def make_topics(bootstrap: str) -> TopicNames:
    tag = f"cover-{uuid.uuid4().hex[:8]}"
    names = TopicNames(f"{tag}-rollouts", f"{tag}-train", f"{tag}-dlq")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        every = (names.input, names.output, names.dead_letter, heads_topic(names.output),
                 progress_topic(names.output))
        admin.create_topics([NewTopic(n, 2, 1) for n in every])
    finally:
        admin.close()
    return names


def rollouts(bootstrap: str, topic: str, groups: range) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for g in groups:
        for r in range(SIZE):
            s = Sample(group_index=g, index=r, rollout_id=g * SIZE + r, reward=float(r), group_size=SIZE,
                       run_id="c", tokens=np.arange(8, dtype=np.int32) + g, response_length=4,
                       loss_mask=np.ones(4, dtype=np.uint8), weight_versions=["1"])
            producer.send(topic, key=group_key(s), value=encode_sample(s))
    producer.flush()
    producer.close()


def trainer(bootstrap: str, topic: str, group: str, fetch: str, client: str) -> TrainDataReader:
    return TrainDataReader(bootstrap, topic, group, groups_per_batch=2, partition_idle_ms=200, fetch=fetch,
                           client=client)  # type: ignore[arg-type]


def test_a_stage_without_heads_is_refused_and_groups_no_head_covers_are_never_skipped_in_silence(
        kafka_bootstrap, kafka_client, monkeypatch):
    monkeypatch.setattr(coverage, "UNCOVERED_AFTER_S", 3.0)
    monkeypatch.setattr(coverage, "COVERAGE_CHECK_S", 0.5)
    client = kafka_client or "confluent"
    topics = make_topics(kafka_bootstrap)
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_size=SIZE, write_heads=True,
                          group_id=f"w-{uuid.uuid4().hex[:8]}", commit_interval_s=0.1)
    rollouts(kafka_bootstrap, topics.input, range(0, 10))
    with running_worker(config):
        read_topic(kafka_bootstrap, heads_topic(topics.output), min_count=10, timeout=60)
    own = f"own-{uuid.uuid4().hex[:8]}"
    with trainer(kafka_bootstrap, topics.output, own, "own", client) as r:
        first = [r.next_batch(timeout=30) for _ in range(5)]
        assert all(b is not None for b in first)
        r.commit()

    rollouts(kafka_bootstrap, topics.input, range(10, 20))
    with pytest.raises(HeadsInUse, match="holds group heads.*--write-heads"):
        Worker(replace(config, write_heads=False), Connection(kafka_bootstrap, client=client)).run()
    # what an older stage, which does not refuse, publishes: 10 groups without heads
    publish(kafka_bootstrap, topics.output, [train_sample(g, g * 10 + r, samples=SIZE, run="old")
                                             for g in range(10) for r in range(SIZE)])
    report = lag_report(Connection(kafka_bootstrap, client=client), output_topic=topics.output,
                        input_topic=topics.input, stage_group_id=config.group_id)
    (row,) = [t for t in report.trainers if t.group_id == own]
    # level with the heads, behind the data
    assert row.records_behind == 0 and row.uncovered_records == 10 * SIZE
    assert any("never read them" in note for note in report.notes), report.notes

    with trainer(kafka_bootstrap, topics.output, own, "own", client) as r:
        with pytest.raises(UncoveredRecords, match="no group head .* covers"):
            r.next_batch(timeout=30)
        assert r.stats.batches == 0

    with running_worker(config):  # with heads again: the groups the refused stage left, with heads
        read_topic(kafka_bootstrap, heads_topic(topics.output), min_count=20, timeout=60)
    with trainer(kafka_bootstrap, topics.output, f"all-{uuid.uuid4().hex[:8]}", "all", client) as r:
        keys = [g.key for _ in range(15) if (b := r.next_batch(timeout=30)) is not None for g in b.groups]
    assert sorted(keys) == sorted([f"c/{g}" for g in range(20)] + [f"old/{g}" for g in range(10)])
