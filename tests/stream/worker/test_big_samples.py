"""Big samples (docs/spec.md §4.5): records of 8 MiB and 32 MiB pass end to end through the exactly-once
worker, the train sample embedding the original bytes unchanged. Codec measurements:
bench/scripts/compression_bench.py."""

from __future__ import annotations

import numpy as np
import pytest

from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.config import WorkerConfig
from rollout_stream.core import RewardConfig, post_process_rewards
from rollout_stream.producer import RolloutProducer
from tests.stream.helpers import joined, new_topics, read_topic, running_worker, train_samples, wait_until

pytestmark = pytest.mark.kafka(timeout=120)

MiB = 1 << 20


def big_sample(gi: int, rid: int, reward: float, nbytes: int, *, size: int) -> Sample:
    """A sample whose tokens array alone is `nbytes` long (int32, 32K vocabulary)."""
    rng = np.random.default_rng(gi * 1000 + rid)
    n = nbytes // 4
    tokens = rng.integers(0, 32000, n, dtype="<i4")
    resp = n // 2
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=size, run_id="big",
                  tokens=tokens, response_length=resp, loss_mask=np.ones(resp, dtype="u1"),
                  rollout_log_probs=rng.normal(-1.0, 0.5, resp).astype("<f4"), weight_versions=["7"])


def test_8_and_32_mib_samples_pass_end_to_end_with_their_bytes_unchanged(kafka_bootstrap):
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="big")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          group_timeout_s=60.0, commit_interval_s=0.2)
    # Group 0: two rollouts of 8 MiB tokens each; group 1: one rollout of 32 MiB tokens.
    samples = [big_sample(0, 0, 1.0, 8 * MiB, size=2), big_sample(0, 1, 0.0, 8 * MiB, size=2),
               big_sample(1, 0, 0.5, 32 * MiB, size=1)]
    values = [encode_sample(s) for s in samples]
    assert [len(v) > n * MiB for v, n in zip(values, (8, 8, 32), strict=True)] == [True] * 3
    with running_worker(config) as worker:
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as p:
            futures = [p.send_raw(group_key(s), v) for s, v in zip(samples, values, strict=True)]
            p.flush(60)
        sources = [(f.get(10).partition, f.get(10).offset) for f in futures]
        wait_until(lambda: worker.stats.groups_published == 2 and worker.stats.commits > 0, 60,
                   "2 big groups committed")
    assert sum(worker.stats.dead_lettered.values()) == 0
    chunks = read_topic(kafka_bootstrap, topics.output, min_count=3, timeout=60)
    assert all(len(r.value) <= config.chunk_bytes for r in chunks)  # out as chunk records (docs/chunks.md)
    reads = joined(chunks)
    assert len(reads) == 3
    by_source = {(r.partition, r.offset): r for r in reads}
    assert len(by_source) == 3
    train = {(t.source_partition, t.source_offset): (t, r)
             for t, r in zip(train_samples(reads), reads, strict=True)}
    assert sorted(train) == sorted(sources)
    for src, value, sample in zip(sources, values, samples, strict=True):
        t, r = train[src]
        assert value in r.value, "the train sample must embed the original record bytes verbatim"
        assert len(r.value) - len(value) < 4096  # plus statistics and lineage only
        assert np.array_equal(t.sample.tokens.numpy(), sample.tokens.numpy())
        assert np.array_equal(t.sample.rollout_log_probs.numpy(), sample.rollout_log_probs.numpy())
    group0 = [train[s][0] for s in sources[:2]]
    raw, normalized = post_process_rewards([t.sample for t in group0], RewardConfig(), prompt_group_sizes=[2])
    assert [t.reward for t in group0] == normalized and [t.raw_reward for t in group0] == raw
