"""Benchmark workloads: what one prompt group looks like, and topics pre-loaded with many of them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rollout_stream.clients import MAX_RECORD_BYTES, Connection
from rollout_stream.codec import Array, Sample, encode_sample, group_key_of
from rollout_stream.errors import RuntimeFailure
from rollout_stream.kafka import TopicPartition, TopicSpec, client_for
from rollout_stream.names import heads_topic
from rollout_stream.topics import replication_for

__all__ = [
    "Workload",
    "standard_workloads",
    "group_records",
    "BenchTopics",
    "create_topics",
    "delete_topics",
    "preload",
    "Preloaded",
    "PreloadFailed",
]


class PreloadFailed(RuntimeFailure, RuntimeError):
    """A record of the backlog a benchmark drains was not acknowledged by the broker."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Prompt groups of `group_size` rollouts, each rollout `siblings` samples of `tokens` tokens."""

    name: str
    tokens: int
    group_size: int
    siblings: int = 1
    groups: int = 100  # groups sent for a throughput run

    @property
    def samples_per_group(self) -> int:
        return self.group_size * self.siblings

    @property
    def samples(self) -> int:
        return self.groups * self.samples_per_group

    @property
    def key(self) -> str:
        """E.g. `a-g8`: how `--workload` names it, and the tag of its bench processes."""
        return f"{self.name}-g{self.group_size}"

    def label(self) -> str:
        """E.g. `a 256t g8`, `b 32Kt g16`, `c 256t×3 g8`."""
        size = f"{self.tokens // 1024}Kt" if self.tokens >= 1024 else f"{self.tokens}t"
        fan = f"×{self.siblings}" if self.siblings > 1 else ""
        return f"{self.name} {size}{fan} g{self.group_size}"


