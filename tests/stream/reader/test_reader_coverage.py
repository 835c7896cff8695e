"""Heads cover train-data, or the reader knows, on the in-memory Kafka seam: a stage without `--write-heads`
refuses to start where heads are in use; groups published without heads (an older stage) hold a
`fetch="own"` reader back and then stop it with UncoveredRecords, never skipped in silence; a copy of a
group whose head comes later (an at-least-once republication) does not; `lag` counts what no head covers."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import rollout_stream.reader.coverage as coverage
from rollout_stream.codec import encode_train_sample
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.names import heads_topic
from rollout_stream.reader import Batch, TrainDataReader, UncoveredRecords
from rollout_stream.worker.heads_in_use import HeadsInUse
from tests.stream.reader.test_reader import train_sample
from tests.stream.worker.test_chunked_worker import TOPICS, produce, sample, worker
from tests.stream.worker.test_worker_memory import commit, steps

HEADS = heads_topic(TOPICS.output)


@pytest.fixture
def cluster(monkeypatch) -> MemoryCluster:
    monkeypatch.setattr(coverage, "UNCOVERED_AFTER_S", 1.0)
    monkeypatch.setattr(coverage, "COVERAGE_CHECK_S", 0.2)
    c = MemoryCluster(clock_ms=1_000_000)
    for name in (TOPICS.input, TOPICS.output, TOPICS.dead_letter, HEADS):
        c.create_topic(name, 2)
    return c


def stage(cluster: MemoryCluster, groups: range, **config: Any) -> None:
    """The stage publishes `groups` (two small rollouts each) and commits."""
    produce(cluster, [sample(g, r, float(r), tokens=8) for g in groups for r in range(2)])
    w = worker(cluster, **config)
    steps(w, n=10)
    commit(w)
    w.close()


def headless(cluster: MemoryCluster, groups: range, run: str = "c") -> None:
    """Train records of `groups` without heads, as a stage without --write-heads (or an older one) writes."""
    producer = cluster.client().producer()
    for g in groups:
        for r in range(2):
            s = train_sample(g, g * 10 + r, run=run)
            producer.send(TOPICS.output, encode_train_sample(s), s.group_key.encode())
    producer.flush()


def reader(cluster: MemoryCluster, fetch: str, **kw: Any) -> TrainDataReader:
    return TrainDataReader("memory:9092", TOPICS.output, f"trainer-{fetch}", groups_per_batch=1,
                           partition_idle_ms=50, publish_progress=False, kafka_client=cluster.client(),
                           fetch=fetch, **kw)  # type: ignore[arg-type]


def read(r: TrainDataReader, limit: int = 40) -> list[Batch]:
    out = []
    for _ in range(limit):
        b = r.next_batch(3.0)
        if b is None:
            break
        out.append(b)
    return out


def keys(batches: list[Batch]) -> list[str]:
    return [g.key for b in batches for g in b.groups]


def test_a_stage_restarted_without_heads_refuses_and_an_own_reader_stops_at_groups_no_head_covers(
        cluster, caplog):
    stage(cluster, range(0, 4), write_heads=True)
    with pytest.raises(HeadsInUse, match="holds group heads") as refused:
        stage(cluster, range(4, 6))  # refused before it publishes: the next stage publishes these
    assert isinstance(refused.value, ConfigurationError) and "--write-heads" in str(refused.value)
    headless(cluster, range(4, 6), run="old")  # an older stage, which did not know to refuse
    stage(cluster, range(6, 8), write_heads=True)
    with reader(cluster, "all") as whole:
        order = keys(read(whole))
    assert sorted(order) == sorted([f"c/{g}" for g in range(8)] + ["old/4", "old/5"])
    caplog.set_level(logging.INFO, logger="rollout_stream.reader")
    with reader(cluster, "own") as own:
        trained: list[Batch] = []
        with pytest.raises(UncoveredRecords, match="no group head in out.heads covers") as stopped:
            for _ in range(20):
                if (b := own.next_batch(2.0)) is not None:
                    trained.append(b)
    # the global order up to the first group without a head, nothing past it
    first = min(order.index("old/4"), order.index("old/5"))
    assert keys(trained) == order[:len(trained)] and len(trained) <= first
    assert "fetch='all'" in str(stopped.value) and "\n" not in str(stopped.value)
    assert any(r.message.startswith("heads.uncovered") for r in caplog.records)


def test_an_own_reader_of_a_stage_that_never_wrote_heads_says_so_while_it_waits_then_stops(
        cluster, caplog, monkeypatch):
    import rollout_stream.reader.batching as batching

    monkeypatch.setattr(batching, "WAITING_LOG_S", 0.2)
    stage(cluster, range(0, 3))  # the heads topic exists (as `topics create` makes it), empty
    caplog.set_level(logging.INFO, logger="rollout_stream.reader")
    with reader(cluster, "own") as own, pytest.raises(UncoveredRecords):
        for _ in range(10):
            assert own.next_batch(1.0) is None
    waiting = [r.message for r in caplog.records if r.message.startswith("batch.waiting")]
    assert any("uncovered_train_data=" in line for line in waiting), waiting


def test_a_copy_whose_head_comes_later_is_held_not_fatal_and_every_group_trains_once(cluster):
    stage(cluster, range(0, 2), write_heads=True)
    headless(cluster, range(2, 3), run="c")  # records of c/2 acknowledged, its head never sent: a crash
    stage(cluster, range(2, 5), write_heads=True)  # c/2 published again, with its head
    with reader(cluster, "own") as own:
        got = keys(read(own))
    assert sorted(got) == [f"c/{g}" for g in range(5)]


def test_lag_counts_the_records_no_head_covers(cluster, monkeypatch):
    from rollout_stream.clients import Connection
    from rollout_stream.ops import heads_cover

    monkeypatch.setattr(heads_cover, "client_for", lambda conn: cluster.client())
    conn = Connection("memory:9092")
    stage(cluster, range(0, 2), write_heads=True)
    assert heads_cover.uncovered_records(conn, TOPICS.output) == 0
    headless(cluster, range(2, 5), run="old")
    assert heads_cover.uncovered_records(conn, TOPICS.output) == 6
