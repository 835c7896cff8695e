"""Chunked samples through the worker on the in-memory Kafka seam, whose topics refuse records over Kafka's
default 1 MiB: reassembly, chunked train and dead-letter records, a restore in the middle of a value's
chunks, an aborted transaction, and a chunk that never arrives. The real broker shows the same pipeline in
test_chunked_pipeline.py."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rollout_stream.clients import Connection
from rollout_stream.codec import (
    DeadLetterReason,
    Sample,
    ShapedArray,
    decode_train_sample,
    encode_sample,
    group_key,
)
from rollout_stream.codec import headers as H
from rollout_stream.codec.chunks import CHUNK_HEADER, decode_chunk_header, split
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.core import RewardConfig, post_process_rewards
from rollout_stream.kafka import KafkaFailure
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.worker import Worker
from rollout_stream.worker.instance import InstanceClaim
from tests.stream.worker.test_worker_memory import commit, steps

TOPICS = TopicNames("in", "out", "dlq")
MiB = 1 << 20
CHUNK = 256 * 1024


def sample(gi: int, rid: int, reward: float, *, size: int = 2, tokens: int = 4096) -> Sample:
    """A rollout with MoE routing replay: (tokens - 1) x 48 layers x top-8 int32, ~6 MiB at 4K tokens."""
    rng = np.random.default_rng(gi * 100 + rid)
    experts = rng.integers(0, 64, (tokens - 1, 48, 8), dtype="<i4")
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=size, run_id="c",
                  tokens=list(range(8)), response_length=4, loss_mask=[1] * 4,
                  rollout_log_probs=[-0.5] * 4, rollout_routed_experts=ShapedArray.of(experts))


@pytest.fixture
def cluster() -> MemoryCluster:
    c = MemoryCluster(clock_ms=1_000_000)
    for name in (TOPICS.input, TOPICS.output, TOPICS.dead_letter):
        c.create_topic(name, 2)  # Kafka's default max.message.bytes: 1 MiB
    return c


def produce(cluster: MemoryCluster, samples: list[Sample], *, skip: set[tuple[int, int]] = frozenset(),
            ts: int | None = None) -> None:
    """Each sample as chunk records, as RolloutProducer sends it; (rollout id, chunk index) in `skip` never
    sent."""
    producer = cluster.client().producer(client_id="test")
    for s in samples:
        for header, part in split(encode_sample(s), CHUNK):
            if (s.rollout_id, decode_chunk_header(header).index) not in skip:
                producer.send(TOPICS.input, part, group_key(s), headers=[(CHUNK_HEADER, header)],
                              timestamp_ms=ts)
    producer.flush()


def worker(cluster: MemoryCluster, name: str = "w1", *, clock: list[float] | None = None, **config) -> Worker:
    config.setdefault("commit_interval_s", 3600.0)
    config.setdefault("transaction_timeout_s", 7200.0)  # the in-memory cluster never times a transaction out
    config.setdefault("group_timeout_s", 60.0)
    now = clock or [1_000.0]
    cfg = WorkerConfig(topics=TOPICS, group_id="g", chunk_bytes=CHUNK, **config)
    w = Worker(cfg, Connection("memory:9092", client_id=name), client=cluster.client(), clock=lambda: now[0],
               claim=InstanceClaim(name, Path("/nonexistent"), None))
    assert w.open()
    return w


def whole(records) -> list[tuple[bytes, dict[str, bytes]]]:
    """The values of committed records, chunk records joined (value, headers of the first chunk)."""
    values: list[tuple[bytes, dict[str, bytes]]] = []
    parts: dict[bytes, list] = {}
    for r in records:
        headers = dict(r.headers or ())
        if CHUNK_HEADER not in headers:
            values.append((r.value, headers))
            continue
        h = decode_chunk_header(headers[CHUNK_HEADER])
        got = parts.setdefault(h.digest, [None] * h.count)
        got[h.index] = r
        if None not in got:
            values.append((b"".join(p.value for p in got), dict(got[0].headers)))
    return values


def published(cluster: MemoryCluster) -> Counter:
    return Counter((decode_train_sample(v).group_key, decode_train_sample(v).sample.rollout_id)
                   for v, _ in whole(cluster.records(TOPICS.output)))


def test_chunked_samples_publish_whole_and_every_output_record_fits_the_topic(cluster):
    samples = [sample(0, 0, 1.0), sample(0, 1, 0.0), sample(1, 0, 0.5, size=1)]
    produce(cluster, samples)
    assert all(len(r.value) <= CHUNK for r in cluster.records(TOPICS.input))
    w = worker(cluster)
    steps(w)
    commit(w)
    out = cluster.records(TOPICS.output)
    assert len(out) > 3 and all(len(r.value) <= CHUNK for r in out)  # train records went out chunked
    decoded = [decode_train_sample(v) for v, _ in whole(out)]
    trained = {t.sample.rollout_id if t.group_key == "c/0" else "g1": t for t in decoded}
    assert set(trained) == {0, 1, "g1"}
    for s in samples[:2]:
        t = trained[s.rollout_id]
        assert np.array_equal(t.sample.rollout_routed_experts.numpy(), s.rollout_routed_experts.numpy())
    assert [trained[0].reward, trained[1].reward] == post_process_rewards(samples[:2], RewardConfig())[1]
    # every input chunk committed, nothing dead-lettered, no chunk bytes left open
    assert sum(c.offset for c in cluster.committed("g").values()) == len(cluster.records(TOPICS.input))
    assert cluster.records(TOPICS.dead_letter) == [] and w.store.open_bytes == 0


def test_a_restore_in_the_middle_of_a_values_chunks_reads_them_again_and_publishes_once(cluster):
    first, second = sample(0, 0, 1.0), sample(0, 1, 0.0)
    produce(cluster, [first])
    produce(cluster, [second], skip={(1, i) for i in range(10, 100)})  # its first 10 chunks only
    w1 = worker(cluster, "w1")
    steps(w1)
    commit(w1)
    assert w1.store.open_count() == 1 and w1.store.chunks.open and w1.store.open_bytes > 10 * CHUNK
    assert w1.observer.snapshot(0.0).open_chunked_values == 1  # what the metrics show
    w1.close()
    w2 = worker(cluster, "w2")
    steps(w2)  # restored from the changelog and the input: the whole sample and 10 chunks held again
    assert w2.store.open_count() == 1 and len(w2.store.chunks.open) == 1
    produce(cluster, [second], skip={(1, i) for i in range(10)})
    steps(w2)
    commit(w2)
    assert published(cluster) == Counter({("c/0", 0): 1, ("c/0", 1): 1})
    assert cluster.records(TOPICS.dead_letter) == []


def test_a_restore_that_starts_inside_a_published_values_chunks_drops_them_as_decided(cluster):
    """Another group's record left open between a value's chunks holds the committed offset inside them:
    the restore re-reads only the value's last chunks, and must know the value was published with its
    group (the changelog's memory of it), not hold them as a value that never completes."""
    clock = [1_000.0]
    value, mate, other = sample(0, 0, 1.0), sample(0, 1, 0.0), sample(1, 0, 1.0, tokens=8)
    producer = cluster.client().producer(client_id="test")
    parts = split(encode_sample(value), CHUNK)
    for i, (header, part) in enumerate(parts):
        producer.send(TOPICS.input, part, group_key(value), headers=[(CHUNK_HEADER, header)],
                      timestamp_ms=1_000_000, partition=0)
        if i == 3:  # group 1's only member arrives in the middle of the value: its window stays open
            producer.send(TOPICS.input, encode_sample(other), group_key(other), timestamp_ms=1_000_000,
                          partition=0)
    for header, part in split(encode_sample(mate), CHUNK):
        producer.send(TOPICS.input, part, group_key(mate), headers=[(CHUNK_HEADER, header)],
                      timestamp_ms=1_000_000, partition=0)
    producer.flush()
    w1 = worker(cluster, "w1", clock=clock, group_timeout_s=5.0)
    steps(w1)
    commit(w1)
    assert published(cluster) == Counter({("c/0", 0): 1, ("c/0", 1): 1})
    assert cluster.committed("g")[next(iter(cluster.committed("g")))].offset == 4  # inside the value
    w1.close()
    w2 = worker(cluster, "w2", clock=clock, group_timeout_s=5.0)
    steps(w2)
    assert not w2.store.chunks.open and w2.store.open_count() == 1  # only group 1's window
    clock[0] = 1_010.0
    time.sleep(0.25)
    steps(w2)
    commit(w2)
    reasons = Counter(dict(r.headers)[H.REASON].decode() for r in cluster.records(TOPICS.dead_letter))
    assert reasons == {"incomplete_group": 1}  # group 1, and nothing of the published value
    assert published(cluster) == Counter({("c/0", 0): 1, ("c/0", 1): 1})


def test_a_stray_chunk_after_its_value_was_whole_survives_a_restore_without_losing_the_value(cluster):
    first, second = sample(0, 0, 1.0), sample(0, 1, 0.0)
    produce(cluster, [first])
    header, _ = split(encode_sample(first), CHUNK)[0]
    producer = cluster.client().producer(client_id="test")  # same value's chunk 0, other bytes
    producer.send(TOPICS.input, b"x" * 100, group_key(first), headers=[(CHUNK_HEADER, header)])
    producer.flush()
    w1 = worker(cluster, "w1")
    steps(w1)
    commit(w1)
    assert w1.store.open_count() == 1  # the value waits for its group-mate
    w1.close()
    w2 = worker(cluster, "w2")
    steps(w2)
    produce(cluster, [second])
    steps(w2)
    commit(w2)
    assert published(cluster) == Counter({("c/0", 0): 1, ("c/0", 1): 1})
    dead = cluster.records(TOPICS.dead_letter)
    assert [(dict(r.headers)[H.REASON], r.value) for r in dead] == [(b"chunk_conflict", b"x" * 100)]


def test_an_aborted_transaction_of_chunked_outputs_publishes_once_after_the_restore(cluster, monkeypatch):
    produce(cluster, [sample(0, 0, 1.0), sample(0, 1, 0.0), sample(1, 0, 1.0), sample(1, 1, 2.0)])
    w = worker(cluster)
    steps(w)
    delivery = w.processor.delivery
    real = delivery.producer.commit_transaction
    calls = [0]

    def fail_once(*a, **kw):
        calls[0] += 1
        if calls[0] == 1:
            raise KafkaFailure("broker went away", retriable=True)
        return real(*a, **kw)

    monkeypatch.setattr(delivery.producer, "commit_transaction", fail_once)
    commit(w)
    assert w.stats.aborts == 1
    steps(w)
    commit(w)
    assert published(cluster) == Counter({("c/0", 0): 1, ("c/0", 1): 1, ("c/1", 0): 1, ("c/1", 1): 1})


def test_a_chunk_that_never_arrives_dead_letters_the_value_and_its_group_and_the_chunks_are_inspectable(
        cluster):
    clock = [1_000.0]
    produce(cluster, [sample(0, 0, 1.0), sample(0, 1, 0.0)], skip={(1, 3)}, ts=1_000_000)
    w = worker(cluster, clock=clock, group_timeout_s=5.0)
    steps(w)
    assert published(cluster) == Counter() and w.store.chunks.open
    clock[0] = 1_006.0  # past both deadlines
    time.sleep(0.25)  # expiry runs every 0.2 s of the monotonic clock
    steps(w)
    commit(w)
    dead = cluster.records(TOPICS.dead_letter)
    reasons = Counter(dict(r.headers)[H.REASON].decode() for r in dead)
    n_chunks = decode_chunk_header(dict(dead[0].headers)[CHUNK_HEADER]).count
    assert reasons == {DeadLetterReason.INCOMPLETE_CHUNKS.value: n_chunks - 1,
                       DeadLetterReason.INCOMPLETE_GROUP.value: n_chunks}
    # the complete sample of the broken group went out chunked, and joins back to what was sent
    (value, headers), = [(v, h) for v, h in whole(dead) if h[H.REASON] == b"incomplete_group"]
    assert value == encode_sample(sample(0, 0, 1.0)) and headers[H.ORIGINAL_OFFSET] == b"0"
    assert all(len(r.value) <= CHUNK for r in dead) and w.store.open_bytes == 0
    assert sum(c.offset for c in cluster.committed("g").values()) == len(cluster.records(TOPICS.input))


def test_open_chunk_bytes_count_toward_the_cap_and_fetching_pauses_there(cluster, monkeypatch):
    """Interleaved chunks of many values hold bytes before any is whole: they count toward --max-open-mib
    and the worker stops fetching at the cap, as for open windows; paused with nothing able to close, it
    reads on past the cap after the stall time (as for windows) and publishes everything."""
    samples = [sample(gi, rid, float(rid), tokens=1024) for gi in range(6) for rid in (0, 1)]  # 1.6 MB each
    producer = cluster.client().producer(client_id="test")
    chunked = [[(s, h, part) for h, part in split(encode_sample(s), CHUNK)] for s in samples]
    for i in range(max(map(len, chunked))):  # chunk 0 of every value, then chunk 1 of every value, ...
        for s, header, part in (c[i] for c in chunked if i < len(c)):
            producer.send(TOPICS.input, part, group_key(s), headers=[(CHUNK_HEADER, header)])
    producer.flush()
    monkeypatch.setattr("rollout_stream.worker.loop.POLL_RECORDS", 4)
    cap = 4 * MiB
    w = worker(cluster, max_record_bytes=MiB, max_open_bytes=cap, commit_interval_s=0.001)
    w.back_pressure.stall_s = 3600.0
    peak = 0
    for _ in range(40):
        w.step()
        peak = max(peak, w.store.open_bytes)
    assert w.back_pressure.paused and w.stats.groups_published == 0 and w.store.chunks.open
    assert cap <= peak <= cap + 4 * CHUNK, peak  # held at the cap, one poll past it at most
    w.back_pressure.stall_s = 0.05  # nothing can close while paused: read on past the cap
    time.sleep(0.06)
    for _ in range(200):
        w.step()
        if w.stats.groups_published == 6:
            break
    assert w.stats.groups_published == 6 and w.store.open_bytes == 0
    assert published(cluster) == Counter((f"c/{gi}", rid) for gi in range(6) for rid in (0, 1))
