"""Reader benchmark: batches/s and MB/s of TrainDataReader on 32K-token train samples from a real broker.

Run: .venv/bin/python bench/scripts/reader_bench.py [--bootstrap-servers HOST:PORT] \
    [--samples 512]
     [--tokens 32768] [--group-size 8] [--groups-per-batch 4] [--repeats 3] [--json]

Setup: one topic (--partitions, default 3); --samples train samples of --tokens int32 tokens whose second
half is the response (uint8 loss mask, float32 rollout log-probs), published in groups of --group-size
samples keyed by group, as the worker writes them. Then, per repeat, a fresh reader (new consumer group,
start=earliest) reads every group: the time runs from the constructor to the last batch, so it includes
connecting, resuming (a commit lookup), fetching, decoding, group assembly, merging, collation and the
hand-over through the prefetch queue. MB/s = record value bytes read / that time (10^6 bytes per MB).

For context, two baselines on the same data: `kafka fetch` (a read_committed consumer polling the raw
bytes, no decoding) and `decode + collate` (decode_train_sample + rollout_stream.core.collate on the records
already in memory, no Kafka). `partition_idle_ms=0`: the data is complete before reading starts, so no empty
partition needs a grace period.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import uuid
from typing import Any

import numpy as np
from kafka import TopicPartition
from kafka.admin import NewTopic

from rollout_stream.clients import MAX_RECORD_BYTES, Connection
from rollout_stream.codec import Sample, TrainSample, decode_train_sample, encode_train_sample
from rollout_stream.commands.connection import connection_from_options
from rollout_stream.commands.local import running_local_broker
from rollout_stream.core.collate import collate
from rollout_stream.kafka.kafka_python import raw_admin, raw_consumer, raw_producer
from rollout_stream.reader import TrainDataReader


def make_records(n: int, tokens: int, group_size: int, seed: int = 0) -> list[tuple[bytes, bytes]]:
    rng = np.random.default_rng(seed)
    response = tokens // 2
    out = []
    for i in range(n):
        g, member = divmod(i, group_size)
        sample = Sample(
            group_index=g, index=member, rollout_id=member, run_id="bench", group_size=group_size,
            tokens=rng.integers(0, 151_936, size=tokens, dtype=np.int32), response_length=response,  # type: ignore[arg-type]  # numpy arrays encode as the packed arrays they stand for
            loss_mask=(rng.random(response) > 0.1).astype(np.uint8),  # type: ignore[arg-type]  # numpy arrays encode as the packed arrays they stand for
            rollout_log_probs=np.log(rng.random(response, dtype=np.float32) + np.float32(1e-6)),
            reward=float(member % 2), weight_versions=["1"],
        )
        size = min(group_size, n - g * group_size)
        train = TrainSample(
            sample=sample, raw_reward=float(member % 2), reward=float(member % 2) - 0.5,
            group_key=f"bench/{g}", group_rollout_count=size, group_sample_count=size, group_mean=0.5,
            group_std=0.5, zero_variance=False, advantage_estimator="grpo", rewards_normalization=True,
            grpo_std_normalization=True, reward_key=None, source_topic="rollouts", source_partition=0,
            source_offset=i,
        )
        out.append((f"bench/{g}".encode(), encode_train_sample(train)))
    return out


def produce(conn: Connection, topic: str, records: list[tuple[bytes, bytes]]) -> float:
    producer = raw_producer(conn, linger_ms=20)
    started = time.perf_counter()
    try:
        for key, value in records:
            producer.send(topic, key=key, value=value)
        producer.flush()
    finally:
        producer.close()
    return time.perf_counter() - started


def read_with_reader(conn: Connection, topic: str, groups: int, groups_per_batch: int, rank: int = 0,
                     world: int = 1) -> tuple[float, int, int, int]:
    """(seconds, batches, samples on this rank, record bytes read)."""
    batches = samples = 0
    started = time.perf_counter()
    with TrainDataReader(conn.bootstrap_servers, topic, f"bench-{uuid.uuid4().hex[:8]}", start="earliest",
                         groups_per_batch=groups_per_batch, rank=rank, world_size=world,
                         partition_idle_ms=0) as reader:
        while reader.stats.groups < groups or batches * groups_per_batch < groups:
            batch = reader.next_batch(timeout=120)
            if batch is None:
                raise RuntimeError(f"only {batches} batches arrived")
            batches += 1
            samples += len(batch)
        elapsed = time.perf_counter() - started
        return elapsed, batches, samples, reader.stats.bytes


def raw_fetch(conn: Connection, topic: str, n: int) -> tuple[float, int]:
    started = time.perf_counter()
    consumer = raw_consumer(conn, group_id=None, max_record_bytes=MAX_RECORD_BYTES)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        count = nbytes = 0
        while count < n:
            for records in consumer.poll(timeout_ms=500).values():
                count += len(records)
                nbytes += sum(len(r.value) for r in records)
        return time.perf_counter() - started, nbytes
    finally:
        consumer.close()


def decode_collate(records: list[tuple[bytes, bytes]], group_size: int, groups_per_batch: int) -> float:
    started = time.perf_counter()
    step = group_size * groups_per_batch
    for i in range(0, len(records), step):
        collate([decode_train_sample(v) for _, v in records[i:i + step]])
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=None)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-batch", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    conn = connection_from_options(args.bootstrap_servers, local=running_local_broker)
    topic = f"bench-reader-{uuid.uuid4().hex[:8]}"
    admin = raw_admin(conn)
    limits = {"max.message.bytes": str(MAX_RECORD_BYTES)}
    admin.create_topics([NewTopic(topic, args.partitions, 1, topic_configs=limits)])
    records = make_records(args.samples, args.tokens, args.group_size)
    groups = -(-args.samples // args.group_size)
    total_bytes = sum(len(v) for _, v in records)
    mb = total_bytes / 1e6
    try:
        produce_s = produce(conn, topic, records)
        names = ("reader", "reader rank 0 of 4", "kafka fetch", "decode + collate")
        runs: dict[str, list[float]] = {name: [] for name in names}
        batches = 0
        for _ in range(args.repeats):
            seconds, batches, _, read_bytes = read_with_reader(conn, topic, groups, args.groups_per_batch)
            assert read_bytes == total_bytes, (read_bytes, total_bytes)
            runs["reader"].append(seconds)
            rank0 = read_with_reader(conn, topic, groups, args.groups_per_batch, rank=0, world=4)
            runs["reader rank 0 of 4"].append(rank0[0])
            runs["kafka fetch"].append(raw_fetch(conn, topic, len(records))[0])
            runs["decode + collate"].append(decode_collate(records, args.group_size, args.groups_per_batch))
    finally:
        admin.delete_topics([topic])
        admin.close()
    result: dict[str, Any] = {
        "python": platform.python_version(), "machine": platform.machine(), "samples": args.samples,
        "tokens": args.tokens, "record_bytes": total_bytes // len(records), "group_size": args.group_size,
        "groups_per_batch": args.groups_per_batch, "batches": batches, "partitions": args.partitions,
        "repeats": args.repeats, "produce_mb_s": round(mb / produce_s, 1), "results": {},
    }
    for name, times in runs.items():
        median = statistics.median(times)
        result["results"][name] = {
            "median_s": round(median, 3), "mb_s": round(mb / median, 1),
            "samples_s": round(args.samples / median, 1),
            "batches_s": None if name == "kafka fetch" else round(batches / median, 2),
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.samples} samples x {args.tokens} tokens ({result['record_bytes']:,} B per record, "
          f"{mb:.1f} MB), groups of {args.group_size}, {args.groups_per_batch} groups per batch = {batches} "
          f"batches, {args.partitions} partitions; median of {args.repeats}; "
          f"produced at {result['produce_mb_s']} MB/s")
    print(f"{'':22} {'seconds':>8} {'batches/s':>10} {'samples/s':>10} {'MB/s':>8}")
    for name, r in result["results"].items():
        bps = f"{r['batches_s']:.2f}" if r["batches_s"] is not None else "-"
        print(f"{name:22} {r['median_s']:8.3f} {bps:>10} {r['samples_s']:10.1f} {r['mb_s']:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
