"""Train data for async trainers: whole prompt groups as torch batches, sharded over DP ranks (SPEC §4.6).

How every rank reads the same sequence without talking to the others (docs/reader.md has the details):

* **Groups.** Each rank reads *all* partitions of the train-data topic (manual assignment, read_committed).
  Per partition, records are assembled into groups by group key until `group_sample_count` distinct
  records (by source topic/partition/offset) are held; copies of a record from an at-least-once
  republication are dropped, and a complete copy of a group already assembled is dropped whole.
* **Global order.** Completed groups are merged across partitions by (timestamp of the record that
  completed the group, partition), each partition in its own offset order. The merge only picks a group
  when every other partition has a completed group waiting, or has been read to its end and the group
  is older than `partition_idle_ms` (Kafka Streams' `max.task.idle.ms` trade-off: an idle partition
  must not stall the stream forever). The sequence is a function of the records, not of fetch timing.
* **Batches.** The next `groups_per_batch` groups that are neither stale nor invalid, judged when the
  batch is completed against the weight version set at that moment. Every rank shards the same batch
  with `core.collate.shard_groups` and keeps its part.
* **Resume.** Rank r commits to its own consumer group `<group_id>-rank<r>`: per partition the lowest
  offset not yet yielded, plus metadata (batch index, read end, the offsets above it still to yield).
  On start every rank reads the commits of ranks 0..world_size-1 and resumes from the one with the
  lowest batch index, so ranks that crashed between commits realign on the same batch.
"""

from __future__ import annotations

import hashlib
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from kafka import TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata

from codec import DecodeError, TrainSample, decode_train_sample
from core.collate import (
    Collated,
    collate,
    collation_problem,
    is_stale_version,
    oldest_weight_version,
    shard_groups,
)
from stream.clients import MAX_RECORD_BYTES, Connection, make_admin, make_consumer
from stream.logs import log_event
from stream.security import SecuritySettings

__all__ = [
    "TrainDataReader",
    "Batch",
    "GroupInfo",
    "ReaderStats",
    "ReaderError",
    "AssembledGroup",
    "GroupAssembler",
    "GroupMerger",
    "ReadMarks",
    "Mark",
    "rank_group_id",
]

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rollout_stream.reader")

Start = Literal["committed", "earliest", "latest"]
_META_PREFIX = "rollout-stream-reader/1"
_MAX_METADATA = 3500  # brokers refuse commit metadata above offset.metadata.max.bytes (default 4096)


class ReaderError(RuntimeError):
    """The background reader failed (broker-fatal error); the cause is chained."""


def rank_group_id(group_id: str, rank: int) -> str:
    return f"{group_id}-rank{rank}"


@dataclass
class ReaderStats:
    records: int = 0
    bytes: int = 0
    groups: int = 0  # assembled and merged into the global sequence
    batches: int = 0
    skipped_stale_groups: int = 0
    skipped_invalid_groups: int = 0
    duplicate_records: int = 0  # copies of a record already held (at-least-once republication)
    duplicate_groups: int = 0  # complete copies of a group already assembled
    decode_errors: int = 0
    abandoned_groups: int = 0  # incomplete groups evicted by the per-partition bound


# ---- group assembly (pure: records in, whole groups out) ---------------------------------------
@dataclass(frozen=True, slots=True)
class AssembledGroup:
    key: str
    partition: int
    samples: tuple[TrainSample, ...]
    offsets: tuple[int, ...]  # the records that form it, ascending
    timestamp_ms: int  # of the record that completed it: the merge key
    nbytes: int
    problem: str | None = None  # why it cannot be collated (skipped whole, counted)
    oldest_version: int | None = None  # oldest weight version of its samples
    version_problem: str | None = None  # a weight version that is not an integer

    @property
    def first_offset(self) -> int:
        return self.offsets[0]


