"""Rank-local fetch (`TrainDataReader(fetch="own")`) on the in-memory Kafka seam: the stage writes heads, four
ranks fold them and fetch only their rows; every sample trains once, on one rank, bit-exact and in the same
batches and shards as ranks that read the whole topic; resume works on the heads topic."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import rollout_stream.reader.payloads as payloads
import rollout_stream.reader.train_data as reader_module
from rollout_stream.codec import Sample, ShapedArray, encode_sample
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.names import heads_topic
from rollout_stream.reader import Batch, TrainDataReader
from tests.stream.worker.test_chunked_worker import TOPICS, produce, worker
from tests.stream.worker.test_worker_memory import commit, steps

HEADS = heads_topic(TOPICS.output)
WORLD = 4


def moe(gi: int, rid: int, *, size: int = 4, chunked: bool = True) -> Sample:
    """A rollout with routing replay (uint8, 2 layers, top-2) and a CSR sampling mask; some chunked."""
    rng = np.random.default_rng(gi * 100 + rid)
    tokens = int(rng.integers(16, 64)) if rid % 3 or not chunked else 40_000  # every third: over a chunk
    resp = tokens // 2
    counts = rng.integers(1, 4, resp)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    experts = rng.integers(0, 8, (tokens - 1, 2, 2), dtype=np.uint8)
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=float(rng.random()), group_size=size,
                  run_id="c", tokens=rng.integers(0, 1000, tokens).astype(np.int32).tolist(),
                  response_length=resp, loss_mask=(rng.random(resp) > 0.2).astype(np.uint8).tolist(),
                  rollout_log_probs=(-rng.random(resp)).astype(np.float32).tolist(),
                  weight_versions=[str(gi % 3)],
                  rollout_routed_experts=ShapedArray.of(experts),
                  rollout_sampling_mask_ids=rng.integers(0, 1000, int(offsets[-1])).astype(np.int32).tolist(),
                  rollout_sampling_mask_offsets=offsets.tolist())


class _Client:
    def __init__(self, cluster: MemoryCluster) -> None:
        self.client = cluster.client()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.fixture
def cluster(monkeypatch) -> MemoryCluster:
    c = MemoryCluster(clock_ms=1_000_000)
    for name in (TOPICS.input, TOPICS.output, TOPICS.dead_letter, HEADS):
        c.create_topic(name, 2)
    monkeypatch.setattr(reader_module, "client_for", lambda conn: _Client(c))  # every client of the reader
    return c


def staged(cluster: MemoryCluster, groups: int, *, chunked: bool = True) -> None:
    produce(cluster, [moe(g, r, chunked=chunked) for g in range(groups) for r in range(4)])
    w = worker(cluster, write_heads=True)
    steps(w, n=10)
    commit(w)


def reader(fetch: str, rank: int, **kw: Any) -> TrainDataReader:
    kw.setdefault("groups_per_batch", 2)
    return TrainDataReader("memory:9092", TOPICS.output, f"trainer-{fetch}", publish_progress=False,
                           partition_idle_ms=50, rank=rank, world_size=WORLD, fetch=fetch, **kw)  # type: ignore[arg-type]


def batches(r: TrainDataReader, n: int) -> list[Batch]:
    out = []
    for _ in range(n):
        b = r.next_batch(10.0)
        assert b is not None, f"batch {len(out)} of {n} did not arrive"
        out.append(b)
    return out


def same(a: Batch, b: Batch) -> None:
    assert a.index == b.index and a.groups == b.groups
    assert (a.global_samples, a.global_loss_tokens) == (b.global_samples, b.global_loss_tokens)
    assert [encode_sample(s.sample) for s in a.samples] == [encode_sample(s.sample) for s in b.samples]
    assert [(s.reward, s.source_offset) for s in a.samples] == [
        (s.reward, s.source_offset) for s in b.samples]
    for name in ("tokens", "loss_mask", "rollout_log_probs", "response_index", "rewards"):
        assert bool((getattr(a, name) == getattr(b, name)).all()), name


@pytest.mark.parametrize("balance_tokens", [False, True])
def test_each_rank_fetches_its_rows_only_and_gets_what_a_whole_topic_reader_gets(cluster, balance_tokens,
                                                                               monkeypatch):
    monkeypatch.setattr(payloads, "SMALL_RECORD_BYTES", 0)  # every record fetched by offset
    staged(cluster, 8)
    n = 4  # 8 groups, 2 per batch
    for rank in range(WORLD):
        with reader("own", rank, balance_tokens=balance_tokens) as own, \
                reader("all", rank, balance_tokens=balance_tokens) as whole:
            for a, b in zip(batches(own, n), batches(whole, n), strict=True):
                same(a, b)
    trained = []
    fetched = 0
    for rank in range(WORLD):
        with reader("own", rank, balance_tokens=balance_tokens) as own:
            for b in batches(own, n):
                trained += [(s.group_key, s.sample.rollout_id) for s in b.samples]
            fetched += own.stats.payload_bytes
    assert sorted(trained) == sorted({(f"c/{g}", r) for g in range(8) for r in range(4)})
    topic_bytes = sum(len(r.value) for r in cluster.records(TOPICS.output))
    assert fetched == topic_bytes  # the in-memory seam returns exactly the records asked for


def test_a_restarted_rank_resumes_with_the_others_from_the_heads_commits(cluster):
    staged(cluster, 8)
    first = [reader("own", rank) for rank in range(WORLD)]
    for r in first:
        batches(r, 2)
        r.commit()
    first[1].close()  # rank 1 restarts; the others go on
    again = reader("own", 1)
    rest = [batches(r, 2) for r in (first[0], again, first[2], first[3])]
    assert [b.index for b in rest[1]] == [2, 3] and all([b.index for b in bs] == [2, 3] for bs in rest)
    committed = cluster.committed("trainer-own-rank1")
    assert committed and all(tp.topic == HEADS for tp in committed)
    for r in (first[0], again, first[2], first[3]):
        r.close()
    with reader("all", 1, start="earliest") as whole:  # rank 1 alone: no rank 0 to record a world
        batches(whole, 2)
        for a, b in zip(rest[1], batches(whole, 2), strict=True):
            same(a, b)


def same_shard(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, list) and x and isinstance(x[0], np.ndarray):
            assert len(x) == len(y)
            assert all(np.array_equal(u, v) and u.dtype == v.dtype for u, v in zip(x, y, strict=True))
        else:
            assert x == y, key


@pytest.mark.parametrize("balance_data", [False, True])
def test_the_miles_layout_gets_the_shard_a_whole_topic_reader_gets(cluster, balance_data):
    staged(cluster, 8)
    for rank in range(WORLD):
        with reader("own", rank, layout="miles", balance_data=balance_data) as own, \
                reader("all", rank, layout="miles", balance_data=balance_data) as whole:
            for a, b in zip(batches(own, 4), batches(whole, 4), strict=True):
                same(a, b)
                assert a.rollout_data is not None and b.rollout_data is not None
                same_shard(a.rollout_data, b.rollout_data)


def test_a_second_head_of_a_group_is_dropped_and_an_outline_counts_what_batching_reads():
    from rollout_stream.codec.group_heads import GroupHead, HeadSample
    from rollout_stream.core.assembly import loss_tokens
    from rollout_stream.reader.heads import HeadMemory, outline_group

    s = HeadSample(offsets=[7], nbytes=10, source_topic="in", source_partition=0, source_offset=3,
                   rollout_id=1, tokens=12, response_length=5, loss_tokens=3, weight_versions=["4"])
    head = GroupHead(topic="out", partition=1, group_key="g", rollout_count=1, mean=0.0, std=0.0,
                     zero_variance=True, samples=[s], problem="bad")
    memory = HeadMemory(size=1)
    assert memory.first(1, head) and not memory.first(1, head) and memory.first(0, head)
    group = outline_group(head, 1234)
    (outline,) = group.samples
    assert len(outline.sample.tokens) == 12 and loss_tokens(outline) == 3
    assert (group.offsets, group.timestamp_ms, group.oldest_version, group.problem) == ((7,), 1234, 4, "bad")



def test_the_next_batch_is_fetched_while_the_trainer_trains_this_one(cluster, monkeypatch):
    """After each batch the rank's rows of the next are fetched on the fetcher's thread; asking for that batch
    then fetches nothing (no request of its own), and the batches are those of a whole-topic reader."""
    from rollout_stream.reader.payloads import PayloadFetcher

    requests: list[str] = []
    submit, ahead = PayloadFetcher._submit, PayloadFetcher.ahead

    def counting_ahead(self: PayloadFetcher, *args: Any) -> None:
        requests.append("ahead")
        ahead(self, *args)

    def counting_submit(self: PayloadFetcher, *args: Any, **kwargs: Any) -> Any:
        if requests[-1:] != ["ahead"]:
            requests.append("asked")
        return submit(self, *args, **kwargs)

    monkeypatch.setattr(PayloadFetcher, "ahead", counting_ahead)
    monkeypatch.setattr(PayloadFetcher, "_submit", counting_submit)
    staged(cluster, 8)
    with reader("own", 0) as own:
        got = batches(own, 4)
    # the first batch is asked for; each next one was fetched ahead; after the last nothing is left to guess
    assert requests == ["asked", "ahead", "ahead", "ahead"], requests
    with reader("all", 0) as whole:
        for a, b in zip(got, batches(whole, 4), strict=True):
            same(a, b)


def test_a_wrong_guess_ahead_costs_bytes_never_a_different_batch(cluster):
    """The guess ahead treats every group as fresh; a weight version set after it makes two of them stale.
    The batches are still those of a whole-topic reader with the same versions, rank by rank."""
    staged(cluster, 8)  # group g has weight version g % 3
    for rank in range(WORLD):
        with reader("own", rank, max_weight_staleness=0) as own, \
                reader("all", rank, max_weight_staleness=0) as whole:
            for r in (own, whole):
                r.set_weight_version(1)
            a, b = own.next_batch(10.0), whole.next_batch(10.0)
            assert a is not None and b is not None
            same(a, b)
            for r in (own, whole):
                r.set_weight_version(2)  # after the guess: the groups of version 1 become stale
            a, b = own.next_batch(10.0), whole.next_batch(10.0)
            assert a is not None and b is not None and a.skipped_stale > 0
            same(a, b)


def test_small_records_are_read_forward_once_and_give_the_batches_of_a_whole_topic_reader(cluster):
    """Rows of a batch of small records are read forward, each partition from the rank's first row on: a rank
    receives other ranks' records too, each at most once, and its batches are a whole-topic reader's."""
    staged(cluster, 8, chunked=False)  # every record small and whole
    topic_bytes = sum(len(r.value) for r in cluster.records(TOPICS.output))
    for rank in range(WORLD):
        with reader("own", rank) as own, reader("all", rank) as whole:
            for a, b in zip(batches(own, 4), batches(whole, 4), strict=True):
                same(a, b)
            fetcher = own.source._fetcher  # type: ignore[attr-defined]
            assert fetcher is not None and fetcher._forward  # read forward, not by offset
            assert 0 < fetcher.fetched_bytes <= topic_bytes  # no record twice
