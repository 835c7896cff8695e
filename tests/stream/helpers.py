"""Helpers for tests against the real broker: topics, a worker in a thread, reading outputs."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from rollout_stream.clients import Connection
from rollout_stream.codec import TrainSample, decode_train_sample
from rollout_stream.codec.chunks import CHUNK_HEADER
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.core import RewardConfig, post_process_rewards
from rollout_stream.worker import Worker


def new_topics(bootstrap: str, partitions: int = 3, prefix: str = "t",
               output_config: Mapping[str, str] | None = None) -> TopicNames:
    """Input, train-data and dead-letter topics; `output_config`: more settings of the train-data topic."""
    tag = f"{prefix}-{uuid.uuid4().hex[:8]}"
    names = TopicNames(f"{tag}-rollouts", f"{tag}-train", f"{tag}-dlq")
    base = {"max.message.bytes": str(64 << 20)}
    configs = {names.input: base, names.output: {**base, **(output_config or {})}, names.dead_letter: base}
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(n, partitions, 1, topic_configs=c) for n, c in configs.items()])
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        wait_until(lambda: all(len(consumer.partitions_for_topic(t) or ()) == partitions
                               for t in (names.input, names.output, names.dead_letter)), 20, "topic metadata")
    finally:
        consumer.close()
    return names


@contextmanager
def running_worker(config: WorkerConfig) -> Iterator[Worker]:
    worker = Worker(config, Connection(config.bootstrap_servers or ""))
    errors: list[BaseException] = []

    def target() -> None:
        try:
            worker.run()
        except BaseException as exc:  # surfaced in the test thread
            errors.append(exc)
            raise

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield worker
        if errors:
            raise errors[0]
    finally:
        worker.request_stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "worker did not stop within 60 s"
        if errors:
            raise errors[0]


def wait_until(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    import faulthandler
    import sys

    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)  # where the worker is stuck, if it is
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@dataclass
class Read:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]


def read_topic(bootstrap: str, topic: str, *, min_count: int = 0, timeout: float = 30.0,
               settle: float = 1.0, abort: Callable[[], str | None] | None = None) -> list[Read]:
    """Every committed record of `topic` (read_committed), waiting until at least `min_count` arrived.

    `abort` is asked while waiting: a text from it (say, the writer died) fails the wait at once.
    """
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                             enable_auto_commit=False, max_partition_fetch_bytes=64 << 20,
                             fetch_max_bytes=64 << 20)
    try:
        deadline = time.monotonic() + timeout
        # A client still bootstrapping (or a topic created a moment ago) knows no partitions yet.
        while not (parts := consumer.partitions_for_topic(topic)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{topic}: no partitions in the cluster's metadata within {timeout}s")
            time.sleep(0.1)
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Read] = []
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            problem = abort() if abort is not None else None
            if problem is not None:
                raise AssertionError(f"stopped waiting for {topic} ({len(out)}/{min_count} read): {problem}")
            batch = consumer.poll(timeout_ms=200)
            got = [r for recs in batch.values() for r in recs]
            for r in got:
                out.append(Read(r.topic, r.partition, r.offset, r.key, r.value,
                                {k: v.decode("latin-1") if k == CHUNK_HEADER else v.decode()
                                 for k, v in (r.headers or [])}))
            if got:
                quiet_since = time.monotonic()
            elif len(out) >= min_count and time.monotonic() - quiet_since >= settle:
                break
        return out
    finally:
        consumer.close()


def joined(reads: list[Read]) -> list[Read]:
    """`reads` with the chunk records of each value (docs/chunks.md) joined into one Read at its first chunk's
    place, once all are there (a value with chunks missing is left out)."""
    from rollout_stream.codec.chunks import decode_chunk_header

    out: list[Read] = []
    parts: dict[bytes, list[Read | None]] = {}
    for r in reads:
        raw = r.headers.get(CHUNK_HEADER)
        if raw is None:
            out.append(r)
            continue
        header = decode_chunk_header(raw.encode("latin-1"))
        got = parts.setdefault(header.digest, [None] * header.count)
        got[header.index] = r
        if None not in got:
            del parts[header.digest]  # a copy of the value sent again is joined again (and seen twice)
            first = got[0]
            assert first is not None
            value = b"".join(p.value or b"" for p in got if p is not None)
            headers = {k: v for k, v in first.headers.items() if k != CHUNK_HEADER}
            out.append(Read(first.topic, first.partition, first.offset, first.key, value, headers))
    return out


def train_samples(reads: list[Read]) -> list[TrainSample]:
    return [decode_train_sample(r.value) for r in reads if r.value is not None]


def spawn_worker(bootstrap: str, topics: TopicNames, group_id: str, *extra: str, log_path=None, env=None):
    """`rollout-stream run` as a real subprocess (stderr to `log_path`)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).with_name("rollout-stream")
    cmd = [str(exe), "run", "--bootstrap-servers", bootstrap, "--input-topic", topics.input,
           "--output-topic", topics.output, "--dead-letter-topic", topics.dead_letter, "--group-id", group_id,
           "--progress-interval", "5", *extra]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    return subprocess.Popen(cmd, stdout=out, stderr=out, env={**os.environ, **(env or {})})


def assert_exactly_once(train: list[Any], dlq: list[Any], expected: Any) -> None:
    """Every expected train sample and dead-letter once, whole groups, rewards equal to core's batch API."""
    sources = Counter((t.source_partition, t.source_offset) for t in train)
    assert max(sources.values()) == 1, "a train sample was published twice"
    assert len(train) == expected.published_samples
    def source(r: Any) -> tuple[Any, Any]:
        return r.headers["x-original-partition"], r.headers["x-original-offset"]

    dsources = Counter(source(r) for r in dlq)
    twice = [(r.partition, r.offset, r.key, {k: v for k, v in r.headers.items() if k != "x-error"})
             for r in dlq if dsources[source(r)] > 1]
    assert not twice, f"a record was dead-lettered twice: {twice[:6]}"
    reasons = Counter(r.headers["x-dlq-reason"] for r in dlq)
    want = Counter({str(k): v for k, v in expected.dead_letters.items()})
    assert reasons == want, (f"dead-letter reasons: got {dict(reasons)}, expected {dict(want)}; over: "
                             f"{dict(reasons - want)}, short: {dict(want - reasons)}")
    groups: dict[str, list[Any]] = defaultdict(list)
    for t in train:
        groups[t.group_key].append(t)
    assert len(groups) == expected.published_groups
    cfg = RewardConfig()
    for key, members in groups.items():
        assert len(members) == members[0].group_sample_count, key
        raw, values = post_process_rewards([m.sample for m in members], cfg,
                                           prompt_group_sizes=[len(members)])
        assert [m.reward for m in members] == values and [m.raw_reward for m in members] == raw, key
