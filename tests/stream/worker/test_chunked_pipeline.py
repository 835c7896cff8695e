"""A broker whose message.max.bytes is 1 MiB, Kafka's default: a 128K-token rollout with MoE routing replay
(~201 MB) travels producer → worker → train-data → reader exactly, as chunk records of at most 900 KiB;
a value with a chunk missing is dead-lettered whole-or-not-at-all. On each client."""

from __future__ import annotations

import json
import time
import uuid

import numpy as np
import pytest
from typer.testing import CliRunner

from rollout_stream.broker.errors import PortInUse
from rollout_stream.broker.local import LocalBroker
from rollout_stream.broker.process import free_port
from rollout_stream.cli import app
from rollout_stream.codec import DeadLetterReason, Sample, ShapedArray, encode_sample, group_key
from rollout_stream.codec import headers as H
from rollout_stream.codec.chunks import CHUNK_HEADER, split
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.kafka import RecordRefused
from rollout_stream.producer import RolloutProducer
from rollout_stream.reader import TrainDataReader
from tests.stream.helpers import joined, read_topic, running_worker, train_samples, wait_until

pytestmark = [pytest.mark.kafka(timeout=300), pytest.mark.every_client]

ONE_MIB = 1 << 20


@pytest.fixture(scope="module")
def small_records_broker(tmp_path_factory):
    """A broker of the module's own that refuses any record batch over 1 MiB."""
    data_dir = tmp_path_factory.mktemp("one-mib") / "kafka"
    for _ in range(3):
        broker = LocalBroker(port=free_port(), data_dir=data_dir,
                             overrides={"message.max.bytes": str(ONE_MIB),
                                        "replica.fetch.max.bytes": str(ONE_MIB)})
        try:
            bootstrap = broker.start(timeout=90)
            break
        except PortInUse:
            continue
    else:
        pytest.fail("no free port for the 1 MiB broker")
    try:
        yield bootstrap
    finally:
        broker.stop(timeout=20)


def topics_on(bootstrap: str) -> TopicNames:
    """Input, train-data and dead-letter topics at the broker's own limit (no max.message.bytes of theirs)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    tag = f"c-{uuid.uuid4().hex[:8]}"
    names = TopicNames(f"{tag}-rollouts", f"{tag}-train", f"{tag}-dlq")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(n, 2, 1) for n in (names.input, names.output, names.dead_letter)])
    finally:
        admin.close()
    return names


def routed_sample(gi: int, rid: int, reward: float, tokens: int, *, size: int) -> Sample:
    """A rollout carrying MoE routing replay: (tokens - 1) x 48 layers x top-8 int32."""
    rng = np.random.default_rng(gi * 100 + rid)
    experts = rng.integers(0, 128, (tokens - 1, 48, 8), dtype="<i4")
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=size, run_id="big",
                  tokens=list(range(16)), response_length=8, loss_mask=[1] * 8, rollout_log_probs=[-0.5] * 8,
                  rollout_routed_experts=ShapedArray.of(experts))


def test_a_201_mb_rollout_crosses_a_1_mib_cluster_exactly_and_a_missing_chunk_is_dead_lettered(
        small_records_broker, tmp_path):
    bootstrap = small_records_broker
    topics = topics_on(bootstrap)
    big = routed_sample(0, 0, 1.0, 131_072, size=2)  # 128K tokens: ~201 MB of routing
    small = routed_sample(0, 1, 0.0, 4_096, size=2)  # ~6 MB
    broken = [routed_sample(1, 0, 1.0, 2_048, size=2), routed_sample(1, 1, 0.5, 8, size=2)]
    values = [encode_sample(s) for s in (big, small)]
    assert len(values[0]) > 200_000_000
    with pytest.raises(RecordRefused), RolloutProducer(bootstrap, topic=topics.input) as producer:
        producer.send_raw(b"k", b"x" * (2 * ONE_MIB)).get(30)  # the limit is real: 2 MiB whole is refused
    with RolloutProducer(bootstrap, topic=topics.input) as producer:
        # Group 1, written a while ago: its first sample lacks chunk 1 and the group times out soon.
        old = int(time.time() * 1000) - 50_000
        parts = split(encode_sample(broken[0]), 900 * 1024)
        for i, (header, part) in enumerate(parts):
            if i != 1:
                producer.send_raw(group_key(broken[0]), part, timestamp_ms=old,
                                  headers=[(CHUNK_HEADER, header)])
        producer.send(broken[1], timestamp_ms=old)
        futures = [producer.send(s) for s in (big, small)]
        producer.flush(120)
    assert all(f.exception() is None for f in futures)
    config = WorkerConfig(bootstrap_servers=bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          group_timeout_s=60.0, commit_interval_s=0.5)
    with running_worker(config) as worker:
        wait_until(lambda: worker.stats.groups_published == 1
                   and worker.stats.dead_lettered.get("incomplete_group", 0) > 0
                   and worker.stats.commits >= 1, 200, "the big group published, the broken one refused")
    out = read_topic(bootstrap, topics.output, min_count=len(values), timeout=120)
    assert len(out) > 200 and all(len(r.value or b"") <= 900 * 1024 for r in out)  # chunk records only
    with TrainDataReader(bootstrap, topics.output, f"trainer-{topics.input}", groups_per_batch=1,
                         start="earliest") as reader:
        batch = reader.next_batch(timeout=120)
        assert batch is not None and reader.stats.chunked_values == 2
        train = sorted(batch.samples, key=lambda t: t.sample.rollout_id)
        assert reader.next_batch(timeout=3) is None  # the broken group never reaches the trainer
    assert [t.sample.rollout_id for t in train] == [0, 1]
    assert np.array_equal(train[0].sample.rollout_routed_experts.numpy(), big.rollout_routed_experts.numpy())
    assert encode_sample(train[1].sample) == values[1]
    assert [t.sample.rollout_id for t in train_samples(joined(out))] in ([0, 1], [1, 0])
    dead = read_topic(bootstrap, topics.dead_letter, min_count=len(parts), timeout=60)
    reasons = {r.headers[H.REASON] for r in dead}
    assert reasons == {DeadLetterReason.INCOMPLETE_CHUNKS.value, DeadLetterReason.INCOMPLETE_GROUP.value}
    assert sum(r.headers[H.REASON] == "incomplete_chunks" for r in dead) == len(parts) - 1
    # The operator's view of those dead letters: one value per reason, the whole one decoded.
    args = ["--bootstrap-servers", bootstrap, "--dead-letter-topic", topics.dead_letter, "--json"]
    stats = json.loads(CliRunner().invoke(app, ["dlq", "stats", *args]).stdout)
    first = min((r for r in dead if r.headers[H.REASON] == "incomplete_chunks"), key=lambda r: r.offset)
    shown = json.loads(CliRunner().invoke(app, ["dlq", "show", f"{first.partition}:{first.offset}",
                                                *args]).stdout)
    assert (stats["values"], stats["chunked_values"], stats["chunk_records"]) == (2, 1, len(parts) - 1)
    assert stats["by_reason"] == {"incomplete_chunks": 1, "incomplete_group": 1}
    assert shown["chunks"]["missing"] == [1] and shown["value_bytes"] == len(encode_sample(broken[0]))