@dataclass(slots=True)
class _Pending:
    expected: int
    samples: list[TrainSample] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sources: set[tuple[str, int, int]] = field(default_factory=set)
    nbytes: int = 0


@dataclass(frozen=True, slots=True)
class Mark:
    """A partition's position after a yielded group: commit `offset`; in [offset, end) only `keep` is new."""

    offset: int
    end: int
    keep: frozenset[int] = frozenset()

    def skips(self, offset: int) -> bool:
        return offset < self.end and offset not in self.keep

    def metadata(self, batch: int) -> str:
        runs: list[str] = []
        rel = sorted(k - self.offset for k in self.keep)
        i = 0
        while i < len(rel):
            j = i
            while j + 1 < len(rel) and rel[j + 1] == rel[j] + 1:
                j += 1
            runs.append(str(rel[i]) if i == j else f"{rel[i]}-{rel[j]}")
            i = j + 1
        return f"{_META_PREFIX} batch={batch} end={self.end} keep={','.join(runs)}"

    @staticmethod
    def parse(offset: int, metadata: str | None) -> tuple[int | None, Mark]:
        """(batch index or None, mark) from a committed offset and its metadata."""
        fields = dict(p.split("=", 1) for p in (metadata or "").split(" ")[1:] if "=" in p)
        if not (metadata or "").startswith(_META_PREFIX + " ") or "batch" not in fields:
            return None, Mark(offset, offset)  # a commit made by something else (e.g. an operator's reset)
        keep: list[int] = []
        for run in filter(None, fields.get("keep", "").split(",")):
            lo, _, hi = run.partition("-")
            keep.extend(range(offset + int(lo), offset + int(hi or lo) + 1))
        end = max(offset, int(fields.get("end", offset)))
        return int(fields["batch"]), Mark(offset, end, frozenset(keep))


class ReadMarks:
    """Per partition: offsets read but not yet yielded (held), and how far reading got."""

    def __init__(self) -> None:
        self.next: dict[int, int] = {}
        self.held: dict[int, set[int]] = {}
        self._resumed: dict[int, deque[int]] = {}  # held since the restart, not yet read again

    def start(self, partition: int, position: int, resume: Mark | None = None) -> None:
        """Reading starts at `position`; after a restart, the resumed mark's unread offsets stay held."""
        self.next[partition] = max(position, resume.end) if resume else position
        self.held[partition] = set(resume.keep) if resume else set()
        self._resumed[partition] = deque(sorted(resume.keep)) if resume else deque()

    def read(self, partition: int, offset: int, *, hold: bool) -> None:
        self.next[partition] = max(self.next.get(partition, 0), offset + 1)
        held = self.held.setdefault(partition, set())
        resumed = self._resumed.get(partition)
        while resumed and resumed[0] <= offset:
            gone = resumed.popleft()
            if gone < offset:
                held.discard(gone)  # no longer in the log (retention): nothing left to wait for
        if hold:
            held.add(offset)
        else:
            held.discard(offset)

    def release(self, partition: int, offsets: Sequence[int]) -> None:
        self.held[partition].difference_update(offsets)

    def snapshot(self) -> dict[int, Mark]:
        out: dict[int, Mark] = {}
        for p, end in self.next.items():
            held = self.held.get(p)
            out[p] = Mark(min(held), end, frozenset(held)) if held else Mark(end, end)
        return out


