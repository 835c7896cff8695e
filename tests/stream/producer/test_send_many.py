"""send_many numbers a prompt group's streaming fields; on the real broker the stage publishes it whole."""

from __future__ import annotations

import pytest

from rollout_stream.codec import Sample, decode_train_sample
from rollout_stream.config import WorkerConfig
from rollout_stream.producer import RolloutProducer, numbered_group
from tests.stream.helpers import new_topics, read_topic, running_worker


def miles_dict(index: int, rollout_id: int, reward: float) -> dict:
    return {"group_index": 3, "index": index, "rollout_id": rollout_id, "tokens": [1, 2, 3, 4],
            "response_length": 2, "loss_mask": [1, 1], "reward": reward, "status": "completed"}


def test_siblings_are_numbered_per_rollout_in_the_order_given_and_the_group_size_counts_rollouts():
    group = numbered_group([miles_dict(0, 7, 1.0), miles_dict(1, 8, 0.0), miles_dict(2, 7, 1.0),
                            Sample(group_index=3, index=3, rollout_id=9, reward=0.5)], run_id="r")
    assert [(s.rollout_id, s.sibling_index, s.sibling_count) for s in group] == [
        (7, 0, 2), (8, 0, 1), (7, 1, 2), (9, 0, 1)]
    assert {s.group_size for s in group} == {3} and {s.run_id for s in group} == {"r"}
    assert numbered_group([miles_dict(0, 7, 1.0)], group_size=4)[0].group_size == 4
    by_index = numbered_group([Sample(group_index=1, index=i, reward=0.0) for i in (5, 5, 6)])
    assert [(s.sibling_index, s.sibling_count) for s in by_index] == [(0, 2), (1, 2), (0, 1)]


def test_a_group_size_the_samples_carry_is_kept_so_a_call_may_publish_a_part_of_the_group():
    first = Sample(group_index=3, index=0, rollout_id=0, reward=1.0, group_size=4)
    part = numbered_group([first], run_id="r")
    assert [(s.group_size, s.sibling_count) for s in part] == [(4, 1)]
    mixed = numbered_group([Sample(group_index=3, index=0, rollout_id=0, reward=1.0, group_size=4),
                            miles_dict(1, 1, 0.0)], group_size=2)
    assert [s.group_size for s in mixed] == [4, 2]  # the argument fills only what is unset


def test_one_group_per_call():
    with pytest.raises(ValueError, match="one prompt group"):
        numbered_group(
            [Sample(group_index=1, index=0, reward=0.0), Sample(group_index=2, index=1, reward=0.0)]
        )
    with pytest.raises(ValueError, match="at least one"):
        numbered_group([])


@pytest.mark.kafka(timeout=90)
def test_a_group_sent_with_send_many_is_published_whole(kafka_bootstrap):
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="sendmany")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)
    with running_worker(config):
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
            producer.send_many([miles_dict(0, 7, 1.0), miles_dict(1, 8, 0.0), miles_dict(2, 7, 1.0)])
        published = [decode_train_sample(r.value) for r in read_topic(kafka_bootstrap, topics.output,
                                                                       min_count=3, timeout=30)]
    assert sorted(s.sample.index for s in published) == [0, 1, 2]
    assert {s.group_rollout_count for s in published} == {2}
    assert sorted(s.reward for s in published) == pytest.approx([-0.7071, 0.7071, 0.7071], abs=1e-4)


@pytest.mark.kafka(timeout=90)
def test_a_group_sent_one_rollout_per_call_is_published_whole(kafka_bootstrap):
    """Rollouts published as they finish, each saying the group has 3: one group of 3 at the stage, not a
    group of 1 and two late members."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="sendpart")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          commit_interval_s=0.2)
    with running_worker(config):
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
            for i, reward in enumerate((1.0, 0.0, 1.0)):
                producer.send_many([Sample(group_index=5, index=i, rollout_id=i, reward=reward,
                                           group_size=3)])
                producer.flush()
        published = [decode_train_sample(r.value) for r in read_topic(kafka_bootstrap, topics.output,
                                                                       min_count=3, timeout=30)]
        dead = read_topic(kafka_bootstrap, topics.dead_letter, min_count=0, settle=1.0)
    assert sorted(s.sample.index for s in published) == [0, 1, 2]
    assert {s.group_rollout_count for s in published} == {3}
    assert dead == []
