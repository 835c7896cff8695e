"""`TrainDataReader`: the facade a trainer iterates, over a group source, a batch shape and a fetch thread.

It picks its parts once (rollout_stream.reader.sources by `fetch`, rollout_stream.reader.shapes by `layout`),
starts the fetch thread (rollout_stream.reader.fetch) and, in the trainer's thread, takes groups from its
queue until a batch is complete (rollout_stream.reader.batching), shapes and collates it, and commits
positions (rollout_stream.reader.position). docs/reader.md has the details.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Literal

from rollout_stream.clients import MAX_RECORD_BYTES, Connection, default_client
from rollout_stream.core.assembly import Verdict, group_info
from rollout_stream.core.collate import collate
from rollout_stream.core.prompt_keys import PromptFence
from rollout_stream.core.staleness import StalenessMode
from rollout_stream.core.world import World
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka import Client, client_for
from rollout_stream.names import admission_topic, progress_topic
from rollout_stream.pacing import TrainerProgressPublisher
from rollout_stream.reader.assembler import CHUNK_TIMEOUT_S, MAX_OPEN_CHUNK_BYTES
from rollout_stream.reader.batch import Batch
from rollout_stream.reader.batching import HeldGroups, WaitingLog
from rollout_stream.reader.errors import ReaderError
from rollout_stream.reader.fetch import Failed, FetchThread, Resumed
from rollout_stream.reader.position import BatchPosition, Committer
from rollout_stream.reader.shapes import Layout, batch_shape
from rollout_stream.reader.sources import Fetch, group_source
from rollout_stream.reader.stats import ReaderStats
from rollout_stream.security import SecuritySettings

__all__ = ["PARTITION_IDLE_MS", "Start", "TrainDataReader"]

Start = Literal["committed", "earliest", "latest"]

# How long the merge waits on a partition read to its end before it passes a group of another one (the
# idle rule, rollout_stream.reader.fetch). Ranks agree on the order as long as a record is readable within
# this long of its timestamp: the stage commits every 0.1 s. Paced, the last group of each batch waits this
# long, so it must also stay well under a training step (docs/reader.md, docs/pacing.md).
PARTITION_IDLE_MS = 500


class TrainDataReader:
    """Iterate whole prompt groups of a train-data topic as batches for one data-parallel rank.

    >>> with TrainDataReader("localhost:9092", "train-data", "trainer", groups_per_batch=8,
    ...                      rank=rank, world_size=world, max_weight_staleness=2) as reader:
    ...     for batch in reader:
    ...         step(batch.tokens, batch.loss_mask, batch.rewards, batch.rollout_log_probs)
    ...         reader.set_weight_version(step_count)
    ...         reader.commit()

    `bootstrap_servers`: an address (with `security`, e.g. SecuritySettings.from_env()), or a Connection that
    carries both. `topic`: the train-data topic. `group_id`: the trainer group; rank r commits to
    `<group_id>-rank<r>`. `groups_per_batch`: groups in a batch (all ranks'). `rank`, `world_size`: this
    data-parallel rank and their number; every rank gets the same batches and keeps its share.
    `max_weight_staleness`: groups older than the weight version minus this are skipped (None: never).
    `staleness`: the grain of that bound: "group" (a group with any sample past it is skipped whole),
    "rollout" (only the rollouts past it leave) or "token" (only the tokens generated past it leave the
    loss); the rewards stay the whole group's (rollout_stream.core.staleness; docs/reader.md, "Staleness
    grain").
    `prefetch`: batches' worth of groups queued ahead. `balance_tokens`: shard by tokens instead of by
    samples. `pad_token_id`: what pads `tokens`. `start`: "committed" (resume after the last committed
    batch, else from the beginning), "earliest" or "latest" (ignore commits). `idle_timeout_s`: iteration
    ends when no batch completes for that long (None: wait forever). `partition_idle_ms`: how long the merge
    waits on a partition read to its end (None: never pass an empty partition, fully deterministic even with
    unbounded producer delays, but an idle partition stalls). `max_record_bytes`: the largest record read.
    `layout`: "tensors" (plain tensors) or "miles" (also `batch.rollout_data`, the shard a miles trainer rank
    builds in-process; docs/miles.md); `balance_data`: miles' `--balance-data`, for `layout="miles"`.
    `client`: the Kafka client library, confluent or kafka-python (default: $ROLLOUT_STREAM_CLIENT, else
    confluent); `kafka_client`: the seam's client to use instead (tests: the in-memory cluster).
    `publish_progress`: rank 0 tells paced producers where the trainer group is (docs/pacing.md).
    `max_open_chunk_bytes`: the bytes of chunked values held while incomplete (`ChunkLimitError` above it);
    `chunk_timeout_s`: when an incomplete one is dropped (`GroupAssembler` says what and why). `fence`: for
    groups of a prompt source (docs/loop.md), the rule that lets one attempt of a prompt train (`prompt_fence`
    builds it from the log at start); the others are skipped as superseded (`skipped_superseded`, logged
    `group.skipped_superseded`). `fetch`: "all" (read the whole topic) or "own" (fold the group heads of a
    stage run with `--write-heads` and fetch only this rank's rows by offset; docs/reader.md, "Rank-local
    fetch"). `rescale`: these settings differ from the trainer group's on purpose: start a new world with them
    where every rank of the old one committed the same batch (every rank of the new world passes it; the
    default refuses a rank whose settings differ with `WorldMismatch`; docs/reader.md, "One world per trainer
    group").
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
        staleness: StalenessMode = "group",
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
        kafka_client: Client | None = None,
        publish_progress: bool = True,
        max_open_chunk_bytes: int = MAX_OPEN_CHUNK_BYTES,
        chunk_timeout_s: float = CHUNK_TIMEOUT_S,
        fence: PromptFence | None = None,
        fetch: Fetch = "all",
        rescale: bool = False,
    ) -> None:
        if fetch not in ("all", "own"):
            raise ValueError(f"fetch must be all or own, got {fetch!r}")
        if rescale and start != "committed":
            raise ValueError(f"rescale continues where the group committed: it needs start='committed', got "
                             f"{start!r}")
        self.shape = batch_shape(layout, rank=rank, world_size=world_size, balance_data=balance_data)
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
        client_id = f"rollout-stream-reader-{rank}"
        if isinstance(bootstrap_servers, Connection):
            self.conn = replace(bootstrap_servers, client_id=client_id,
                                client=client or bootstrap_servers.client)
        else:
            self.conn = Connection(bootstrap_servers, client_id=client_id,
                                   security=security or SecuritySettings(), client=client or default_client())
        self.client = kafka_client or client_for(self.conn)
        self.topic, self.group_id = topic, group_id
        self.groups_per_batch, self.rank, self.world_size = groups_per_batch, rank, world_size
        self.max_weight_staleness, self.pad_token_id = max_weight_staleness, pad_token_id
        self.idle_timeout_s = idle_timeout_s
        self.weight_version: int | None = None
        self.source = group_source(
            fetch, topic, self.client, client_id=client_id, max_record_bytes=max_record_bytes,
            max_open_chunk_bytes=max_open_chunk_bytes, chunk_timeout_s=chunk_timeout_s)
        self._held = HeldGroups(groups_per_batch=groups_per_batch, rank=rank, world_size=world_size,
                                balance_tokens=balance_tokens, max_weight_staleness=max_weight_staleness,
                                staleness=staleness,
                                fence=fence)
        self._stats = ReaderStats()  # what the trainer's thread counts (the fetch thread counts its own)
        self._next_index: int | None = None  # known once the fetch thread has resumed
        self._yielded: BatchPosition | None = None
        self._committer = Committer(self.client, client_id, self.source.read_topic, group_id, rank,
                                    max_record_bytes)
        self._failed: ReaderError | ConfigurationError | None = None
        self._waiting: WaitingLog | None = None  # the batch being waited for, since when
        self._closed = False
        # Rank 0 tells paced producers where this trainer group is (docs/pacing.md): on each batch, each
        # set_weight_version and commit, and on a heartbeat.
        self.progress = (TrainerProgressPublisher(self.conn, progress_topic(topic), group_id,
                                                  groups_per_batch=groups_per_batch,
                                                  max_weight_staleness=max_weight_staleness,
                                                  admission_topic=admission_topic(topic), client=self.client,
                                                  waits_for_every_partition=partition_idle_ms is None)
                         if publish_progress and rank == 0 else None)
        self._fetch = FetchThread(
            self.client, self.conn, self.source, group_id=group_id, rank=rank, rescale=rescale, start=start,
            world=World(world_size, groups_per_batch, balance_tokens, layout,
                        balance_data and layout == "miles", fetch, max_weight_staleness, staleness),
            partition_idle_ms=partition_idle_ms, max_record_bytes=max_record_bytes,
            max_backlog=max(16, 2 * prefetch * groups_per_batch), queue_size=prefetch * groups_per_batch,
            progress=self.progress)
        self._fetch.start()

    @property
    def stats(self) -> ReaderStats:
        """What the reader counted so far (a snapshot)."""
        return self._fetch.stats + self._stats

    # ---- iteration -----------------------------------------------------------------------------
    def set_weight_version(self, version: int) -> None:
        """The trainer's weight version: groups older than version - max_weight_staleness are skipped."""
        self.weight_version = int(version)
        if self.progress is not None:
            self.progress.weight_version(self.weight_version, self._stats.skipped_stale_groups)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        batch = self.next_batch(self.idle_timeout_s)
        if batch is None:
            raise StopIteration
        return batch

    def next_batch(self, timeout: float | None = None) -> Batch | None:
        """The next batch, or None if it did not complete within `timeout` seconds (its groups stay held).

        Staleness is judged when the batch completes, against the weight version set at that moment.
        """
        if self._closed:
            raise ReaderError("the reader is closed")
        if self._failed is not None:
            raise self._failed
        held = self._held
        deadline = None if timeout is None else time.monotonic() + timeout
        verdicts = [held.verdict(f.group, self.weight_version) for f in held.items]
        good = verdicts.count(None)
        if good < len(verdicts) and self.progress is not None:  # a new version made held groups stale
            self.progress.doomed(*held.doomed(verdicts))
        # one wait per batch, across calls: a trainer polling with short timeouts is told too
        waiting = self._waiting = self._waiting or WaitingLog(self.topic, time.monotonic())
        while good < self.groups_per_batch:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            try:
                item = self._fetch.items.get(timeout=waiting.timeout(remaining))
            except queue.Empty:
                if waiting.due(time.monotonic(), batch=self._next_index or 0, good=good,
                               needed=self.groups_per_batch, held=len(held.items), at_end=self._fetch.at_end,
                               uncovered=self._fetch.uncovered):
                    continue
                return None
            if isinstance(item, Failed):
                raise self._failure(item.error)
            if isinstance(item, Resumed):
                self._next_index = 0 if item.batch is None else item.batch + 1
                if held.fence is not None:  # the predecessor's batches before this one were committed
                    held.fence.resumed(self.group_id, self._next_index)
                self._committer.world = item.world
                continue
            held.items.append(item)
            verdicts.append(held.verdict(item.group, self.weight_version))
            good += verdicts[-1] is None
            if verdicts[-1] is not None and self.progress is not None:
                self.progress.doomed(*held.doomed(verdicts))
        return self._batch(verdicts)

    def _failure(self, error: BaseException) -> ReaderError | ConfigurationError:
        """The fetch thread's error, as next_batch raises it from now on."""
        if isinstance(error, ReaderError | ConfigurationError):  # typed: ChunkLimitError, MissingTopic, ...
            self._failed = error
        else:
            self._failed = ReaderError(f"reading {self.topic} failed: {type(error).__name__}: {error}")
            self._failed.__cause__ = error
        return self._failed

    def _batch(self, verdicts: list[Verdict | None]) -> Batch:
        plan, items, superseded, stale = self._held.take(verdicts, self.weight_version)
        self._waiting = None
        mine, rollout_data = self.shape.rows(plan, items, self.source, self._stats, stale.floor)
        index = self._next_index if self._next_index is not None else 0
        self._next_index = index + 1
        self._held.log_stale(index, items, verdicts, self.weight_version)
        batch = Batch(
            index=index, rank=self.rank, world_size=self.world_size, samples=mine,
            groups=[group_info(g) for g in plan.groups],
            tensors=collate(mine, pad_token_id=self.pad_token_id),
            skipped_stale=plan.skipped_stale, skipped_invalid=plan.skipped_invalid - superseded,
            global_samples=plan.global_samples, global_loss_tokens=plan.global_loss_tokens,
            rollout_data=rollout_data, skipped_superseded=superseded, stale_rollouts=stale.rollouts,
            stale_tokens=stale.tokens,
        )
        self._yielded = BatchPosition(index, items[-1].marks)
        stats = self._stats
        stats.batches += 1
        stats.skipped_stale_groups += batch.skipped_stale
        stats.skipped_invalid_groups += batch.skipped_invalid
        stats.skipped_superseded_groups += batch.skipped_superseded
        stats.stale_rollouts += stale.rollouts
        stats.stale_tokens += stale.tokens
        if self.progress is not None:
            self.progress.consumed([f.group for f in items], plan.groups, index, self.weight_version,
                                   stats.skipped_stale_groups, excluded=stale.by_group)
        self._fetch_ahead()
        return batch

    def _fetch_ahead(self) -> None:
        """With `fetch="own"`, have this rank's rows of the next batch fetched while the trainer trains this
        one: planned from the groups at hand as if each trained whole (staleness and the fence are judged when
        the batch completes; the rows that guess got wrong are fetched then)."""
        upcoming = self._held.items + self._fetch.queued()
        if not self.source.fetches_ahead(upcoming[:self.groups_per_batch]):
            return
        plan = self._held.likely_plan(upcoming)
        if plan is not None:
            self.source.ahead(self.shape.own(plan), upcoming[:plan.taken])

    # ---- commit / lifecycle --------------------------------------------------------------------
    @property
    def position(self) -> BatchPosition | None:
        """Where the last yielded batch ends, for `commit(position)` later (None before the first batch)."""
        return self._yielded

    def commit(self, position: BatchPosition | None = None) -> bool:
        """Commit the position after the last yielded batch (this rank's group), or after the batch `position`
        was taken at: a trainer that consumes batches some time after reading them (a queue in between)
        commits only what it trained. False if nothing is new (`position` not past the last commit)."""
        if self._closed:
            raise ReaderError("the reader is closed")
        target = self._yielded if position is None else position
        if target is None or not self._committer.commit(target):
            return False
        if self.progress is not None:
            self.progress.publish(committed_batch=target.index + 1)
        return True

    def close(self) -> None:
        """Stop the fetch thread and close every client (a closed reader raises ReaderError when used)."""
        if self._closed:
            return
        self._closed = True
        self._fetch.stop.set()
        self._fetch.join(timeout=30)
        self._committer.close()
        self.source.close()
        if self.progress is not None:
            self.progress.close()

    def __enter__(self) -> TrainDataReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

