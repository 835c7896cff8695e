"""The fetch thread: Kafka → the source's fold → the merge → a queue the trainer's thread reads.

The thread owns everything it touches while it runs (its consumer, the fold, the merge, the read marks and
its `stats`); it hands the trainer's thread a `Resumed` item once it knows where it starts, then one
`Fetched` item per group in global order, or a `Failed` item, and writes nothing of the reader's.

Global order: completed groups are merged across partitions by (timestamp of the record that completed the
group, its rollouts lineage, partition), each partition in its own offset order
(`core.assembly.GroupMerger`). The merge only picks a group when every other partition has a completed group
waiting, or has been read to its end and the group is older than `partition_idle_ms` (Kafka Streams'
`max.task.idle.ms` trade-off: an idle partition must not stall the stream forever). The sequence is a
function of the records, not of fetch timing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from rollout_stream.clients import Connection
from rollout_stream.core.assembly import GroupMerger, ReadMarks, fetch_paused
from rollout_stream.core.world import World
from rollout_stream.kafka import AssignedConsumer, Client, TopicPartition
from rollout_stream.kafka.topic_wait import wait_for_partitions
from rollout_stream.names import heads_topic
from rollout_stream.pacing import TrainerProgressPublisher
from rollout_stream.reader.coverage import CoverageWatch
from rollout_stream.reader.fetch_sizes import READER_FETCH_BYTES
from rollout_stream.reader.position import join_world, record_world, resume_point
from rollout_stream.reader.sources import Fetched, GroupSource
from rollout_stream.reader.stats import ReaderStats
from rollout_stream.topics import MissingTopic, missing_topics

__all__ = ["READER_FETCH_BYTES", "TOPIC_WAIT_S", "Failed", "FetchThread", "Item", "Resumed"]

log = logging.getLogger("rollout_stream.reader")

# How long the reader waits for its topic to appear before it raises MissingTopic: a topic created a moment
# before the reader starts (by the stage, or `rollout-stream topics create`) is in the cluster's metadata
# within a few seconds; a name with a typo never is.
TOPIC_WAIT_S = 10.0


@dataclass(frozen=True)
class Resumed:
    """Where the thread starts: after batch `batch` (None: no batch was committed before), in `world` (the
    settings and generation every commit of this rank records)."""

    batch: int | None
    world: World


@dataclass(frozen=True)
class Failed:
    """The thread ended on `error`, to be raised in the trainer's thread."""

    error: BaseException


Item = Resumed | Fetched | Failed


class _CaughtUp:
    """Whether a partition is read to its end (read_committed: an open transaction keeps it behind) and not
    `holding` (a partition the coverage watch holds back is not at its end: the merge waits for it)."""

    def __init__(self, consumer: AssignedConsumer, tps: dict[int, TopicPartition],
                 holding: Callable[[int], bool]) -> None:
        self.consumer, self.tps, self.holding = consumer, tps, holding
        self.known: dict[int, bool] = {}

    def read_to_end(self, partition: int) -> bool:
        if partition not in self.known:
            tp = self.tps[partition]
            high = self.consumer.highwater(tp)
            self.known[partition] = high is not None and self.consumer.fetch_position(tp) >= high
        return self.known[partition]

    def __call__(self, partition: int) -> bool:
        return self.read_to_end(partition) and not self.holding(partition)


