"""layout="miles" on the real broker: each DP rank's batch carries exactly the shard a miles trainer rank
would get in-process for the batch's samples (rollout_stream.core.miles: train_data → split_by_dp →
trainer_shard)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from rollout_stream.core.miles import split_by_dp, train_data, trainer_shard
from rollout_stream.reader import TrainDataReader
from tests.stream.reader.test_reader import make_group, publish, sid, train_sample

# any client: sharding over the reader's batches; the reader on each client is in test_reader
pytestmark = pytest.mark.any_client

BATCHES = 6
GROUPS_PER_BATCH = 4


def same(a, b) -> bool:
    """Equal key for key, value for value, with the same Python types (floats compared by bits)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@pytest.mark.kafka(timeout=150)
@pytest.mark.parametrize("balance_data", [False, True])
def test_two_miles_ranks_get_the_shards_miles_builds_for_each_batch(kafka_bootstrap, topic_factory,
                                                                     unique_group_id, balance_data):
    rng = random.Random(16)
    topic = topic_factory(3)
    if balance_data:  # miles' balanced split needs a batch size divisible by the DP size: 4 samples a group
        groups = [[train_sample(g, g * 100 + r, sib=sib, nsib=2, rollouts=2, samples=4, reward=float(r),
                                tokens=rng.randint(4, 40)) for r in range(2) for sib in range(2)]
                  for g in range(BATCHES * GROUPS_PER_BATCH)]
    else:
        groups = [make_group(g, rng) for g in range(BATCHES * GROUPS_PER_BATCH)]
    publish(kafka_bootstrap, topic, [s for group in groups for s in group])

    def read(**kw) -> list:
        with TrainDataReader(kafka_bootstrap, topic, f"{unique_group_id}-{kw}",
                             groups_per_batch=GROUPS_PER_BATCH,
                             start="earliest", idle_timeout_s=20, **kw) as reader:
            return [reader.next_batch(timeout=20) for _ in range(BATCHES)]

    whole = read()  # one rank, tensor layout: every batch's global sample list, in order
    ranks = [read(layout="miles", balance_data=balance_data, rank=r, world_size=2) for r in range(2)]
    for b, batch in enumerate(whole):
        assert batch is not None and all(rank[b] is not None for rank in ranks)
        everything = batch.samples
        expected = split_by_dp(
            train_data(everything, prompt_group_sizes=[g.samples for g in batch.groups]), 2,
            balance_data=balance_data,
        )
        shards = [rank[b] for rank in ranks]
        assert sorted(sid(s) for shard in shards for s in shard.samples) == sorted(map(sid, everything))
        for r, shard in enumerate(shards):
            assert shard.index == batch.index
            assert [g.key for g in shard.groups] == [g.key for g in batch.groups]
            assert [sid(s) for s in shard.samples] == [
                sid(everything[row]) for row in expected[r]["partition"]
            ]
            assert same(shard.rollout_data, trainer_shard(expected[r]))
            assert len(shard.rollout_data["tokens"]) == len(shard.samples) == len(shard.tensors.tokens)
