"""Train data for async trainers: whole prompt groups as torch batches, per DP rank (docs/spec.md §4.6).

How every rank reads the same sequence without talking to the others (docs/reader.md has the details).
The decisions are pure and live in `rollout_stream.core.assembly`; this module polls, decodes, commits and
logs.

* **Groups.** Each rank reads *all* partitions of the train-data topic (manual assignment, read_committed).
  Per partition, records are assembled into groups by group key until `group_sample_count` distinct
  records (by source topic/partition/offset) are held; copies of a record from an at-least-once
  republication are dropped, and a complete copy of a group already assembled is dropped whole.
* **Global order.** Completed groups are merged across partitions by (timestamp of the record that
  completed the group, its rollouts lineage, partition), each partition in its own offset order. The
  merge only picks a group when every other partition has a completed group waiting, or has been read
  to its end and the group is older than `partition_idle_ms` (Kafka Streams' `max.task.idle.ms`
  trade-off: an idle partition must not stall the stream forever). The sequence is a function of the
  records, not of fetch timing.
* **Batches.** The next `groups_per_batch` groups that are neither stale nor invalid, judged when the
  batch is completed against the weight version set at that moment. Every rank shards the same batch
  with `rollout_stream.core.collate.shard_groups` and keeps its part.
* **Chunked values.** A train record larger than the stage's `chunk_bytes` travels as chunk records (an
  `x-chunk` header, codec/chunks.py) of one partition, written in one transaction. They are reassembled
  into the whole record before it is decoded (see `GroupAssembler`); plain records pay one check of their
  headers. Every chunk's offset is held, and released with the value: none is committed before the value
  is consumed into a batch (or dropped), so a restart reads again every chunk of a value not yet consumed.
* **Rank-local fetch** (`fetch="own"`). With a stage that writes group heads (`write_heads`), every rank
  folds the heads topic instead (same partitions, one small record per group: `rollout_stream.reader_heads`)
  into the same sequence, batches and shards as above, then fetches its own rows of each batch by offset.
  Commits and resume work on the heads topic's offsets with the same metadata.
* **Resume.** Rank r commits to its own consumer group `<group_id>-rank<r>`: per partition the lowest
  offset not yet yielded, plus metadata (batch index, read end, the offsets above it still to yield).
  On start every rank reads the commits of ranks 0..world_size-1 and resumes from the one with the
  lowest batch index, so ranks that crashed between commits realign on the same batch.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from rollout_stream.clients import MAX_RECORD_BYTES, Connection, default_client
from rollout_stream.codec import DeadLetterReason, DecodeError, TrainSample, decode_train_sample
from rollout_stream.codec.chunks import ChunkHeaderError, chunk_header_of, decode_chunk_header
from rollout_stream.codec.group_heads import GroupHead, decode_group_head
from rollout_stream.core.assembly import (
    AssembledGroup,
    GroupInfo,
    GroupMerger,
    Mark,
    ReadMarks,
    SampleAssembler,
    Verdict,
    choose_resume,
    commit_metadata,
    fetch_paused,
    group_info,
    group_verdict,
    plan_batch,
)
from rollout_stream.core.chunks import ChunkAssembler, ChunkKey, Copy, Refused
from rollout_stream.core.collate import Collated, collate
from rollout_stream.core.pacing import doomed_through
from rollout_stream.core.prompt_keys import PromptFence
from rollout_stream.core.structs import InputRecord
from rollout_stream.errors import RuntimeFailure
from rollout_stream.kafka import AssignedConsumer, Committed, KafkaFailure, TopicPartition, client_for
from rollout_stream.logs import log_event
from rollout_stream.names import admission_topic, heads_topic, progress_topic, rank_group_id
from rollout_stream.pacing import TrainerProgressPublisher
from rollout_stream.reader_heads import HeadMemory, PayloadFetcher, outline_group
from rollout_stream.security import SecuritySettings
from rollout_stream.topics import MissingTopic, missing_topics

__all__ = [
    "TrainDataReader",
    "Batch",
    "BatchPosition",
    "GroupInfo",
    "ReaderStats",
    "ReaderError",
    "ChunkLimitError",
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
Layout = Literal["tensors", "miles"]
Fetch = Literal["all", "own"]


class ReaderError(RuntimeFailure, RuntimeError):
    """The background reader failed (broker-fatal error); the cause is chained."""


class ChunkLimitError(ReaderError):
    """Chunked values open at once (or one of them) need more than the reader's `max_open_chunk_bytes`:
    raise it (a group's chunked values are open together while it is read)."""


# Open chunk bytes the reader holds at most (`max_open_chunk_bytes`).
MAX_OPEN_CHUNK_BYTES = 1 << 30
# How long after its first chunk was written a chunked value may stay incomplete in a partition read to its
# end before it is dropped (`chunk_timeout_s`): a read_committed reader can see part of a committed
# transaction while an earlier open one hides the rest, for as long as that one stays open.
CHUNK_TIMEOUT_S = 60.0
# A value holding its first chunk waits this much longer: the stage writes a value's chunks in order in one
# transaction, so the rest can only be hidden behind another producer's open transaction, which the broker
# aborts within its transaction.max.timeout.ms (15 minutes by default).
HIDDEN_BY_TRANSACTION_S = 15 * 60.0


@dataclass(frozen=True)
class BatchPosition:
    """Where a yielded batch ends (`TrainDataReader.position`): its index and, per partition, the read mark
    a commit after it writes."""

    index: int
    marks: dict[int, Mark]


@dataclass
class ReaderStats:
    records: int = 0
    bytes: int = 0
    groups: int = 0  # assembled and merged into the global sequence
    batches: int = 0
    skipped_stale_groups: int = 0
    skipped_invalid_groups: int = 0
    skipped_superseded_groups: int = 0  # another attempt of their prompt trains (the fence, docs/loop.md)
    duplicate_records: int = 0  # copies of a record already held (at-least-once republication)
    duplicate_groups: int = 0  # complete copies of a group already assembled
    decode_errors: int = 0
    abandoned_groups: int = 0  # incomplete groups evicted by the per-partition bound
    chunked_values: int = 0  # values reassembled from chunk records (each chunk counts in `records`)
    payload_bytes: int = 0  # fetch="own": train-data bytes received (its rows', and any fetched with them)
    incomplete_chunked_values: int = 0  # chunks of a value that never completed, dropped
    corrupt_chunked_values: int = 0  # chunks that disagree or do not match their value's digest, dropped


class GroupAssembler:
    """Whole groups from one topic's records: decodes, counts and logs; `rollout_stream.core.assembly`
    decides.

    Chunk records (an `x-chunk` header) are reassembled first (`rollout_stream.core.chunks.ChunkAssembler`,
    per partition and value digest, in any order, copies of a held chunk dropped): each chunk's offset is held
    while the value is open, and the whole value is taken as one record that carries all of them, so they are
    released together, when its group is yielded or it is dropped. What cannot become a whole value:

    * chunks that disagree (count, size, different bytes at one index) or whose joined bytes do not match
      the value's digest: dropped, logged (`chunks.refused`), counted in `corrupt_chunked_values`, like an
      undecodable record (a bad record in the log must not stop every restart of the trainer);
    * a value still incomplete in a partition read to its end `chunk_timeout_s` after its first chunk was
      written (15 minutes more when it holds its first chunk: the rest may be hidden behind another
      producer's open transaction until the broker aborts it; `expire_chunks`): dropped, logged
      (`chunks.incomplete`), counted in
      `incomplete_chunked_values`. The stage writes all chunks of a value in one transaction, so this is
      either a value whose first chunks precede where reading started (a commit whose metadata was
      truncated, an offset reset, retention: its value was consumed before, or is lost) or a bug or a
      writer outside transactions;
    * more open chunk bytes than `max_open_chunk_bytes` (or one value larger): `ChunkLimitError`, a
      setting to raise, never a silent drop.
    """

    def __init__(self, marks: ReadMarks, stats: ReaderStats, *, max_pending_per_partition: int = 1024,
                 remember_per_partition: int = 20_000, max_open_chunk_bytes: int = MAX_OPEN_CHUNK_BYTES,
                 chunk_timeout_s: float = CHUNK_TIMEOUT_S) -> None:
        self.marks = marks
        self.stats = stats
        self.samples = SampleAssembler(max_pending_per_partition=max_pending_per_partition,
                                       remember_per_partition=remember_per_partition)
        self.max_open_chunk_bytes = max_open_chunk_bytes
        self.chunks = ChunkAssembler(int(chunk_timeout_s * 1000), max_open_chunk_bytes)

    def accept(self, partition: int, offset: int, timestamp_ms: int, value: bytes | None,
               headers: Sequence[tuple[str, bytes]] | None = None) -> AssembledGroup | None:
        chunks: tuple[int, ...] = ()
        if headers and (raw := chunk_header_of(headers)) is not None:
            whole = self._chunk(partition, offset, timestamp_ms, value, raw)
            if whole is None:
                return None
            value, chunks = whole.value, whole.chunks
            nbytes = len(value or b"")
        else:
            nbytes = len(value or b"")
            self.stats.records += 1
            self.stats.bytes += nbytes
        try:
            if value is None:
                raise DecodeError("record has no value (tombstone)")
            sample = decode_train_sample(value)
        except DecodeError as exc:
            self.stats.decode_errors += 1
            self.marks.read(partition, offset, hold=False)
            if chunks:
                self.marks.release(partition, chunks)
            log_event(log, "record.undecodable", logging.WARNING, partition=partition, offset=offset,
                      error=exc.message[:300])
            return None
        added = self.samples.add(partition, offset, timestamp_ms, sample, nbytes, chunks)
        self.marks.read(partition, offset, hold=added.hold)
        if chunks and not added.hold:
            self.marks.release(partition, chunks)
        if added.release:
            self.marks.release(partition, added.release)
        if added.duplicate == "record":
            self.stats.duplicate_records += 1
        elif added.duplicate == "group":
            self.stats.duplicate_groups += 1
        for old in added.abandoned:
            self.stats.abandoned_groups += 1
            log_event(log, "group.abandoned", logging.WARNING, partition=partition, group=old.key,
                      have=old.have, expected=old.expected, first_offset=old.first_offset)
        return added.group

    def _chunk(self, partition: int, offset: int, timestamp_ms: int, value: bytes | None,
               raw: bytes) -> InputRecord | None:
        """A chunk record: the whole value once its last chunk is here (a record with all their offsets
        in `chunks`), else None (held, or dropped)."""
        stats, marks, assembler = self.stats, self.marks, self.chunks
        stats.records += 1
        stats.bytes += len(value or b"")
        try:
            header = decode_chunk_header(raw)
        except ChunkHeaderError as exc:
            stats.decode_errors += 1
            marks.read(partition, offset, hold=False)
            log_event(log, "record.undecodable", logging.WARNING, partition=partition, offset=offset,
                      error=str(exc)[:300])
            return None
        ckey: ChunkKey = (partition, header.digest, "")
        if assembler.deadline_passed(ckey, timestamp_ms):  # written after the value's chunks timed out
            self._close_incomplete(ckey)
        added = assembler.add(ckey, InputRecord("", partition, offset, timestamp_ms, None, value), header)
        if added is None:
            marks.read(partition, offset, hold=True)
            if assembler.open_bytes > self.max_open_chunk_bytes:
                raise ChunkLimitError(
                    f"open chunked values hold {assembler.open_bytes} bytes, over max_open_chunk_bytes="
                    f"{self.max_open_chunk_bytes} ({len(assembler.open)} values open; the last chunk read: "
                    f"partition {partition} offset {offset})")
            return None
        marks.read(partition, offset, hold=False)  # held again below if it completed the value
        if type(added) is Copy:
            stats.duplicate_records += 1
            return None
        if type(added) is Refused:
            if added.reason is DeadLetterReason.GROUP_TOO_LARGE:
                raise ChunkLimitError(
                    f"a chunked value of {header.total_bytes} bytes (partition {partition} offset {offset}) "
                    f"is larger than max_open_chunk_bytes={self.max_open_chunk_bytes}")
            self._dropped(added)
            return None
        assert not isinstance(added, Copy | Refused)
        stats.chunked_values += 1
        return added.record

    def expire_chunks(self, now_ms: int, read_to_end: Callable[[int], bool]) -> None:
        """Drop chunked values still incomplete `chunk_timeout_s` after their first chunk was written (plus
        HIDDEN_BY_TRANSACTION_S when the first chunk is here), in partitions read to their end."""
        hidden_ms = int(HIDDEN_BY_TRANSACTION_S * 1000)
        due = [k for k, c in self.chunks.open.items() if read_to_end(k[0]) and (
            c.deadline_ms < now_ms if c.parts[0] is None else c.deadline_ms + hidden_ms < now_ms)]
        for ckey in due:
            self._close_incomplete(ckey)

    def _close_incomplete(self, ckey: ChunkKey) -> None:
        first_missing = self.chunks.open[ckey].parts[0] is None
        self._dropped(self.chunks.close_incomplete(ckey), first_missing)

    def _dropped(self, refused: Refused, first_missing: bool = False) -> None:
        """Chunks that do not make a value: released (their offsets may be committed), counted, logged."""
        parts = refused.parts
        partition = parts[0].partition
        self.marks.release(partition, [p.offset for p in parts])
        offsets = sorted(p.offset for p in parts)
        if refused.reason is DeadLetterReason.INCOMPLETE_CHUNKS:
            self.stats.incomplete_chunked_values += 1
            log_event(log, "chunks.incomplete", logging.WARNING, partition=partition, first_offset=offsets[0],
                      last_offset=offsets[-1], error=refused.message[:300],
                      cause=("its first chunk precedes where reading started (a commit whose metadata was "
                             "truncated, an offset reset, retention)" if first_missing else
                             "a writer outside transactions, or a bug"))
        else:
            self.stats.corrupt_chunked_values += 1
            log_event(log, "chunks.refused", logging.WARNING, partition=partition, first_offset=offsets[0],
                      last_offset=offsets[-1], reason=refused.reason.value, error=refused.message[:300])


# How long the reader waits for its topic to appear before it raises MissingTopic: a topic created a moment
# before the reader starts (by the stage, or `rollout-stream topics create`) is in the cluster's metadata
# within a few seconds; a name with a typo never is.
TOPIC_WAIT_S = 10.0
# The least time between two `batch.waiting` log lines, which say what a batch that is not complete waits for.
WAITING_LOG_S = 5.0

# A reader's fetch size per partition, as large as a whole response (the clients' 16 MiB). The broker cuts a
# partition's data at this size, in the middle of a record batch, and the client drops the cut batch and
# fetches it again: with records of 2.3 MB (32K-token MoE samples with routing replay) the clients' 4 MiB per
# partition fetched 1.8 times the topic, 16 MiB 1.04 times (64 MiB: 1.02, with 64 MiB responses held at
# once; docs/benchmarks.md, "Bytes each rank fetches").
READER_FETCH_BYTES = 16 * 1024 * 1024

# How long the merge waits on a partition read to its end before it passes a group of another one (the
# idle rule in the module docstring). Ranks agree on the order as long as a record is readable within this
# long of its timestamp: the stage commits every 0.1 s. Paced, the last group of each batch waits this long,
# so it must also stay well under a training step (docs/reader.md, docs/pacing.md).
PARTITION_IDLE_MS = 500


# ---- the background thread: Kafka → assembler → merger → queue ----------------------------------
_Item = tuple[str, Any, Any]


class _CaughtUp:
    """Whether a partition is read to its end (read_committed: an open transaction keeps it behind)."""

    def __init__(self, consumer: AssignedConsumer, tps: dict[int, TopicPartition]) -> None:
        self.consumer, self.tps = consumer, tps
        self.known: dict[int, bool] = {}

    def __call__(self, partition: int) -> bool:
        if partition not in self.known:
            tp = self.tps[partition]
            high = self.consumer.highwater(tp)
            self.known[partition] = high is not None and self.consumer.fetch_position(tp) >= high
        return self.known[partition]


class _Prefetcher(threading.Thread):
    def __init__(self, reader: TrainDataReader) -> None:
        super().__init__(name=f"train-data-reader-{reader.rank}", daemon=True)
        self.r = reader
        self.stop = threading.Event()
        self.consumer: AssignedConsumer | None = None
        self.at_end: list[int] = []  # partitions read to their end at the last turn of the loop

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced in the trainer's thread by next_batch()
            self._put(("error", exc, None))
        finally:
            if self.consumer is not None:
                self.consumer.close()

    def _put(self, item: _Item) -> bool:
        while not self.stop.is_set():
            try:
                self.r._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _partitions(self) -> list[int]:
        """The topic's partitions; MissingTopic once the cluster says, TOPIC_WAIT_S in, that it has no such
        topic (a topic it only hides from this client, for want of an ACL, is waited for, and logged)."""
        waited = 0.0
        assert self.consumer is not None
        while not self.stop.is_set():
            parts = self.consumer.partitions_for_topic(self.r.commit_topic)
            if parts:
                return sorted(parts)
            if waited >= TOPIC_WAIT_S and missing_topics(self.r.conn, [self.r.commit_topic]):
                raise MissingTopic({self.r.commit_topic: ""}, self.r.conn.bootstrap_servers,
                                   f"the reader waited {TOPIC_WAIT_S:g}s for it; check the name for a typo, "
                                   "or create it (`rollout-stream topics create --output-topic NAME`)")
            if waited % 10 == 0:
                log_event(log, "topic.waiting", logging.WARNING, topic=self.r.commit_topic)
            time.sleep(0.5)
            waited += 0.5
        return []

    def _resume(self, partitions: list[int]) -> tuple[int | None, dict[int, Mark]]:
        """The commit of the rank with the lowest batch index (ranks realign after a crash mid-commit)."""
        r = self.r
        groups = [rank_group_id(r.group_id, i) for i in range(r.world_size)]
        tps = [TopicPartition(r.commit_topic, p) for p in partitions]
        admin = client_for(r.conn).admin(client_id=r.conn.client_id)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    found = admin.group_offsets(groups, tps)
                    break
                except KafkaFailure as exc:  # e.g. the coordinator of a fresh cluster is still being elected
                    if not exc.retriable or time.monotonic() > deadline or self.stop.is_set():
                        raise
                    time.sleep(0.5)
        finally:
            admin.close()
        resume = choose_resume([{tp.partition: om for tp, om in found.get(g, {}).items()} for g in groups])
        if resume.rank is None:
            return None, {}
        log_event(log, "reader.resume", topic=r.commit_topic, group=groups[resume.rank],
                  batch=-1 if resume.batch is None else resume.batch,
                  offsets=",".join(f"{p}:{m.offset}" for p, m in sorted(resume.marks.items())))
        return resume.batch, resume.marks

    def _head(self, partition: int, offset: int, timestamp_ms: int, value: bytes | None, marks: ReadMarks,
              memory: HeadMemory) -> AssembledGroup | None:
        """fetch="own": the group a head record describes (held until yielded), or None (undecodable, or a
        second head of a group already folded)."""
        stats = self.r.stats
        stats.records += 1
        stats.bytes += len(value or b"")
        try:
            if value is None:
                raise DecodeError("record has no value (tombstone)")
            head = decode_group_head(value)
        except DecodeError as exc:
            stats.decode_errors += 1
            marks.read(partition, offset, hold=False)
            log_event(log, "head.undecodable", logging.WARNING, partition=partition, offset=offset,
                      error=exc.message[:300])
            return None
        if head.partition != partition or head.topic != self.r.topic or not memory.first(partition, head):
            stats.duplicate_groups += head.partition == partition and head.topic == self.r.topic
            marks.read(partition, offset, hold=False)
            return None
        marks.read(partition, offset, hold=True)
        group = outline_group(head, timestamp_ms)
        self.r._heads[id(group)] = head
        return group

    def _run(self) -> None:
        r = self.r
        conn = replace(r.conn, client_id=f"rollout-stream-reader-{r.rank}")
        self.consumer = c = client_for(conn).assigned_consumer(
            client_id=conn.client_id, max_record_bytes=r.max_record_bytes,
            max_partition_fetch_bytes=READER_FETCH_BYTES)
        partitions = self._partitions()
        if not partitions:
            return
        batch, resume = self._resume(partitions) if r.start == "committed" else (None, {})
        tps = {p: TopicPartition(r.commit_topic, p) for p in partitions}
        c.assign(list(tps.values()))
        for p, tp in tps.items():
            if p in resume:
                c.seek(tp, resume[p].offset)
            elif r.start == "latest":
                c.seek_to_end([tp])
            else:
                c.seek_to_beginning([tp])
        marks = ReadMarks()
        for p, tp in tps.items():
            marks.start(p, c.position(tp), resume.get(p))
        if r.progress is not None:  # paced producers count again what was not committed before
            r.progress.resumed(0 if batch is None else batch + 1)
        self._put(("resumed", batch, None))
        assembler = GroupAssembler(marks, r.stats, max_open_chunk_bytes=r.max_open_chunk_bytes,
                                   chunk_timeout_s=r.chunk_timeout_s)
        merger = GroupMerger(partitions, r.partition_idle_ms)
        paused: set[int] = set()
        own = r.fetch == "own"
        memory = HeadMemory()
        head_offset: dict[int, int] = {}  # fetch="own": id(group) -> its head's offset (what commits hold)
        while not self.stop.is_set():
            # A group waiting on an empty partition leaves at its due time, not at the end of a 0.1 s poll;
            # once due, what it waits for is that partition's end, which a poll brings.
            due = merger.due_ms()
            wait = 0.1 if due is None else (due - time.time() * 1000) / 1000
            polled = c.poll(wait if 0 < wait < 0.1 else 0.1)
            for tp, records in polled.items():
                mark = resume.get(tp.partition)
                for rec in records:
                    if mark is not None and mark.skips(rec.offset):
                        marks.read(tp.partition, rec.offset, hold=False)  # yielded before the restart
                        continue
                    if own:
                        group = self._head(tp.partition, rec.offset, rec.timestamp, rec.value, marks, memory)
                        if group is not None:
                            head_offset[id(group)] = rec.offset
                            merger.push(group)
                        continue
                    group = assembler.accept(tp.partition, rec.offset, rec.timestamp, rec.value, rec.headers)
                    if group is not None:
                        merger.push(group)
            caught_up = _CaughtUp(c, tps)
            if assembler.chunks.open:
                assembler.expire_chunks(int(time.time() * 1000), caught_up)
            self.at_end = [p for p in partitions if caught_up(p)]  # said by the trainer's `batch.waiting`
            while (group := merger.pop(int(time.time() * 1000), caught_up)) is not None:
                marks.release(group.partition, [head_offset.pop(id(group))] if own else group.offsets)
                r.stats.groups += 1
                if not self._put(("group", group, marks.snapshot())):
                    return
            for p, tp in tps.items():  # bounded memory: stop fetching partitions far ahead of the merge
                pause = fetch_paused(merger.backlog(p), r._max_backlog, p in paused)
                if pause and p not in paused:
                    c.pause([tp])
                    paused.add(p)
                elif not pause and p in paused:
                    c.resume([tp])
                    paused.discard(p)


# ---- what the trainer gets ---------------------------------------------------------------------
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
    skipped_invalid: int  # cannot be collated or judged
    global_samples: int  # samples of the whole batch, over all ranks
    global_loss_tokens: int  # tokens with a non-zero loss mask in the whole batch (for DP loss normalization)
    # layout="miles": this rank's finished shard of the batch (rollout_stream.core.miles: train_data →
    # split_by_dp → trainer_shard), what a miles trainer rank receives in-process; `samples` are then its
    # rows.
    rollout_data: dict[str, Any] | None = None
    skipped_superseded: int = 0  # groups of a prompt another attempt of which trains (the fence)

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


class _WaitingLog:
    """`batch.waiting`, at most every WAITING_LOG_S while a batch is not complete: the groups held of those
    needed, and the partitions read to their end (all of them: the topic has no more groups for now)."""

    def __init__(self, reader: TrainDataReader, now: float) -> None:
        self.reader, self.started, self.next = reader, now, now + WAITING_LOG_S

    def timeout(self, remaining: float | None) -> float:
        """How long the next wait on the queue may last: until the next line is due, at the latest."""
        until_log = max(0.0, self.next - time.monotonic())
        return until_log if remaining is None else min(remaining, until_log)

    def due(self, now: float, good: int) -> bool:
        """Log the line if it is due (True: the wait goes on), else False (the caller's timeout passed)."""
        if now < self.next:
            return False
        r = self.reader
        log_event(log, "batch.waiting", topic=r.topic, batch=r._next_index or 0,
                  groups=f"{good}/{r.groups_per_batch}", held=len(r._buffer),
                  partitions_at_end=",".join(map(str, r._thread.at_end)) or "none",
                  waited_s=round(now - self.started))
        self.next = now + WAITING_LOG_S
        return True


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
    `max_open_chunk_bytes`: the bytes of chunked values held while incomplete (`ChunkLimitError` above
    it); `chunk_timeout_s`: when an incomplete one is dropped (`GroupAssembler` says what and why).
    `fence`: for groups of a prompt source (docs/loop.md), the rule that lets one attempt of a prompt train
    (`prompt_fence` builds it from the log at start); the others are skipped as superseded
    (`skipped_superseded`, logged `group.skipped_superseded`).
    `fetch`: "all" (read the whole topic) or "own" (fold the group heads of a stage run with
    `--write-heads` and fetch only this rank's rows by offset; docs/reader.md, "Rank-local fetch").
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
        partition_idle_ms: int | None = PARTITION_IDLE_MS,
        max_record_bytes: int = MAX_RECORD_BYTES,
        layout: Layout = "tensors",
        balance_data: bool = False,
        client: str | None = None,
        publish_progress: bool = True,
        max_open_chunk_bytes: int = MAX_OPEN_CHUNK_BYTES,
        chunk_timeout_s: float = CHUNK_TIMEOUT_S,
        fence: PromptFence | None = None,
        fetch: Fetch = "all",
    ) -> None:
        if fetch not in ("all", "own"):
            raise ValueError(f"fetch must be all or own, got {fetch!r}")
        if layout not in ("tensors", "miles"):
            raise ValueError(f"layout must be tensors or miles, got {layout!r}")
        if balance_data and layout != "miles":
            raise ValueError(
                "balance_data applies to layout='miles' (balance_tokens shards the tensor layout)"
            )
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
        if max_open_chunk_bytes < 1:
            raise ValueError(f"max_open_chunk_bytes must be >= 1, got {max_open_chunk_bytes}")
        if chunk_timeout_s <= 0:
            raise ValueError(f"chunk_timeout_s must be > 0, got {chunk_timeout_s}")
        # An address (with `security`, e.g. SecuritySettings.from_env()), or a Connection that carries both;
        # `client` picks the Kafka client library (default: $ROLLOUT_STREAM_CLIENT, else confluent).
        self.conn = (replace(bootstrap_servers, client_id=f"rollout-stream-reader-{rank}",
                             client=client or bootstrap_servers.client)
                     if isinstance(bootstrap_servers, Connection) else
                     Connection(bootstrap_servers, client_id=f"rollout-stream-reader-{rank}",
                                security=security or SecuritySettings(), client=client or default_client()))
        self.topic = topic
        self.fetch = fetch
        # fetch="own": groups, commits and resume come from the heads topic, payloads by offset from `topic`
        self.commit_topic = heads_topic(topic) if fetch == "own" else topic
        self._heads: dict[int, GroupHead] = {}  # id(outline group) -> its head, until its batch is taken
        self._fetcher: PayloadFetcher | None = None
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
        self.max_open_chunk_bytes = max_open_chunk_bytes
        self.chunk_timeout_s = chunk_timeout_s
        self.layout = layout
        self.balance_data = balance_data
        # one attempt of a prompt trains (docs/loop.md): a group the fence refuses is skipped as superseded
        self.fence = fence
        self._superseded: dict[str, str] = {}  # buffered groups the fence refused: key -> why
        self.stats = ReaderStats()
        self.weight_version: int | None = None
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=prefetch * groups_per_batch)
        self._max_backlog = max(16, 2 * prefetch * groups_per_batch)
        self._buffer: list[tuple[AssembledGroup, dict[int, Mark]]] = []
        self._next_index: int | None = None  # known once the background thread has resumed
        self._yielded: tuple[int, dict[int, Mark]] | None = None
        self._committed: tuple[int, dict[int, Mark]] | None = None
        self._committer: Any = None
        self._failed: ReaderError | MissingTopic | None = None
        self._waiting: _WaitingLog | None = None  # the batch being waited for, since when
        self._closed = False
        # Rank 0 tells paced producers where this trainer group is (docs/pacing.md): on each batch, each
        # set_weight_version and commit, and on a heartbeat.
        self.progress = (TrainerProgressPublisher(self.conn, progress_topic(topic), group_id,
                                                  groups_per_batch=groups_per_batch,
                                                  max_weight_staleness=max_weight_staleness,
                                                  admission_topic=admission_topic(topic))
                         if publish_progress and rank == 0 else None)
        self._thread = _Prefetcher(self)
        self._thread.start()

    # ---- iteration -----------------------------------------------------------------------------
    def set_weight_version(self, version: int) -> None:
        """The trainer's weight version: groups older than version - max_weight_staleness are skipped."""
        self.weight_version = int(version)
        if self.progress is not None:
            self.progress.weight_version(self.weight_version, self.stats.skipped_stale_groups)

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
        if good < len(verdicts) and self.progress is not None:  # a new version made buffered groups stale
            self._report_doomed(verdicts)
        # one wait per batch, across calls: a trainer polling with short timeouts is told too
        waiting = self._waiting = self._waiting or _WaitingLog(self, time.monotonic())
        while good < self.groups_per_batch:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                kind, value, snapshot = self._queue.get(timeout=waiting.timeout(remaining))
            except queue.Empty:
                if waiting.due(time.monotonic(), good):
                    continue
                return None
            if kind == "error":
                if isinstance(value, ReaderError | MissingTopic):  # typed failures: ChunkLimitError, ...
                    self._failed = value
                else:
                    self._failed = ReaderError(
                        f"reading {self.topic} failed: {type(value).__name__}: {value}")
                    self._failed.__cause__ = value
                raise self._failed
            if kind == "resumed":
                self._next_index = 0 if value is None else value + 1
                continue
            self._buffer.append((value, snapshot))
            verdicts.append(self._verdict(value))
            good += verdicts[-1] is None
            if verdicts[-1] is not None and self.progress is not None:
                self._report_doomed(verdicts)
        return self._batch(verdicts)

    def _report_doomed(self, verdicts: list[Verdict | None]) -> None:
        """Buffered groups that will be skipped stop counting for paced producers now (docs/pacing.md):
        otherwise they could hold back the fresh groups this batch is waiting for."""
        assert self.progress is not None
        self.progress.doomed(doomed_through([
            ([(s.source_topic, s.source_partition, s.source_offset) for s in g.samples], v is not None)
            for (g, _), v in zip(self._buffer, verdicts, strict=True)]),
            [g.key for (g, _), v in zip(self._buffer, verdicts, strict=True) if v is not None])

    def _verdict(self, group: AssembledGroup) -> Verdict | None:
        verdict = group_verdict(group, self.weight_version, self.max_weight_staleness)
        if verdict is None and self.fence is not None and not self.fence.admit(group.key):
            # another attempt of its prompt trains: skipped like an invalid group, reported apart
            self._superseded[group.key] = self.fence.refusal(group.key) or "superseded"
            return "invalid"
        self._superseded.pop(group.key, None)
        return verdict

    def _batch(self, verdicts: list[Verdict | None]) -> Batch:
        plan = plan_batch([g for g, _ in self._buffer], verdicts, groups_per_batch=self.groups_per_batch,
                          rank=self.rank, world_size=self.world_size, balance_tokens=self.balance_tokens)
        items, self._buffer = self._buffer[:plan.taken], self._buffer[plan.taken:]
        self._waiting = None
        if self.fence is not None:  # a group skipped after all gives its prompt's claim back
            training = {id(g) for g in plan.groups}
            for group, _ in items:
                if id(group) not in training:
                    self.fence.release(group.key)
        superseded = 0
        for group in plan.invalid:
            if (why := self._superseded.get(group.key)) is not None:
                superseded += 1  # the fence's: the prompt trains once, this copy is expected to be skipped
                log_event(log, "group.skipped_superseded", group=group.key, partition=group.partition,
                          offset=group.first_offset, problem=why)
                continue
            log_event(log, "group.skipped_invalid", logging.WARNING, group=group.key,
                      partition=group.partition, offset=group.first_offset,
                      problem=group.problem or group.version_problem)
        for group, _ in items:
            self._superseded.pop(group.key, None)
        mine = list(plan.samples)
        rollout_data = None
        if self.layout == "miles":
            mine, rollout_data = self._miles_shard(plan.groups)
        elif self.fetch == "own":
            mine = self._fetch_own(mine, plan.groups)
        for group, _ in items:
            self._heads.pop(id(group), None)
        index = self._next_index if self._next_index is not None else 0
        self._next_index = index + 1
        stale = [g for (g, _), v in zip(items, verdicts, strict=False) if v == "stale"]
        if stale:  # one line a batch: which groups its version bound left out, and how old they were
            log_event(log, "batch.skipped_stale", batch=index, groups=len(stale),
                      oldest_version=min(g.oldest_version for g in stale if g.oldest_version is not None),
                      newest_version=max(g.oldest_version for g in stale if g.oldest_version is not None),
                      weight_version=self.weight_version, max_weight_staleness=self.max_weight_staleness,
                      first=",".join(g.key for g in stale[:5]))
        batch = Batch(
            index=index, rank=self.rank, world_size=self.world_size, samples=mine,
            groups=[group_info(g) for g in plan.groups],
            tensors=collate(mine, pad_token_id=self.pad_token_id),
            skipped_stale=plan.skipped_stale, skipped_invalid=plan.skipped_invalid - superseded,
            global_samples=plan.global_samples, global_loss_tokens=plan.global_loss_tokens,
            rollout_data=rollout_data, skipped_superseded=superseded,
        )
        self._yielded = (index, items[-1][1])
        self.stats.batches += 1
        self.stats.skipped_stale_groups += batch.skipped_stale
        self.stats.skipped_invalid_groups += batch.skipped_invalid
        self.stats.skipped_superseded_groups += batch.skipped_superseded
        if self.progress is not None:
            self.progress.consumed([g for g, _ in items], plan.groups, index, self.weight_version,
                                   self.stats.skipped_stale_groups)
        return batch

    def _fetch_own(self, outlines: list[TrainSample], groups: Sequence[AssembledGroup]) -> list[TrainSample]:
        """This rank's rows of the batch, fetched by offset (only theirs) and checked against their heads."""
        if not outlines:
            return []
        if self._fetcher is None:
            conn = replace(self.conn, client_id=f"rollout-stream-reader-{self.rank}-own")
            self._fetcher = PayloadFetcher(conn, self.topic, self.max_record_bytes)
        before = self._fetcher.fetched_bytes
        try:
            return self._fetcher.samples(outlines, groups, self._heads)
        finally:
            self.stats.payload_bytes += self._fetcher.fetched_bytes - before

    def _miles_shard(self, groups: Sequence[AssembledGroup]) -> tuple[list[TrainSample], dict[str, Any]]:
        """This rank's rows and finished shard, as miles splits the batch's global sample list over DP ranks
        (strided, or Karmarkar–Karp on total lengths with `balance_data`; not whole rollouts per rank)."""
        from rollout_stream.core.miles import dp_rows, shard_of_rows, split_by_dp, train_data, trainer_shard

        everything = [s for g in groups for s in g.samples]
        sizes = [len(g.samples) for g in groups]
        if self.fetch == "own":  # outlines: whole-batch keys from them, this rank's rows fetched
            outline = train_data(everything, prompt_group_sizes=sizes)
            rows = dp_rows([len(t) for t in outline["tokens"]], self.world_size, self.rank,
                           balance_data=self.balance_data)
            mine = self._fetch_own([everything[row] for row in rows], groups)
            own = shard_of_rows(outline, train_data(mine) if mine else None, rows)
            return mine, trainer_shard(own)
        data = train_data(everything, prompt_group_sizes=sizes)
        shard = split_by_dp(data, self.world_size, balance_data=self.balance_data)[self.rank]
        return [everything[row] for row in shard["partition"]], trainer_shard(shard)

    # ---- commit / lifecycle --------------------------------------------------------------------
    @property
    def position(self) -> BatchPosition | None:
        """Where the last yielded batch ends, for `commit(position)` later (None before the first batch)."""
        return None if self._yielded is None else BatchPosition(*self._yielded)

    def commit(self, position: BatchPosition | None = None) -> bool:
        """Commit the position after the last yielded batch (this rank's group), or after the batch `position`
        was taken at: a trainer that consumes batches some time after reading them (a queue in between)
        commits only what it trained. False if nothing is new (`position` not past the last commit)."""
        if self._closed:
            raise ReaderError("the reader is closed")
        target = self._yielded if position is None else (position.index, position.marks)
        if target is None or target == self._committed:
            return False
        if self._committed is not None and target[0] <= self._committed[0]:
            return False  # never back: a later batch was committed already
        index, snapshot = target
        offsets = {}
        for p, mark in snapshot.items():
            meta, truncated = commit_metadata(mark, index)
            if truncated:  # too many interleaved offsets to list: re-read them on restart
                log_event(log, "commit.metadata_truncated", logging.WARNING, partition=p, keep=len(mark.keep))
            offsets[TopicPartition(self.commit_topic, p)] = Committed(mark.offset, meta)
        if self._committer is None:
            self._committer = client_for(self.conn).assigned_consumer(
                client_id=self.conn.client_id, max_record_bytes=self.max_record_bytes,
                commit_group=rank_group_id(self.group_id, self.rank))
        self._committer.commit(offsets)
        self._committed = target
        if self.progress is not None:
            self.progress.publish(committed_batch=index + 1)
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._thread.stop.set()
        self._thread.join(timeout=30)
        if self._committer is not None:
            self._committer.close()
        if self._fetcher is not None:
            self._fetcher.close()
        if self.progress is not None:
            self.progress.close()

    def __enter__(self) -> TrainDataReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

