"""Replay payloads through the real stage: a group whose rollouts carry sampling masks (CSR) and uint16 MoE
routing replay reaches a miles trainer rank bit for bit, in the producer's dtypes (masks as miles holds
them: int32 ids, int64 offsets); a group with a NaN rollout log-prob on a trainable token, or a sampling mask
that does not fit its response, is dead-lettered as invalid_sample."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollout_stream.codec import Sample, ShapedArray
from rollout_stream.codec import headers as H
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.producer import RolloutProducer
from rollout_stream.reader import TrainDataReader
from tests.stream.helpers import read_topic, running_worker, wait_until

# the payloads are bytes the stage passes on and the reader decodes: above the Kafka seam
pytestmark = [pytest.mark.kafka(timeout=150), pytest.mark.any_client]

RESPONSE = 6


def rollout(gi: int, rid: int, reward: float, **kw: object) -> Sample:
    rng = np.random.default_rng(gi * 10 + rid)
    supports = [list(rng.integers(0, 50_000, rng.integers(1, 5))) for _ in range(RESPONSE)]
    offsets = np.cumsum([0] + [len(s) for s in supports]).astype(np.int32)
    fields: dict[str, object] = dict(
        group_index=gi, index=gi * 10 + rid, rollout_id=gi * 10 + rid, reward=reward, group_size=2,
        run_id="rp", tokens=list(range(10)), response_length=RESPONSE, loss_mask=[1] * RESPONSE,
        rollout_log_probs=np.full(RESPONSE, -0.5, dtype=np.float32),
        rollout_routed_experts=ShapedArray.of(rng.integers(0, 300, (9, 4, 8)).astype(np.uint16)),
        rollout_sampling_mask_ids=np.array([i for s in supports for i in s], dtype=np.int32),
        rollout_sampling_mask_offsets=offsets)
    fields.update(kw)
    return Sample(**fields)  # type: ignore[arg-type]


def test_masks_and_routing_reach_the_miles_layout_exactly_and_bad_ones_are_invalid(
        kafka_bootstrap, topic_factory, unique_group_id):
    topics = TopicNames(topic_factory(1), topic_factory(1), topic_factory(1))
    good = [rollout(0, 0, 1.0), rollout(0, 1, 0.0)]
    nan_on_trainable = [rollout(1, 0, 1.0, rollout_log_probs=np.array([-0.5, math.nan, -0.1, -1, -1, -1],
                                                                        dtype=np.float32)),
                        rollout(1, 1, 0.0)]
    short_mask = [rollout(2, 0, 1.0), rollout(2, 1, 0.0, rollout_sampling_mask_offsets=[0, 1, 2])]
    with RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
        for sample in good + nan_on_trainable + short_mask:
            producer.send(sample)
        producer.flush(30)
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=unique_group_id,
                          group_timeout_s=60.0, commit_interval_s=0.2)
    with running_worker(config) as worker:
        wait_until(lambda: worker.stats.groups_published == 1 and worker.stats.commits >= 1
                   and sum(worker.stats.dead_lettered.values()) == 4, 60, "one group published, two refused")
    dead = read_topic(kafka_bootstrap, topics.dead_letter, min_count=4, timeout=30)
    assert {r.headers[H.REASON] for r in dead} == {"invalid_sample"}
    messages = {r.headers[H.MESSAGE] for r in dead}
    assert any("rollout_log_probs[1]" in m for m in messages)
    assert any("rollout_sampling_mask_offsets has 3 entries" in m for m in messages)

    with TrainDataReader(kafka_bootstrap, topics.output, unique_group_id, groups_per_batch=1, layout="miles",
                         start="earliest", publish_progress=False) as reader:
        batch = reader.next_batch(timeout=60)
    assert batch is not None and batch.rollout_data is not None
    data = batch.rollout_data
    rows = sorted(range(2), key=lambda r: data["rollout_ids"][r])
    for row, sent in zip(rows, good, strict=True):
        experts = data["rollout_routed_experts"][row]
        assert experts.dtype == np.uint16 and np.array_equal(experts, sent.rollout_routed_experts.numpy())
        ids, offsets = data["rollout_sampling_mask_ids"][row], data["rollout_sampling_mask_offsets"][row]
        assert ids.dtype == np.int32 and offsets.dtype == np.int64
        assert ids.tobytes() == sent.rollout_sampling_mask_ids.numpy().tobytes()
        assert offsets.tolist() == sent.rollout_sampling_mask_offsets.tolist()
