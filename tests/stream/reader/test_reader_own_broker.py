"""Rank-local fetch on the real broker, on each client: the stage writes group heads, four reader ranks run as
separate processes with `TrainDataReader(fetch="own")` over a backlog of MoE samples with routing replay and
sampling masks. Every sample trains once, on exactly one rank, bit-exact; the ranks together fetch at most
1.15 times the train-data bytes; a rank restarted mid-backlog resumes with the others."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from rollout_stream.codec import Sample, ShapedArray, encode_sample, group_key
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.names import heads_topic
from tests.stream.helpers import joined, read_topic, running_worker, train_samples

pytestmark = [pytest.mark.kafka(timeout=400), pytest.mark.every_client]

ROOT = Path(__file__).resolve().parents[3]
GROUPS, SIZE, WORLD, PER_BATCH = 16, 4, 4, 2
BATCHES = GROUPS // PER_BATCH
CHUNK = 256 * 1024


def moe(gi: int, rid: int) -> Sample:
    """Routing replay (tokens - 1, 8 layers, top-8) uint8 and a CSR sampling mask; about one in three is
    larger than a chunk."""
    rng = np.random.default_rng(gi * 100 + rid)
    tokens = 4096 if rid % 3 == 0 else int(rng.integers(512, 2048))
    resp = tokens // 2
    offsets = np.concatenate([[0], np.cumsum(rng.integers(1, 5, resp))]).astype(np.int32)
    experts = rng.integers(0, 128, (tokens - 1, 8, 8), dtype=np.uint8)
    return Sample(group_index=gi, index=rid, rollout_id=gi * SIZE + rid, reward=float(rng.random()),
                  group_size=SIZE, run_id="own", tokens=rng.integers(0, 151_936, tokens).astype(np.int32),
                  response_length=resp, loss_mask=(rng.random(resp) > 0.1).astype(np.uint8),
                  rollout_log_probs=np.log(rng.random(resp, dtype=np.float32) + np.float32(1e-6)),
                  weight_versions=["1"],
                  rollout_routed_experts=ShapedArray.of(experts),
                  rollout_sampling_mask_ids=rng.integers(0, 151_936, int(offsets[-1])).astype(np.int32),
                  rollout_sampling_mask_offsets=offsets)


def make_topics(bootstrap: str) -> TopicNames:
    from kafka.admin import KafkaAdminClient, NewTopic

    tag = f"own-{uuid.uuid4().hex[:8]}"
    names = TopicNames(f"{tag}-rollouts", f"{tag}-train", f"{tag}-dlq")
    configs = {"max.message.bytes": str(8 << 20)}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(n, 2, 1, topic_configs=configs) for n in
                             (names.input, names.output, names.dead_letter, heads_topic(names.output))])
    finally:
        admin.close()
    return names


def rank(bootstrap: str, topic: str, group: str, client: str, r: int, batches: int, barrier: Path
         ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.stream.reader.own_rank", "--bootstrap", bootstrap, "--topic", topic,
         "--group", group, "--client", client, "--barrier", str(barrier), "--rank", str(r),
         "--world", str(WORLD), "--batches", str(batches),
         "--groups-per-batch", str(PER_BATCH)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)


def finished(proc: subprocess.Popen[str]) -> tuple[list[dict], int]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    lines = [json.loads(line) for line in out.splitlines()]
    return [line for line in lines if "batch" in line], lines[-1]["payload_bytes"]


def test_four_rank_processes_train_every_sample_once_fetching_their_share_and_a_restarted_rank_resumes(
        kafka_bootstrap, kafka_client, tmp_path):
    from kafka import KafkaProducer

    client = kafka_client or "confluent"
    topics = make_topics(kafka_bootstrap)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, max_request_size=8 << 20)
    samples = [moe(g, r) for g in range(GROUPS) for r in range(SIZE)]
    for s in samples:
        producer.send(topics.input, key=group_key(s), value=encode_sample(s))
    producer.flush()
    producer.close()
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics,
                          group_id=f"w-{uuid.uuid4().hex[:8]}", group_size=SIZE, write_heads=True,
                          chunk_bytes=CHUNK, commit_interval_s=0.1)
    with running_worker(config):
        read_topic(kafka_bootstrap, heads_topic(topics.output), min_count=GROUPS, timeout=120)
    train = read_topic(kafka_bootstrap, topics.output, min_count=len(samples))
    train_bytes = sum(len(r.value or b"") for r in train)
    assert len(train) > len(samples)  # some values went out chunked
    expected = {(t.group_key, t.sample.rollout_id): hashlib.sha256(encode_sample(t.sample)).hexdigest()
                for t in train_samples(joined(train))}
    assert len(expected) == len(samples)

    group = f"trainer-{uuid.uuid4().hex[:8]}"
    # Each rank commits a batch once every rank has received it (a barrier: a step's all-reduce). Rank 1
    # stops after 3 batches; the others wait for it at the fourth until it is back.
    ranks = {r: rank(kafka_bootstrap, topics.output, group, client, r, BATCHES if r != 1 else 3, tmp_path)
             for r in range(WORLD)}
    first_of_1, fetched_1 = finished(ranks.pop(1))
    again = rank(kafka_bootstrap, topics.output, group, client, 1, BATCHES - 3, tmp_path)
    results = {r: finished(p) for r, p in ranks.items()}
    rest_of_1, fetched_1b = finished(again)
    results[1] = (first_of_1 + rest_of_1, fetched_1 + fetched_1b)

    trained: Counter[tuple[str, int]] = Counter()
    for r, (batches, _) in results.items():
        assert [b["batch"] for b in batches] == list(range(BATCHES)), f"rank {r}"
        for b in batches:
            for key, rid, digest, _ in b["rows"]:
                trained[(key, rid)] += 1
                assert expected[(key, rid)] == digest  # bit-exact
    assert trained == Counter(dict.fromkeys(expected, 1))  # every sample once, on one rank
    fetched = sum(f for _, f in results.values())
    print(f"{client}: the {WORLD} ranks fetched {fetched} B, {fetched / train_bytes:.3f} times train-data "
          f"({train_bytes} B)")
    assert fetched <= 1.15 * train_bytes, f"the ranks fetched {fetched / train_bytes:.2f} times train-data"