class GroupAssembler:
    """Whole groups from one topic's records, each partition on its own (pure: no Kafka, no clock)."""

    def __init__(self, marks: ReadMarks, stats: ReaderStats, *, max_pending_per_partition: int = 1024,
                 remember_per_partition: int = 20_000) -> None:
        self.marks = marks
        self.stats = stats
        self.max_pending = max_pending_per_partition
        self.remember = remember_per_partition
        self.pending: dict[int, OrderedDict[str, _Pending]] = {}
        # Per partition, so that what is remembered (and forgotten) depends on that partition's records
        # alone, never on how fetches of different partitions interleave: every rank decides alike.
        # A group is remembered by a digest of its key and lineage (~100 B each, not the whole set).
        self.recent: dict[int, OrderedDict[bytes, None]] = {}

    def accept(self, partition: int, offset: int, timestamp_ms: int,
               value: bytes | None) -> AssembledGroup | None:
        self.stats.records += 1
        self.stats.bytes += len(value or b"")
        try:
            if value is None:
                raise DecodeError("record has no value (tombstone)")
            ts = decode_train_sample(value)
        except DecodeError as exc:
            self.stats.decode_errors += 1
            self.marks.read(partition, offset, hold=False)
            log_event(log, "record.undecodable", logging.WARNING, partition=partition, offset=offset,
                      error=exc.message[:300])
            return None
        groups = self.pending.setdefault(partition, OrderedDict())
        pending = groups.get(ts.group_key)
        source = (ts.source_topic, ts.source_partition, ts.source_offset)
        if pending is not None and source in pending.sources:
            self.stats.duplicate_records += 1
            self.marks.read(partition, offset, hold=False)
            return None
        self.marks.read(partition, offset, hold=True)
        if pending is None:
            pending = groups[ts.group_key] = _Pending(max(1, ts.group_sample_count))
            self._bound(partition, groups)
        pending.samples.append(ts)
        pending.offsets.append(offset)
        pending.sources.add(source)
        pending.nbytes += len(value or b"")
        if len(pending.samples) < pending.expected:
            return None
        del groups[ts.group_key]
        lineage = repr((ts.group_key, sorted(pending.sources))).encode()
        identity = hashlib.blake2b(lineage, digest_size=16).digest()
        recent = self.recent.setdefault(partition, OrderedDict())
        if identity in recent:
            self.stats.duplicate_groups += 1
            self.marks.release(partition, pending.offsets)
            return None
        recent[identity] = None
        if len(recent) > self.remember:
            recent.popitem(last=False)
        problem = next((p for p in map(collation_problem, pending.samples) if p is not None), None)
        oldest, version_problem = None, None
        try:
            oldest = oldest_weight_version(pending.samples)
        except ValueError as exc:
            version_problem = str(exc)
        return AssembledGroup(ts.group_key, partition, tuple(pending.samples), tuple(sorted(pending.offsets)),
                              timestamp_ms, pending.nbytes, problem, oldest, version_problem)

    def _bound(self, partition: int, groups: OrderedDict[str, _Pending]) -> None:
        while len(groups) > self.max_pending:
            key, old = groups.popitem(last=False)
            self.stats.abandoned_groups += 1
            self.marks.release(partition, old.offsets)
            log_event(log, "group.abandoned", logging.WARNING, partition=partition, group=key,
                      have=len(old.samples), expected=old.expected, first_offset=min(old.offsets))


class GroupMerger:
    """The global order: completed groups of all partitions merged by (completion timestamp, partition)."""

    def __init__(self, partitions: Sequence[int], idle_ms: int | None) -> None:
        self.queues: dict[int, deque[AssembledGroup]] = {p: deque() for p in partitions}
        self.idle_ms = idle_ms

    def push(self, group: AssembledGroup) -> None:
        self.queues[group.partition].append(group)

    def backlog(self, partition: int) -> int:
        return len(self.queues[partition])

    def pop(self, now_ms: int, caught_up: Callable[[int], bool]) -> AssembledGroup | None:
        """The next group of the global sequence, or None while another partition may still precede it."""
        heads = [(q[0].timestamp_ms, p) for p, q in self.queues.items() if q]
        if not heads:
            return None
        ts, partition = min(heads)
        for p, q in self.queues.items():
            if q:
                continue
            # An empty partition could still deliver an earlier group, unless it is read to its end and
            # the candidate is older than the idle bound (later records carry later timestamps).
            if self.idle_ms is None or ts > now_ms - self.idle_ms or not caught_up(p):
                return None
        return self.queues[partition].popleft()