def standard_workloads(quick: bool = False) -> list[Workload]:
    """(a) short, (b) long, (c) agentic fan-out samples, each with groups of 8 and 16.

    Sized so a drain lasts seconds on librdkafka too: 96,000 samples of (a) (200 MB), 10,240 of (b)
    (2.2 GB), 96,000 of (c). In shorter drains the first fetch and the last commit decided the rate, and
    pairs of one run spread far wider (docs/benchmarks.md). `quick` is a smoke-sized run for tests.
    """
    if quick:
        return [Workload("a", 256, 8, 1, 24), Workload("b", 32768, 8, 1, 1)]
    out = []
    for g in (8, 16):
        out += [
            Workload("a", 256, g, 1, 96_000 // g),
            Workload("b", 32768, g, 1, 10_240 // g),
            Workload("c", 256, g, 3, 96_000 // (3 * g)),
        ]
    return sorted(out, key=lambda w: (w.name, w.group_size))


def _sample(
    w: Workload, rng: np.random.Generator, run_id: str, gi: int, rid: int, sib: int, reward: float
) -> Sample:
    resp = max(1, w.tokens // 2)
    return Sample(
        group_index=gi,
        index=rid,
        rollout_id=rid,
        tokens=Array(rng.integers(0, 32000, w.tokens, dtype="<i4")),
        response_length=resp,
        reward=reward,
        loss_mask=Array(np.ones(resp, dtype="u1")),
        rollout_log_probs=Array(rng.random(resp, dtype="<f4") * -2.0),
        weight_versions=["1"],
        group_size=w.group_size,
        sibling_count=w.siblings,
        sibling_index=sib,
        run_id=run_id,
        prompt=f"prompt {gi}",
    )


def group_records(
    w: Workload, run_id: str, gi: int, rng: np.random.Generator, drop_last: bool = False
) -> list[tuple[bytes, bytes]]:
    """(key, value) of every member of group `gi`, rollouts interleaved; `drop_last` leaves the group open."""
    key = group_key_of(run_id, gi).encode()
    out = []
    for r in range(w.group_size):
        reward = float(rng.integers(0, 4)) / 4
        for s in range(w.siblings):
            out.append((key, encode_sample(_sample(w, rng, run_id, gi, gi * 1000 + r, s, reward))))
    return out[:-1] if drop_last else out


@dataclass(frozen=True, slots=True)
class TopicTriple:
    """Input, output and dead-letter topic of one measurement (as `rollout_stream.config.TopicNames`, without
    importing the worker's configuration and, through it, torch into processes that do not need it)."""

    input: str
    output: str
    dead_letter: str


@dataclass(frozen=True, slots=True)
class BenchTopics:
    names: TopicTriple
    partitions: int
    heads: str | None = None  # the output's group heads topic, when the stage writes heads

    def all(self) -> list[str]:
        return [self.names.input, self.names.output, self.names.dead_letter, *filter(None, [self.heads])]


def create_topics(conn: Connection, partitions: int, tag: str = "bench", *,
                  heads: bool = False) -> BenchTopics:
    """Fresh input, output and dead-letter topics (and the output's group heads topic, with `heads`)."""
    prefix = f"{tag}-{uuid.uuid4().hex[:8]}"
    names = TopicTriple(f"{prefix}-rollouts", f"{prefix}-train", f"{prefix}-dlq")
    heads_name = heads_topic(names.output) if heads else None
    admin = client_for(conn).admin(client_id=conn.client_id)
    try:
        replication = replication_for(admin)  # on a cluster, replicated as `topics create` would
        for error in admin.create_topics(
            [TopicSpec(n, partitions, replication.factor,
                       {"max.message.bytes": str(MAX_RECORD_BYTES), **replication.configs(),
                        # the broker stamps outputs as it appends them: a rate measured outside the process
                        **({"message.timestamp.type": "LogAppendTime"} if n == names.output else {})})
             for n in (names.input, names.output, names.dead_letter, *filter(None, [heads_name]))]
        ).values():
            if error is not None:
                raise error
    finally:
        admin.close()
    return BenchTopics(names, partitions, heads_name)


def delete_topics(conn: Connection, topics: list[str]) -> None:
    """Best effort: bench topics hold hundreds of MB the broker should not keep. The windows changelog each
    stage drain's worker made for an input topic goes too: left behind, a full run leaked one per stage
    drain, about 40."""
    admin = client_for(conn).admin(client_id=conn.client_id)
    try:
        changelogs = tuple(f"-{name}-windows-changelog" for name in topics)
        admin.delete_topics([*topics, *(t for t in admin.list_topics() if t.endswith(changelogs))])
    except Exception:  # noqa: BLE001 - a leftover topic only costs disk; the result is already measured
        pass
    finally:
        admin.close()


@dataclass(frozen=True, slots=True)
class Preloaded:
    records: int
    bytes: int
    end_offsets: dict[int, int]
    seconds: float


def _groups(
    w: Workload, run_id: str, count: int, seed: int, drop_last: bool
) -> Iterator[list[tuple[bytes, bytes]]]:
    rng = np.random.default_rng(seed)
    for gi in range(count):
        yield group_records(w, run_id, gi, rng, drop_last)


def preload(
    conn: Connection,
    topic: str,
    w: Workload,
    *,
    groups: int | None = None,
    seed: int = 0,
    drop_last: bool = False,
    run_id: str | None = None,
) -> Preloaded:
    """Write the workload's groups to `topic` before the timed run; returns the end offsets to drain to."""
    run_id = run_id or f"bench-{uuid.uuid4().hex[:6]}"
    client = client_for(conn)
    producer = client.producer(client_id=conn.client_id, max_record_bytes=MAX_RECORD_BYTES, linger_ms=20,
                               batch_size=1 << 20)
    started = time.monotonic()
    n = nbytes = 0
    futures = []
    try:
        for records in _groups(w, run_id, w.groups if groups is None else groups, seed, drop_last):
            for key, value in records:
                futures.append(producer.send(topic, value, key))
                n += 1
                nbytes += len(key) + len(value)
        producer.flush(timeout=300)
        for f in futures:
            if (error := f.exception()) is not None or not f.done():
                raise PreloadFailed(f"preloading {topic} failed: {error or 'not acknowledged'}")
    finally:
        producer.close(timeout=30)
    # the topic is the run's own: its end offsets are where this preload ends
    ends = {p: end for p, end in end_offsets(conn, topic).items() if end}
    return Preloaded(n, nbytes, ends, time.monotonic() - started)


def end_offsets(conn: Connection, topic: str) -> dict[int, int]:
    consumer = client_for(conn).assigned_consumer(client_id=conn.client_id, max_record_bytes=MAX_RECORD_BYTES)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        return {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def append_span(conn: Connection, topic: str, start: dict[int, int], end: dict[int, int]
                ) -> tuple[int, float]:
    """Records appended to `topic` between two sets of end offsets, and the seconds from the first one's
    broker timestamp (LogAppendTime) to the last one's: a drain's rate as the broker saw it."""
    consumer = client_for(conn).assigned_consumer(client_id=conn.client_id, max_record_bytes=MAX_RECORD_BYTES)
    count, first, last = 0, None, None
    try:
        tps = [TopicPartition(topic, p) for p in end if end[p] > start.get(p, 0)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start.get(tp.partition, 0))
        deadline = time.monotonic() + 120
        while tps and any(consumer.position(tp) < end[tp.partition] for tp in tps):
            if time.monotonic() > deadline:
                raise PreloadFailed(f"reading {topic}'s new records took over 120 s")
            for tp, records in consumer.poll(0.5).items():
                for rec in records:
                    if rec.offset < end[tp.partition]:
                        count += 1
                        first = rec.timestamp if first is None else min(first, rec.timestamp)
                        last = rec.timestamp if last is None else max(last, rec.timestamp)
    finally:
        consumer.close()
    return count, ((last - first) / 1000 if first is not None and last is not None else 0.0)
