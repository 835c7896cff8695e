"""Resume and commit: which world a rank joins, where it starts, and what it commits after a batch.

Rank r commits to its own consumer group `<group_id>-rank<r>`: per partition the lowest offset not yet
yielded, plus metadata (batch index, read end, the offsets above it still to yield; `core.assembly.Mark`),
and the world it trains in (`core.world.World`: the settings every rank must share, and its generation).
On start every rank reads the commits of ranks 0..world_size-1 of its world's generation and resumes from the
one with the lowest batch index (`core.assembly.choose_resume`), so ranks that crashed between commits
realign on the same batch.

Before that a rank joins the world (`join_world`): rank 0's commit says what the group's world is. A rank
whose settings differ refuses to start (`WorldMismatch`); rank 0 of a new group records its world before its
first batch (`record_world`), and the other ranks wait for it, so no rank trains before it knows. A rescale
(`rescale=True`) starts a new generation, at a batch every rank of the old world committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from rollout_stream.core.assembly import MAX_COMMIT_METADATA, Mark, choose_resume, commit_metadata
from rollout_stream.core.world import World, committed_batches, newest_world, of_generation
from rollout_stream.kafka import AssignedConsumer, Client, Committed, TopicPartition
from rollout_stream.logs import log_event
from rollout_stream.names import rank_group_id
from rollout_stream.reader.errors import WorldMismatch
from rollout_stream.retry import retrying

__all__ = ["RESUME_RETRY_S", "WORLD_WAIT_LOG_S", "BatchPosition", "Committer", "JoinedWorld", "join_world",
           "record_world", "resume_point"]

log = logging.getLogger("rollout_stream.reader")

# How long the commits of the ranks are asked for again while the cluster answers with retriable errors (the
# group coordinator of a fresh cluster still being elected).
RESUME_RETRY_S = 60.0

# How often a rank that waits for rank 0 to record the world asks again, and says so in the log.
WORLD_POLL_S = 0.5
WORLD_WAIT_LOG_S = 5.0

RankCommits = dict[int, tuple[int | None, str | None]]  # partition -> (offset, metadata), one rank's commit


@dataclass(frozen=True)
class BatchPosition:
    """Where a yielded batch ends (`TrainDataReader.position`): `index`, the batch's index, and `marks`, per
    partition the read mark a commit after it writes."""

    index: int
    marks: dict[int, Mark]


def _commits(client: Client, client_id: str, groups: Sequence[str], tps: Sequence[TopicPartition],
             stop: threading.Event | None) -> dict[str, dict[TopicPartition, tuple[int, str]]]:
    admin = client.admin(client_id=client_id)
    try:
        return retrying(lambda: admin.group_offsets(groups, tps), within_s=RESUME_RETRY_S, stop=stop)
    finally:
        admin.close()


def _by_partition(found: dict[TopicPartition, tuple[int, str]], topic: str) -> RankCommits:
    return {tp.partition: om for tp, om in found.items() if tp.topic == topic}


@dataclass(frozen=True)
class JoinedWorld:
    """The world a rank trains in (`world`, with its generation); `record`: rank 0 records it before its first
    batch; `resume_from`: the world whose commits say where to start (the old one, when rank 0 rescales)."""

    world: World
    record: bool
    resume_from: World


def _refusal(group_id: str, rank: int, mine: World, committed: World, rescale: bool) -> WorldMismatch:
    differ = "; ".join(f"{name} is {here} here but {there} in the group" for name, here, there
                       in mine.differences(committed))
    if rescale and committed.fetch != mine.fetch:
        advice = ("fetch cannot change in a rescale (its commits are on another topic): start the ranks with "
                  f"fetch={committed.fetch!r}, or train under a new group_id")
    else:
        advice = ("start every rank with the group's settings, or rescale it at a batch boundary "
                  "(TrainDataReader(rescale=True) on every rank of the new world; docs/reader.md)")
    return WorldMismatch(f"rank {rank} of trainer group {group_id} disagrees with the world its ranks "
                         f"committed (generation {committed.generation}): {differ}; {advice}")


def _decide(group_id: str, mine: World, committed: World | None, *, rank: int, rescale: bool, resume: bool
            ) -> JoinedWorld | None:
    """What a rank does given the world rank 0 committed: join it, record its own, or wait (None) for rank 0.
    Raises WorldMismatch when the settings differ and no rescale can start."""
    if committed is None:
        if resume and rank > 0:
            return None  # rank 0 records the world of a new group: wait for it, never guess
        world = replace(mine, generation=0)
        return JoinedWorld(world, resume and rank == 0, world)
    if committed.same_settings(mine):
        world = replace(mine, generation=committed.generation)
        return JoinedWorld(world, False, world)
    if not rescale or committed.fetch != mine.fetch:
        raise _refusal(group_id, rank, mine, committed, rescale)
    if rank > 0:
        return None  # rank 0 starts the new generation: wait for it
    return JoinedWorld(replace(mine, generation=committed.generation + 1), True, committed)


def join_world(client: Client, client_id: str, group_id: str, rank: int, mine: World,
               partitions: dict[str, Sequence[int]], read_topic: str, *, rescale: bool, resume: bool,
               stop: threading.Event | None = None) -> JoinedWorld | None:
    """The world rank `rank` of trainer group `group_id` trains in, from rank 0's commits on the topics of
    `partitions` (the topic commits are on, `read_topic`, and the other one a reader of the other `fetch`
    commits on, if it exists). A rank other than 0 waits (logged `world.waiting`) until rank 0 has recorded
    the world (`resume`: start="committed") or the rescaled one (`rescale`). None: `stop` was set.

    Raises WorldMismatch when this rank's settings differ from the committed world's (naming each setting
    and both values), or when rank 0 rescales a world whose ranks are not at one batch boundary."""
    group0 = rank_group_id(group_id, 0)
    tps = [TopicPartition(t, p) for t, ps in partitions.items() for p in ps]
    started = time.monotonic()
    logged = started
    first: World | None = None
    while stop is None or not stop.is_set():
        found = _commits(client, client_id, [group0], tps, stop).get(group0, {})
        worlds = [w for t in partitions if (w := newest_world(_by_partition(found, t))) is not None]
        committed = max(worlds, key=lambda w: w.generation, default=None)
        first = first or committed
        joined = _decide(group_id, mine, committed, rank=rank, rescale=rescale, resume=resume)
        if joined is None and committed is not None and first is not None \
                and committed.generation > first.generation:
            raise _refusal(group_id, rank, mine, committed, rescale)  # rank 0 started another world
        if joined is not None:
            if joined.resume_from.generation != joined.world.generation:  # rank 0 rescales
                _check_boundary(client, client_id, group_id, joined.resume_from, read_topic,
                                partitions[read_topic], stop)
            return joined
        now = time.monotonic()
        if now - logged >= WORLD_WAIT_LOG_S:
            logged = now
            log_event(log, "world.waiting", group=group_id, rank=rank, waited_s=round(now - started),
                      why="rank 0 has not recorded the world yet" if committed is None
                      else f"rank 0 has not rescaled from world_size={committed.world_size} "
                           f"generation {committed.generation} yet")
        if stop is not None:
            stop.wait(WORLD_POLL_S)
        else:
            time.sleep(WORLD_POLL_S)
    return None


def _check_boundary(client: Client, client_id: str, group_id: str, old: World, topic: str,
                    partitions: Sequence[int], stop: threading.Event | None) -> None:
    """A rescale starts where every rank of the old world committed the same batch: else WorldMismatch."""
    groups = [rank_group_id(group_id, i) for i in range(old.world_size)]
    found = _commits(client, client_id, groups, [TopicPartition(topic, p) for p in partitions], stop)
    batches = committed_batches([of_generation(_by_partition(found.get(g, {}), topic), old.generation)
                                 for g in groups])
    if len(set(batches)) > 1:
        at = ", ".join(f"rank {i} {'none' if b is None else b}" for i, b in enumerate(batches))
        raise WorldMismatch(
            f"cannot rescale trainer group {group_id} now: the ranks of its world (world_size="
            f"{old.world_size}) did not all commit the same batch (last committed: {at}); run that world "
            "until every rank has committed the same batch, then rescale")


def resume_point(client: Client, client_id: str, topic: str, group_id: str, world: World,
                 partitions: Sequence[int], stop: threading.Event | None = None
                 ) -> tuple[int | None, dict[int, Mark]]:
    """The last batch committed and the marks to resume from: the commit of the rank with the lowest batch
    index of trainer group `group_id` on `topic`, among ranks 0..world_size-1 of `world`'s generation (None
    and no marks: no rank has committed)."""
    groups = [rank_group_id(group_id, i) for i in range(world.world_size)]
    found = _commits(client, client_id, groups, [TopicPartition(topic, p) for p in partitions], stop)
    resume = choose_resume([of_generation(_by_partition(found.get(g, {}), topic), world.generation)
                            for g in groups])
    if resume.rank is None:
        return None, {}
    log_event(log, "reader.resume", topic=topic, group=groups[resume.rank],
              batch=-1 if resume.batch is None else resume.batch, generation=world.generation,
              offsets=",".join(f"{p}:{m.offset}" for p, m in sorted(resume.marks.items())))
    return resume.batch, resume.marks


def record_world(client: Client, client_id: str, topic: str, group_id: str, world: World, batch: int | None,
                 marks: dict[int, Mark], max_record_bytes: int) -> None:
    """Rank 0 records the world before its first batch: it commits where it starts (after `batch`; None:
    before the first) with `world`, which the other ranks wait for and check their settings against."""
    committer = Committer(client, client_id, topic, group_id, 0, max_record_bytes, world)
    try:
        committer.commit(BatchPosition(-1 if batch is None else batch, marks))
    finally:
        committer.close()
    log_event(log, "world.recorded", group=group_id, world=world.text())


class Committer:
    """Commits the batch positions of rank `rank` of trainer group `group_id` on `topic`, to the rank's
    consumer group (`<group_id>-rank<rank>`), never backwards, each with `world` (set once the rank has joined
    it); its consumer (made with `client`, `client_id`, `max_record_bytes`) on the first commit."""

    def __init__(self, client: Client, client_id: str, topic: str, group_id: str, rank: int,
                 max_record_bytes: int, world: World | None = None) -> None:
        self.client, self.client_id, self.topic = client, client_id, topic
        self.group = rank_group_id(group_id, rank)
        self.max_record_bytes = max_record_bytes
        self.world = world
        self.committed: BatchPosition | None = None
        self._consumer: AssignedConsumer | None = None

    def commit(self, position: BatchPosition) -> bool:
        """Commit `position`; False if it is not past the last commit."""
        if position == self.committed:
            return False
        if self.committed is not None and position.index <= self.committed.index:
            return False  # never back: a later batch was committed already
        offsets = {}
        world = "" if self.world is None else " " + self.world.text()
        for p, mark in position.marks.items():
            meta, truncated = commit_metadata(mark, position.index, MAX_COMMIT_METADATA - len(world))
            if truncated:  # too many interleaved offsets to list: re-read them on restart
                log_event(log, "commit.metadata_truncated", logging.WARNING, partition=p, keep=len(mark.keep))
            offsets[TopicPartition(self.topic, p)] = Committed(mark.offset, meta + world)
        if self._consumer is None:
            self._consumer = self.client.assigned_consumer(
                client_id=self.client_id, max_record_bytes=self.max_record_bytes, commit_group=self.group)
        self._consumer.commit(offsets)
        self.committed = position
        return True

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