class FetchThread(threading.Thread):
    """Reads the source's topic (every partition, assigned by hand, read_committed) and queues its groups.

    `client`, `conn`: the seam's client and the connection it was made for (its client id, its address for
    messages). `source`: the group source. `group_id`, `rank`: the trainer group whose commits it resumes
    from; `world`: this rank's settings, checked against the group's (`rescale`: start a new generation with
    them; rollout_stream.reader.position.join_world). `start`: "committed", "earliest" or "latest".
    `partition_idle_ms`: the merge's idle rule (None: never pass an empty partition). `max_record_bytes`: the
    largest record accepted. `max_backlog`: merged-but-unqueued groups of one partition at which its fetching
    pauses. `queue_size`: the queue's bound. `progress`: rank 0's progress publisher, told where the thread
    resumed (it is thread-safe).
    """

    def __init__(self, client: Client, conn: Connection, source: GroupSource, *, group_id: str, rank: int,
                 world: World, rescale: bool, start: str, partition_idle_ms: int | None,
                 max_record_bytes: int, max_backlog: int, queue_size: int,
                 progress: TrainerProgressPublisher | None) -> None:
        super().__init__(name=f"train-data-reader-{rank}", daemon=True)
        self.client, self.conn, self.source = client, conn, source
        self.group_id, self.rank, self.world, self.rescale = group_id, rank, world, rescale
        self.start_at = start
        self.partition_idle_ms, self.max_record_bytes = partition_idle_ms, max_record_bytes
        self.max_backlog, self.progress = max_backlog, progress
        self.items: queue.Queue[Item] = queue.Queue(maxsize=queue_size)
        self.stop = threading.Event()
        self.stats = ReaderStats()  # what the fetch counts; written by this thread only
        self.at_end: tuple[int, ...] = ()  # partitions read to their end at the last turn of the loop
        self.uncovered = ""  # train-data records no head covers, held (`fetch="own"`; CoverageWatch.describe)
        self._consumer: AssignedConsumer | None = None
        self._watch: CoverageWatch | None = None

    def queued(self) -> list[Fetched]:
        """The groups in the queue now, in order (a snapshot; the queue is not changed)."""
        with self.items.mutex:
            return [item for item in self.items.queue if isinstance(item, Fetched)]

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced in the trainer's thread by next_batch()
            self._put(Failed(exc))
        finally:
            if self._consumer is not None:
                self._consumer.close()
            if self._watch is not None:
                self._watch.close()

    def _put(self, item: Item) -> bool:
        while not self.stop.is_set():
            try:
                self.items.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _missing(self, waited_s: float) -> None:
        """MissingTopic once the cluster says, TOPIC_WAIT_S in, that it has no such topic (a topic it only
        hides from this client, for want of an ACL, is waited for, and logged)."""
        topic = self.source.read_topic
        if waited_s >= TOPIC_WAIT_S and missing_topics(self.conn, [topic], self.client):
            raise MissingTopic({topic: ""}, self.conn.bootstrap_servers,
                               f"the reader waited {TOPIC_WAIT_S:g}s for it; check the name for a typo, "
                               "or create it (`rollout-stream topics create --output-topic NAME`)")

    def _other_topic(self) -> dict[str, list[int]]:
        """The topic a reader of the other `fetch` commits on, with its partitions, if it exists: a rank that
        reads train-data sees a world that folds its heads, and the other way round."""
        source = self.source
        other = heads_topic(source.topic) if source.read_topic == source.topic else source.topic
        admin = self.client.admin(client_id=self.conn.client_id)
        try:
            (info,) = admin.describe_topics([other])
        finally:
            admin.close()
        return {} if not info.partitions else {other: list(range(info.partitions))}

    def _run(self) -> None:
        topic = self.source.read_topic
        self._consumer = c = self.client.assigned_consumer(
            client_id=self.conn.client_id, max_record_bytes=self.max_record_bytes,
            max_partition_fetch_bytes=READER_FETCH_BYTES)
        partitions = wait_for_partitions(c.partitions_for_topic, topic, self.stop, log, give_up=self._missing)
        if not partitions:
            return
        resuming = self.start_at == "committed"
        joined = join_world(self.client, self.conn.client_id, self.group_id, self.rank, self.world,
                            {topic: sorted(partitions), **self._other_topic()}, topic,
                            rescale=self.rescale, resume=resuming, stop=self.stop)
        if joined is None:
            return
        batch, resume = (resume_point(self.client, self.conn.client_id, topic, self.group_id,
                                      joined.resume_from, partitions, self.stop)
                         if resuming else (None, {}))
        tps = {p: TopicPartition(topic, p) for p in partitions}
        watch = self._watch = self.source.coverage()
        # asked before the fetching starts: an offset query waits behind the connection's fetch, which the
        # broker holds for fetch.wait.max.ms at a partition's end (3 partitions: 0.3 s before the first batch)
        begin = c.beginning_offsets(list(tps.values())) if watch is not None else {}
        c.assign(list(tps.values()))
        for p, tp in tps.items():
            if p in resume:
                c.seek(tp, resume[p].offset)
            elif self.start_at == "latest":
                c.seek_to_end([tp])
            else:
                c.seek_to_beginning([tp])
        marks = ReadMarks()
        for p, tp in tps.items():
            marks.start(p, c.position(tp), resume.get(p))
        if joined.record:  # before any batch: the other ranks wait for it to check their settings
            record_world(self.client, self.conn.client_id, topic, self.group_id, joined.world, batch,
                         marks.snapshot(), self.max_record_bytes)
        if self.progress is not None:  # paced producers count again what was not committed before
            self.progress.resumed(0 if batch is None else batch + 1)
        self._put(Resumed(batch, joined.world))
        fold = self.source.fold(marks, self.stats)
        merger = GroupMerger(partitions, self.partition_idle_ms)
        paused: set[int] = set()  # by back-pressure
        held: set[int] = set()  # by the coverage watch: read again from where it held them, once released
        if watch is not None:
            watch.start({p: c.position(tp) for p, tp in tps.items()}, {p: begin[tp] for p, tp in tps.items()})

        def holding(p: int) -> bool:
            return p in held or (watch is not None and watch.holding(p))
        while not self.stop.is_set():
            # A group waiting on an empty partition leaves at its due time, not at the end of a 0.1 s poll;
            # once due, what it waits for is that partition's end, which a poll brings.
            due = merger.due_ms()
            wait = 0.1 if due is None else (due - time.time() * 1000) / 1000
            polled = c.poll(wait if 0 < wait < 0.1 else 0.1, max_records=self.source.poll_records)
            for tp, records in polled.items():
                if tp.partition in held:
                    continue  # polled before the pause: read again once released
                mark = resume.get(tp.partition)
                for rec in records:
                    if mark is not None and mark.skips(rec.offset):
                        marks.read(tp.partition, rec.offset, hold=False)  # yielded before the restart
                        if watch is not None:
                            watch.passed(tp.partition, rec.offset, rec.value)
                        continue
                    if watch is not None and not watch.admits(tp.partition, rec.offset, rec.value):
                        c.seek(tps[tp.partition], rec.offset)
                        c.pause([tps[tp.partition]])
                        held.add(tp.partition)
                        break
                    group = fold.accept(tp.partition, rec.offset, rec.timestamp, rec.value, rec.headers)
                    if group is not None:
                        merger.push(group)
            caught_up = _CaughtUp(c, tps, holding)
            fold.expire(int(time.time() * 1000), caught_up)
            if watch is not None:
                for p in watch.check({p: caught_up.read_to_end(p) for p in partitions},
                                     {p: c.highwater(tp) for p, tp in tps.items()}):
                    held.discard(p)
                    if p not in paused:
                        c.resume([tps[p]])
                self.uncovered = watch.describe()
            self.at_end = tuple(p for p in partitions if caught_up(p))  # said by `batch.waiting`
            while (group := merger.pop(int(time.time() * 1000), caught_up)) is not None:
                offsets, head = fold.taken(group)
                marks.release(group.partition, offsets)
                self.stats.groups += 1
                if not self._put(Fetched(group, marks.snapshot(), head)):
                    return
            for p, tp in tps.items():  # bounded memory: stop fetching partitions far ahead of the merge
                pause = fetch_paused(merger.backlog(p), self.max_backlog, p in paused)
                if pause and p not in paused:
                    c.pause([tp])
                    paused.add(p)
                elif not pause and p in paused:
                    if p not in held:
                        c.resume([tp])
                    paused.discard(p)
