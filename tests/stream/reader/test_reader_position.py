"""TrainDataReader.commit(position): a trainer that consumes batches after reading ahead commits exactly
the batch it trained, never one before a commit it made, and a restart resumes after it."""

from __future__ import annotations

import pytest

from rollout_stream.reader import TrainDataReader
from tests.stream.integrations.groups import committed_batch
from tests.stream.reader.test_reader import publish, train_sample

pytestmark = pytest.mark.any_client  # the reader's commit, the same on both clients


@pytest.mark.kafka(timeout=90)
def test_commit_of_an_earlier_position(kafka_bootstrap, topic_factory, unique_group_id):
    topic = topic_factory(partitions=1)
    groups = [train_sample(g, g * 10 + r, samples=2) for g in range(4) for r in range(2)]
    publish(kafka_bootstrap, topic, groups)
    with TrainDataReader(kafka_bootstrap, topic, unique_group_id, groups_per_batch=1, start="earliest",
                         partition_idle_ms=100) as reader:
        positions = []
        for _ in range(3):  # read ahead three batches
            batch = reader.next_batch(timeout=30)
            assert batch is not None
            positions.append(reader.position)
        assert [p.index for p in positions] == [0, 1, 2]
        assert reader.commit(positions[0])
        assert committed_batch(kafka_bootstrap, topic, unique_group_id, 1) == 0
        assert reader.commit(positions[2])
        assert not reader.commit(positions[1])  # never back
        assert committed_batch(kafka_bootstrap, topic, unique_group_id, 1) == 2
    with TrainDataReader(kafka_bootstrap, topic, unique_group_id, groups_per_batch=1,
                         partition_idle_ms=100) as again:
        batch = again.next_batch(timeout=30)
        assert batch is not None and batch.index == 3 and {s.sample.group_index for s in batch.samples} == {3}