# ---- the background thread: Kafka → assembler → merger → queue ----------------------------------
_Item = tuple[str, Any, Any]


class _CaughtUp:
    """Whether a partition is read to its end (read_committed: an open transaction keeps it behind)."""

    def __init__(self, consumer: Any, tps: dict[int, TopicPartition]) -> None:
        self.consumer, self.tps = consumer, tps
        self.known: dict[int, bool] = {}

    def __call__(self, partition: int) -> bool:
        if partition not in self.known:
            tp = self.tps[partition]
            high = self.consumer.highwater(tp)
            self.known[partition] = high is not None and self.consumer.position(tp) >= high
        return self.known[partition]


class _Prefetcher(threading.Thread):
    def __init__(self, reader: TrainDataReader) -> None:
        super().__init__(name=f"train-data-reader-{reader.rank}", daemon=True)
        self.r = reader
        self.stop = threading.Event()
        self.consumer: Any = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced in the trainer's thread by next_batch()
            self._put(("error", exc, None))
        finally:
            if self.consumer is not None:
                self.consumer.close(autocommit=False)

    def _put(self, item: _Item) -> bool:
        while not self.stop.is_set():
            try:
                self.r._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _partitions(self) -> list[int]:
        waited = 0.0
        while not self.stop.is_set():
            parts = self.consumer.partitions_for_topic(self.r.topic)
            if parts:
                return sorted(parts)
            if waited % 10 == 0:
                log_event(log, "topic.waiting", logging.WARNING, topic=self.r.topic)
            time.sleep(0.5)
            waited += 0.5
        return []

    def _resume(self, partitions: list[int]) -> tuple[int | None, dict[int, Mark]]:
        """The commit of the rank with the lowest batch index (ranks realign after a crash mid-commit)."""
        r = self.r
        groups = [rank_group_id(r.group_id, i) for i in range(r.world_size)]
        tps = [TopicPartition(r.topic, p) for p in partitions]
        admin = make_admin(r.conn)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    found = admin.list_group_offsets({g: tps for g in groups})
                    break
                except KafkaError as exc:  # e.g. the coordinator of a fresh cluster is still being elected
                    if not exc.retriable or time.monotonic() > deadline or self.stop.is_set():
                        raise
                    time.sleep(0.5)
        finally:
            admin.close()
        best: tuple[int, int, dict[int, Mark]] | None = None
        for rank, g in enumerate(groups):
            marks: dict[int, Mark] = {}
            batch = -1
            for tp, om in found.get(g, {}).items():
                if om.offset is None or om.offset < 0:
                    continue
                b, marks[tp.partition] = Mark.parse(om.offset, om.metadata)
                batch = max(batch, b if b is not None else -1)
            if marks and (best is None or (batch, rank) < best[:2]):
                best = (batch, rank, marks)
        if best is None:
            return None, {}
        log_event(log, "reader.resume", topic=r.topic, group=groups[best[1]], batch=best[0],
                  offsets=",".join(f"{p}:{m.offset}" for p, m in sorted(best[2].items())))
        return (best[0] if best[0] >= 0 else None), best[2]

    def _run(self) -> None:
        r = self.r
        conn = replace(r.conn, client_id=f"rollout-stream-reader-{r.rank}")
        self.consumer = c = make_consumer(conn, group_id=None, max_record_bytes=r.max_record_bytes)
        partitions = self._partitions()
        if not partitions:
            return
        batch, resume = self._resume(partitions) if r.start == "committed" else (None, {})
        tps = {p: TopicPartition(r.topic, p) for p in partitions}
        c.assign(list(tps.values()))
        for p, tp in tps.items():
            if p in resume:
                c.seek(tp, resume[p].offset)
            elif r.start == "latest":
                c.seek_to_end(tp)
            else:
                c.seek_to_beginning(tp)
        marks = ReadMarks()
        for p, tp in tps.items():
            marks.start(p, c.position(tp), resume.get(p))
        self._put(("resumed", batch, None))
        assembler = GroupAssembler(marks, r.stats)
        merger = GroupMerger(partitions, r.partition_idle_ms)
        paused: set[int] = set()
        while not self.stop.is_set():
            polled = c.poll(timeout_ms=100)
            for tp, records in polled.items():
                mark = resume.get(tp.partition)
                for rec in records:
                    if mark is not None and mark.skips(rec.offset):
                        marks.read(tp.partition, rec.offset, hold=False)  # yielded before the restart
                        continue
                    group = assembler.accept(tp.partition, rec.offset, rec.timestamp, rec.value)
                    if group is not None:
                        merger.push(group)
            caught_up = _CaughtUp(c, tps)
            while (group := merger.pop(int(time.time() * 1000), caught_up)) is not None:
                marks.release(group.partition, group.offsets)
                r.stats.groups += 1
                if not self._put(("group", group, marks.snapshot())):
                    return
            for p, tp in tps.items():  # bounded memory: stop fetching partitions far ahead of the merge
                if merger.backlog(p) >= r._max_backlog and p not in paused:
                    c.pause(tp)
                    paused.add(p)
                elif merger.backlog(p) < r._max_backlog // 2 and p in paused:
                    c.resume(tp)
                    paused.discard(p)


