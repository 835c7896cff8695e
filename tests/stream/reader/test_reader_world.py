"""One world per trainer group: a rank whose settings disagree with the world its group committed refuses to
start (one WorldMismatch naming the setting and both values, nothing trained); a rescale starts a new world
at a batch boundary and every sample still trains exactly once, also across a restart after it."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from rollout_stream.codec import TrainSample, encode_train_sample
from rollout_stream.core.world import World, committed_batches
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.reader import Batch, TrainDataReader, WorldMismatch
from tests.stream.reader.test_reader import publish, sid, train_sample

pytestmark = pytest.mark.any_client  # the reader's commits and their metadata, the same on both clients

GROUPS_PER_BATCH = 2


def backlog(groups: int) -> list[TrainSample]:
    return [train_sample(g, g * 10 + r, samples=2) for g in range(groups) for r in range(2)]


def world(bootstrap: str, topic: str, group: str, size: int, batches: int, **kw: Any) -> list[list[Batch]]:
    """Ranks 0..size-1 as threads, each taking `batches` batches and committing each once every rank has it
    (a barrier, as a step's all-reduce is)."""
    out: list[list[Batch]] = [[] for _ in range(size)]
    errors: list[BaseException] = []
    step = threading.Barrier(size, timeout=60)

    def rank(r: int) -> None:
        try:
            with TrainDataReader(bootstrap, topic, group, groups_per_batch=GROUPS_PER_BATCH, rank=r,
                                 world_size=size, partition_idle_ms=100, publish_progress=False,
                                 **kw) as reader:
                for _ in range(batches):
                    batch = reader.next_batch(timeout=30)
                    assert batch is not None, f"rank {r}: batch {len(out[r])} did not come"
                    out[r].append(batch)
                    step.wait()
                    reader.commit()
        except BaseException as exc:
            errors.append(exc)
            step.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, [str(e) for e in errors]
    return out


def refused(make: Callable[[], TrainDataReader]) -> str:
    """The one line a rank refuses with; it yields nothing."""
    with make() as reader:
        with pytest.raises(WorldMismatch) as caught:
            reader.next_batch(timeout=30)
        assert reader.stats.batches == 0
    assert isinstance(caught.value, ConfigurationError) and "\n" not in str(caught.value)
    return str(caught.value)


@pytest.mark.kafka(timeout=150)
def test_a_rank_with_another_world_size_refuses_and_the_group_trains_every_sample_once(
        kafka_bootstrap, topic_factory, unique_group_id):
    topic = topic_factory(2)
    samples = backlog(12)
    publish(kafka_bootstrap, topic, samples)

    def rank(r: int, size: int, **kw: Any) -> TrainDataReader:
        kw.setdefault("groups_per_batch", GROUPS_PER_BATCH)
        return TrainDataReader(kafka_bootstrap, topic, unique_group_id, rank=r, world_size=size,
                               partition_idle_ms=100, publish_progress=False, **kw)

    # rank 1 of a world of 3 starts first: it waits for rank 0 to record the world, then refuses
    bad: list[str] = []
    waiting = threading.Thread(target=lambda: bad.append(refused(lambda: rank(1, 3))))
    waiting.start()
    first = world(kafka_bootstrap, topic, unique_group_id, 2, 3)  # ranks 0 and 1 of 2: batches 0..2
    waiting.join(60)
    assert bad and "world_size is 3 here but 2 in the group" in bad[0], bad
    line = refused(lambda: rank(1, 2, groups_per_batch=4, max_weight_staleness=1))
    assert "groups_per_batch is 4 here but 2" in line and "max_weight_staleness is 1 here but none" in line
    assert "world_size" not in line.split(";")[0].split(":")[1]  # only what differs is named
    assert "world_size is 3 here but 2" in refused(lambda: rank(0, 3))  # rank 0 itself, restarted wrong
    rest = world(kafka_bootstrap, topic, unique_group_id, 2, 3)  # the group resumes: batches 3..5
    trained = Counter(sid(s) for ranks in (first, rest) for batches in ranks for b in batches
                      for s in b.samples)
    assert trained == Counter({sid(s): 1 for s in samples})
    assert [b.index for b in rest[0]] == [3, 4, 5]


@pytest.mark.kafka(timeout=200)
def test_a_rescale_from_two_to_four_ranks_mid_backlog_trains_every_sample_exactly_once(
        kafka_bootstrap, topic_factory, unique_group_id):
    topic = topic_factory(3)
    samples = backlog(24)  # 12 batches of 2 groups
    publish(kafka_bootstrap, topic, samples)
    two = world(kafka_bootstrap, topic, unique_group_id, 2, 4)  # batches 0..3
    line = refused(lambda: TrainDataReader(kafka_bootstrap, topic, unique_group_id, groups_per_batch=2,
                                           rank=2, world_size=4, publish_progress=False))
    assert "world_size is 4 here but 2" in line and "rescale=True" in line
    four = world(kafka_bootstrap, topic, unique_group_id, 4, 4, rescale=True)  # batches 4..7
    # the old world cannot come back; the new one resumes exactly without the flag
    assert "world_size is 2 here but 4" in refused(
        lambda: TrainDataReader(kafka_bootstrap, topic, unique_group_id, groups_per_batch=2, rank=1,
                                world_size=2, publish_progress=False))
    again = world(kafka_bootstrap, topic, unique_group_id, 4, 4)  # batches 8..11
    assert [b.index for b in four[3]] == [4, 5, 6, 7] and [b.index for b in again[3]] == [8, 9, 10, 11]
    trained = Counter(sid(s) for ranks in (two, four, again) for batches in ranks for b in batches
                      for s in b.samples)
    assert trained == Counter({sid(s): 1 for s in samples})  # every sample once, on one rank of one world


# ---- on the in-memory seam: the rules, fast --------------------------------------------------------
@pytest.fixture
def cluster() -> MemoryCluster:
    c = MemoryCluster(clock_ms=1_000_000)
    c.create_topic("train", 2)
    producer = c.client().producer()
    for s in backlog(12):
        producer.send("train", encode_train_sample(s), s.group_key.encode())
    producer.flush()
    return c


def memory_reader(cluster: MemoryCluster, rank: int, size: int, **kw: Any) -> TrainDataReader:
    kw.setdefault("groups_per_batch", GROUPS_PER_BATCH)
    return TrainDataReader("memory:9092", "train", "trainer", rank=rank, world_size=size,
                           partition_idle_ms=50, publish_progress=False, kafka_client=cluster.client(), **kw)


def test_a_rescale_waits_for_a_batch_boundary(cluster):
    readers = [memory_reader(cluster, r, 2) for r in range(2)]
    for r, reader in enumerate(readers):
        for _ in range(2 - r):  # rank 0 commits batch 1, rank 1 only batch 0 (it crashed before its commit)
            assert reader.next_batch(10) is not None
            reader.commit()
        reader.close()
    line = refused(lambda: memory_reader(cluster, 0, 4, rescale=True))
    assert "did not all commit the same batch (last committed: rank 0 1, rank 1 0)" in line
    with memory_reader(cluster, 1, 2) as late:  # rank 1 catches up: its batch 1 again, from its commit
        batch = late.next_batch(10)
        assert batch is not None and batch.index == 1
        late.commit()
    with memory_reader(cluster, 0, 4, rescale=True) as rescaled:
        batch = rescaled.next_batch(10)
        assert batch is not None and batch.index == 2
    committed = {tp.partition: (c.offset, c.metadata) for tp, c in cluster.committed("trainer-rank0").items()}
    recorded = {World.parse(meta) for _, meta in committed.values()}
    assert recorded == {World(4, GROUPS_PER_BATCH, generation=1)} and committed_batches([committed]) == [1]


def test_fetch_cannot_change_in_a_rescale_and_miles_settings_count(cluster):
    cluster.create_topic("train.heads", 2)
    with memory_reader(cluster, 0, 2) as reader:
        assert reader.next_batch(10) is not None
        reader.commit()
    line = refused(lambda: memory_reader(cluster, 0, 2, fetch="own", rescale=True))
    assert "fetch is own here but all" in line and "fetch cannot change in a rescale" in line
    assert "layout is miles here but tensors" in refused(lambda: memory_reader(cluster, 1, 2, layout="miles"))
    with pytest.raises(ValueError, match="rescale"):
        memory_reader(cluster, 0, 2, rescale=True, start="earliest")


def test_world_text_round_trips_and_names_what_differs():
    w = World(8, 4, True, "miles", True, "own", 2, generation=3)
    meta = "rollout-stream-reader/1 batch=5 end=9 keep=0,2 " + w.text()
    assert World.parse(meta) == w and World.parse("rollout-stream-reader/1 batch=5 end=9 keep=") is None
    assert World.parse("something else world_size=2 generation=0") is None
    assert w.differences(World(8, 4, True, "miles", True, "own", None)) == [
        ("max_weight_staleness", "2", "none")]
    assert w.same_settings(World(8, 4, True, "miles", True, "own", 2, generation=0))
