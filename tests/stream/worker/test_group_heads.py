"""Group heads written by the stage (codec/group_heads.py, stream/worker/heads.py) on the in-memory Kafka
seam: one head per published group in `<train-data>.heads`, same partition, pointing at every train record
of the group (each chunk record of a chunked value), under both delivery modes; an aborted transaction
leaves no head."""

from __future__ import annotations

from collections import defaultdict

import msgspec
import pytest

from rollout_stream.codec import DecodeError, decode_train_sample
from rollout_stream.codec.chunks import CHUNK_HEADER
from rollout_stream.codec.group_heads import GroupHead, HeadSample, decode_group_head, encode_group_head
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.names import heads_topic
from tests.stream.worker.test_chunked_worker import TOPICS, produce, sample, whole, worker
from tests.stream.worker.test_worker_memory import commit, steps

HEADS = heads_topic(TOPICS.output)


@pytest.fixture
def cluster() -> MemoryCluster:
    c = MemoryCluster(clock_ms=1_000_000)
    for name in (TOPICS.input, TOPICS.output, TOPICS.dead_letter, HEADS):
        c.create_topic(name, 2)
    return c


def heads(cluster: MemoryCluster) -> list[tuple[int, GroupHead]]:
    return [(r.partition, decode_group_head(r.value)) for r in cluster.records(HEADS)]


def check_points_at_train_records(cluster: MemoryCluster) -> None:
    """Each head's offsets are exactly its group's train records, whole samples joined from them match the
    head's lineage, and every train record belongs to one head."""
    by_offset = {(r.partition, r.offset): r for r in cluster.records(TOPICS.output)}
    pointed: set[tuple[int, int]] = set()
    for partition, head in heads(cluster):
        assert head.partition == partition and head.topic == TOPICS.output
        for s in head.samples:
            records = [by_offset[(partition, o)] for o in s.offsets]
            assert all(r.key == head.group_key.encode() for r in records)
            (value, _), = whole(records)
            assert len(value) == s.nbytes
            t = decode_train_sample(value)
            assert (t.source_topic, t.source_partition, t.source_offset) == (
                s.source_topic, s.source_partition, s.source_offset)
            assert (t.sample.rollout_id, t.reward, t.raw_reward) == (s.rollout_id, s.reward, s.raw_reward)
            assert s.tokens == len(t.sample.tokens) and s.loss_tokens == 4
            assert all((CHUNK_HEADER in dict(r.headers or ())) == (len(records) > 1) for r in records)
            pointed |= {(partition, o) for o in s.offsets}
    assert pointed == set(by_offset)


@pytest.mark.parametrize("delivery", ["exactly-once", "at-least-once"])
def test_each_published_group_has_one_head_pointing_at_its_train_records(cluster, delivery):
    samples = [sample(0, 0, 1.0), sample(0, 1, 0.0), sample(1, 0, 0.5, size=1), sample(2, 0, 0.2, size=1)]
    produce(cluster, samples)
    w = worker(cluster, write_heads=True, delivery=delivery)
    steps(w)
    commit(w)
    got = heads(cluster)
    assert sorted(h.group_key for _, h in got) == ["c/0", "c/1", "c/2"]
    assert [len(h.samples) for _, h in got if h.group_key == "c/0"] == [2]
    assert all(len(s.offsets) > 1 for _, h in got for s in h.samples)  # ~6 MiB values: chunked
    check_points_at_train_records(cluster)


def test_small_records_are_pointed_at_one_offset_each(cluster):
    samples = [sample(g, r, float(r), tokens=8) for g in range(3) for r in range(2)]
    produce(cluster, samples)
    w = worker(cluster, write_heads=True)
    steps(w)
    commit(w)
    got = heads(cluster)
    assert len(got) == 3 and all(len(s.offsets) == 1 for _, h in got for s in h.samples)
    check_points_at_train_records(cluster)


def test_without_write_heads_nothing_is_written_to_the_heads_topic(cluster):
    produce(cluster, [sample(0, 0, 1.0, size=1, tokens=8)])
    w = worker(cluster)
    steps(w)
    commit(w)
    assert cluster.records(TOPICS.output) and cluster.records(HEADS) == []


def test_an_aborted_transaction_leaves_no_head(cluster):
    produce(cluster, [sample(0, 0, 1.0, size=1, tokens=8)])
    w = worker(cluster, write_heads=True)
    steps(w)
    delivery = w.processor.delivery
    assert delivery is not None and delivery.open and delivery.heads  # type: ignore[attr-defined]
    delivery.abort()
    commit(w)
    assert cluster.records(HEADS) == [] and cluster.records(TOPICS.output) == []


def test_a_head_round_trips_and_a_newer_or_pointless_one_is_refused():
    s = HeadSample(offsets=[3, 4], nbytes=10, source_topic="in", source_partition=0, source_offset=7,
                   rollout_id="r", weight_versions=["3"])
    head = GroupHead(topic="out", partition=1, group_key="g", rollout_count=1, mean=0.0, std=0.0,
                     zero_variance=True, samples=[s])
    assert decode_group_head(encode_group_head(head)) == head
    with pytest.raises(DecodeError):
        decode_group_head(encode_group_head(msgspec.structs.replace(head, schema_version=99)))
    with pytest.raises(DecodeError):
        decode_group_head(encode_group_head(msgspec.structs.replace(
            head, samples=[msgspec.structs.replace(s, offsets=[])])))
    with pytest.raises(DecodeError):
        decode_group_head(b"\x01")


def test_groups_of_several_partitions_keep_their_partition_number(cluster):
    samples = [sample(g, 0, 0.5, size=1, tokens=8) for g in range(8)]
    produce(cluster, samples)
    w = worker(cluster, write_heads=True)
    steps(w)
    commit(w)
    parts: dict[int, int] = defaultdict(int)
    for partition, _ in heads(cluster):
        parts[partition] += 1
    assert sum(parts.values()) == 8
    check_points_at_train_records(cluster)


def test_the_acls_of_a_stage_that_writes_heads_and_of_a_rank_local_reader_name_the_heads_topic():
    from rollout_stream.acls import reader_permissions, worker_permissions

    worker = worker_permissions(input_topic="in", output_topic="out", dead_letter_topic="dlq", group_id="g",
                                route_topic="zv", write_heads=True)
    assert {(p.name, p.operation) for p in worker} >= {("out.heads", "Write"), ("zv.heads", "Write")}
    plain = worker_permissions(input_topic="in", output_topic="out", dead_letter_topic="dlq", group_id="g")
    assert not any(p.name.endswith(".heads") for p in plain)
    reader = reader_permissions(output_topic="out", group_id="t", fetch_own=True)
    assert ("out.heads", "Read") in {(p.name, p.operation) for p in reader}
    assert not any(p.name.endswith(".heads") for p in reader_permissions(output_topic="out", group_id="t"))