# ---- what the trainer gets ---------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GroupInfo:
    key: str
    partition: int
    first_offset: int
    last_offset: int
    timestamp_ms: int
    samples: int
    rollouts: int
    oldest_weight_version: int | None
    mean: float
    std: float
    zero_variance: bool


@dataclass(frozen=True)
class Batch:
    """One step's data: `groups` (all ranks) and this rank's `samples` with their collated tensors."""

    index: int  # position in the global sequence of batches (the same on every rank, kept across resumes)
    rank: int
    world_size: int
    samples: list[TrainSample]
    groups: list[GroupInfo]
    tensors: Collated
    skipped_stale: int
    skipped_invalid: int
    global_samples: int  # samples of the whole batch, over all ranks
    global_loss_tokens: int  # tokens with a non-zero loss mask in the whole batch (for DP loss normalization)

    @property
    def tokens(self) -> torch.Tensor:
        return self.tensors.tokens

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.tensors.attention_mask

    @property
    def total_lengths(self) -> torch.Tensor:
        return self.tensors.total_lengths

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.tensors.response_lengths

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.tensors.loss_mask

    @property
    def rollout_log_probs(self) -> torch.Tensor:
        return self.tensors.rollout_log_probs

    @property
    def response_index(self) -> torch.Tensor:
        return self.tensors.response_index

    @property
    def rewards(self) -> torch.Tensor:
        return self.tensors.rewards

    @property
    def raw_rewards(self) -> torch.Tensor:
        return self.tensors.raw_rewards

    def __len__(self) -> int:
        return len(self.samples)


def _loss_tokens(s: TrainSample) -> int:
    if s.sample.remove_sample:
        return 0
    if s.sample.loss_mask is None:
        return s.sample.response_length
    return int((s.sample.loss_mask.numpy() != 0).sum())


def _info(g: AssembledGroup) -> GroupInfo:
    first = g.samples[0]
    return GroupInfo(g.key, g.partition, g.offsets[0], g.offsets[-1], g.timestamp_ms, len(g.samples),
                     first.group_rollout_count, g.oldest_version, first.group_mean, first.group_std,
                     first.zero_variance)


