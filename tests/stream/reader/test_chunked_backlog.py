"""A backlog of chunked samples at the scale trainers run: 320 groups over 3 partitions, every sample in 4 KiB
chunks, the worker and then the reader each restarted in the middle of it. Every group reaches training once,
byte for byte, on each client."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from rollout_stream.codec import Sample, encode_sample
from rollout_stream.config import WorkerConfig
from rollout_stream.producer import RolloutProducer
from rollout_stream.reader import TrainDataReader
from tests.stream.helpers import new_topics, running_worker, wait_until

pytestmark = pytest.mark.kafka(timeout=240)

GROUPS = 320  # whole batches of 16: a partial batch waits for more data
SIZE = 4
CHUNK = 4096


def sample(gi: int, rid: int) -> Sample:
    """~14 KB: four chunks."""
    rng = np.random.default_rng(gi * SIZE + rid)
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=float(rid % 2), group_size=SIZE,
                  run_id="backlog", tokens=rng.integers(0, 32000, 3500, dtype="<i4"), response_length=8,
                  loss_mask=[1] * 8, rollout_log_probs=[-0.5] * 8)


def test_restarts_onto_a_backlog_of_chunked_groups_deliver_every_group_once(kafka_bootstrap, kafka_client):
    topics = new_topics(kafka_bootstrap, partitions=3, prefix="chunk-backlog")
    sent = {(f"backlog/{gi}", rid): encode_sample(sample(gi, rid))
            for gi in range(GROUPS) for rid in range(SIZE)}
    assert all(len(v) > 3 * CHUNK for v in sent.values())
    with RolloutProducer(kafka_bootstrap, topic=topics.input, chunk_bytes=CHUNK) as producer:
        for gi in range(GROUPS):
            producer.send_many([sample(gi, rid) for rid in range(SIZE)])
        producer.flush(60)
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          group_timeout_s=600.0, commit_interval_s=0.2, chunk_bytes=CHUNK)
    with running_worker(config) as first:  # onto the whole backlog; stopped a third of the way
        wait_until(lambda: first.stats.groups_published >= GROUPS // 3, 120, "a third of the backlog")
    with running_worker(config) as second:  # the rest, from the first one's commits
        wait_until(lambda: first.stats.groups_published + second.stats.groups_published == GROUPS, 120,
                   "the whole backlog published")
    assert not first.stats.dead_lettered and not second.stats.dead_lettered

    trained: Counter = Counter()

    def read(batches: int | None) -> None:
        with TrainDataReader(kafka_bootstrap, topics.output, f"trainer-{topics.input}", groups_per_batch=16,
                             start="committed") as reader:
            taken = 0
            while (batches is None or taken < batches) and len(trained) < len(sent):
                batch = reader.next_batch(timeout=20)
                assert batch is not None, f"stalled after {len(trained)} of {len(sent)} samples"
                for t in batch.samples:
                    assert encode_sample(t.sample) == sent[(t.group_key, t.sample.rollout_id)]
                    trained[(t.group_key, t.sample.rollout_id)] += 1
                reader.commit()
                taken += 1
            assert reader.stats.chunked_values > 0 and reader.stats.incomplete_chunked_values == 0

    read(batches=7)  # a trainer stopped mid-backlog...
    read(batches=None)  # ...and restarted: from its commit, every value's chunks collected again
    assert trained == Counter(dict.fromkeys(sent, 1))