class TrainDataReader:
    """Iterate whole prompt groups of a train-data topic as batches for one data-parallel rank.

    >>> with TrainDataReader("localhost:9092", "train-data", "trainer", groups_per_batch=8,
    ...                      rank=rank, world_size=world, max_weight_staleness=2) as reader:
    ...     for batch in reader:
    ...         step(batch.tokens, batch.loss_mask, batch.rewards, batch.rollout_log_probs)
    ...         reader.set_weight_version(step_count)
    ...         reader.commit()

    `start`: "committed" (resume after the last committed batch, else from the beginning), "earliest"
    or "latest" (ignore commits). `idle_timeout_s`: iteration ends when no batch completes for that long
    (None: wait forever). `partition_idle_ms`: see the module docstring (None: never pass an empty
    partition, fully deterministic even with unbounded producer delays, but an idle partition stalls).
    """

    def __init__(
        self,
        bootstrap_servers: str | Connection,
        topic: str,
        group_id: str,
        *,
        groups_per_batch: int,
        security: SecuritySettings | None = None,
        rank: int = 0,
        world_size: int = 1,
        max_weight_staleness: int | None = None,
        prefetch: int = 4,
        balance_tokens: bool = False,
        pad_token_id: int = 0,
        start: Start = "committed",
        idle_timeout_s: float | None = None,
        partition_idle_ms: int | None = 2000,
        max_record_bytes: int = MAX_RECORD_BYTES,
    ) -> None:
        if groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in 0..world_size-1, got rank {rank} of world_size {world_size}")
        if max_weight_staleness is not None and max_weight_staleness < 0:
            raise ValueError(f"max_weight_staleness must be >= 0, got {max_weight_staleness}")
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if start not in ("committed", "earliest", "latest"):
            raise ValueError(f"start must be committed, earliest or latest, got {start!r}")
        if not group_id:
            raise ValueError("group_id must not be empty")
        # An address (with `security`, e.g. SecuritySettings.from_env()), or a Connection that carries both.
        self.conn = (replace(bootstrap_servers, client_id=f"rollout-stream-reader-{rank}")
                     if isinstance(bootstrap_servers, Connection) else
                     Connection(bootstrap_servers, client_id=f"rollout-stream-reader-{rank}",
                                security=security or SecuritySettings()))
        self.topic = topic
        self.group_id = group_id
        self.groups_per_batch = groups_per_batch
        self.rank = rank
        self.world_size = world_size
        self.max_weight_staleness = max_weight_staleness
        self.balance_tokens = balance_tokens
        self.pad_token_id = pad_token_id
        self.start = start
        self.idle_timeout_s = idle_timeout_s
        self.partition_idle_ms = partition_idle_ms
        self.max_record_bytes = max_record_bytes
        self.stats = ReaderStats()
        self.weight_version: int | None = None
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=prefetch * groups_per_batch)
        self._max_backlog = max(16, 2 * prefetch * groups_per_batch)
        self._buffer: list[tuple[AssembledGroup, dict[int, Mark]]] = []
        self._next_index: int | None = None  # known once the background thread has resumed
        self._yielded: tuple[int, dict[int, Mark]] | None = None
        self._committed: tuple[int, dict[int, Mark]] | None = None
        self._committer: Any = None
        self._failed: ReaderError | None = None
        self._closed = False
        self._thread = _Prefetcher(self)
        self._thread.start()

    # ---- iteration -----------------------------------------------------------------------------
    def set_weight_version(self, version: int) -> None:
        """The trainer's weight version: groups older than version - max_weight_staleness are skipped."""
        self.weight_version = int(version)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        batch = self.next_batch(self.idle_timeout_s)
        if batch is None:
            raise StopIteration
        return batch

    def next_batch(self, timeout: float | None = None) -> Batch | None:
        """The next batch, or None if it did not complete within `timeout` seconds (its groups stay buffered).

        Staleness is judged when the batch completes, against the weight version set at that moment.
        """
        if self._closed:
            raise ReaderError("the reader is closed")
        if self._failed is not None:
            raise self._failed
        deadline = None if timeout is None else time.monotonic() + timeout
        verdicts = [self._verdict(g) for g, _ in self._buffer]
        good = verdicts.count(None)
        while good < self.groups_per_batch:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                kind, value, snapshot = self._queue.get(timeout=remaining)
            except queue.Empty:
                return None
            if kind == "error":
                self._failed = ReaderError(f"reading {self.topic} failed: {type(value).__name__}: {value}")
                self._failed.__cause__ = value
                raise self._failed
            if kind == "resumed":
                self._next_index = 0 if value is None else value + 1
                continue
            self._buffer.append((value, snapshot))
            verdicts.append(self._verdict(value))
            good += verdicts[-1] is None
        return self._batch(verdicts)

    def _verdict(self, group: AssembledGroup) -> str | None:
        """None: the group trains; "stale" or "invalid": it is skipped whole (as core.collate.is_stale)."""
        if group.problem is not None:
            return "invalid"
        if self.max_weight_staleness is None or self.weight_version is None:
            return None
        if group.version_problem is not None:
            return "invalid"  # a weight version that is not an integer: the rule cannot be applied
        stale = is_stale_version(group.oldest_version, self.weight_version, self.max_weight_staleness)
        return "stale" if stale else None

    def _batch(self, verdicts: list[str | None]) -> Batch:
        taken, n = 0, 0
        while taken < self.groups_per_batch:  # the shortest prefix holding groups_per_batch good groups
            taken += verdicts[n] is None
            n += 1
        items, self._buffer = self._buffer[:n], self._buffer[n:]
        verdicts = verdicts[:n]
        for (group, _), verdict in zip(items, verdicts, strict=True):
            if verdict == "invalid":
                log_event(log, "group.skipped_invalid", logging.WARNING, group=group.key,
                          partition=group.partition, offset=group.first_offset,
                          problem=group.problem or group.version_problem)
        good = [g for (g, _), v in zip(items, verdicts, strict=True) if v is None]
        mine = shard_groups([g.samples for g in good], self.rank, self.world_size,
                            balance_tokens=self.balance_tokens)
        index = self._next_index if self._next_index is not None else 0
        self._next_index = index + 1
        batch = Batch(
            index=index, rank=self.rank, world_size=self.world_size, samples=mine,
            groups=[_info(g) for g in good],
            tensors=collate(mine, pad_token_id=self.pad_token_id),
            skipped_stale=verdicts.count("stale"), skipped_invalid=verdicts.count("invalid"),
            global_samples=sum(len(g.samples) for g in good),
            global_loss_tokens=sum(_loss_tokens(s) for g in good for s in g.samples),
        )
        self._yielded = (index, items[-1][1])
        self.stats.batches += 1
        self.stats.skipped_stale_groups += batch.skipped_stale
        self.stats.skipped_invalid_groups += batch.skipped_invalid
        return batch

    # ---- commit / lifecycle --------------------------------------------------------------------
    def commit(self) -> bool:
        """Commit the position after the last yielded batch (this rank's group); False if nothing is new."""
        if self._closed:
            raise ReaderError("the reader is closed")
        if self._yielded is None or self._yielded == self._committed:
            return False
        index, snapshot = self._yielded
        offsets = {}
        for p, mark in snapshot.items():
            meta = mark.metadata(index)
            if len(meta) > _MAX_METADATA:  # too many interleaved offsets to list: re-read them on restart
                log_event(log, "commit.metadata_truncated", logging.WARNING, partition=p, keep=len(mark.keep))
                meta = Mark(mark.offset, mark.offset).metadata(index)
            offsets[TopicPartition(self.topic, p)] = OffsetAndMetadata(mark.offset, meta, -1)
        if self._committer is None:
            self._committer = make_consumer(self.conn, group_id=rank_group_id(self.group_id, self.rank))
        self._committer.commit(offsets)
        self._committed = self._yielded
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._thread.stop.set()
        self._thread.join(timeout=30)
        if self._committer is not None:
            self._committer.close(autocommit=False)

    def __enter__(self) -> TrainDataReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

