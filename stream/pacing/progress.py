"""The progress topic: each party writes its latest record (`ProgressWriter`), anyone reads them all
(`ProgressBoard`). One small compacted topic per train-data topic (`rollout_stream.names.progress_topic`).

Why a compacted topic rather than the reader's commit metadata: producers would have to ask the group
coordinator for every rank's offsets (an admin request per check, and ACLs on the trainer's groups), and
commit metadata has no room for several parties (paced producers, workers). A compacted topic is read by
one assigned consumer that stays at its end, so a producer learns of the trainer's progress within a poll
(~100 ms) at no cost per admission, and a new reader of it gets every party's state from a few records.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import msgspec

from rollout_stream.clients import Connection
from rollout_stream.codec.progress import (
    ProducerProgress,
    Progress,
    StageProgress,
    TrainerProgress,
    decode_progress,
    encode_progress,
    progress_key,
)
from rollout_stream.kafka import Client, KafkaFailure, TopicExists, TopicPartition, TopicSpec, client_for
from rollout_stream.logs import log_event
from rollout_stream.topics import replication_for

__all__ = ["ProgressBoard", "ProgressWriter", "ensure_progress_topic", "now_ms"]

log = logging.getLogger("rollout_stream.pacing")

# Compaction keeps the topic at about one record per party: segments roll every minute so the cleaner can
# reach them, and it cleans as soon as a tenth of the log is superseded.
PROGRESS_TOPIC_CONFIGS = {
    "cleanup.policy": "compact",
    "segment.ms": "60000",
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": "3600000",
    "max.message.bytes": str(1 << 20),
}


def now_ms() -> int:
    return int(time.time() * 1000)


def ensure_progress_topic(conn: Connection, topic: str, client: Client | None = None, *,
                          replication_factor: int | None = None,
                          min_insync_replicas: int | None = None) -> bool:
    """Create the compacted progress topic if it is missing (True: created now), replicated like the stage's
    other topics (`rollout_stream.topics.replication_for`: by default the smaller of 3 and the brokers)."""
    admin = (client or client_for(conn)).admin(client_id=conn.client_id)
    try:
        if topic in admin.list_topics():
            return False
        replication = replication_for(admin, replication_factor, min_insync_replicas)
        spec = TopicSpec(topic, 1, replication.factor, {**PROGRESS_TOPIC_CONFIGS, **replication.configs()})
        error = admin.create_topics([spec])[topic]
        if error is not None and not isinstance(error, TopicExists):
            raise error
        return error is None
    finally:
        admin.close()


class ProgressWriter:
    """Writes one party's latest record; re-sends it every `heartbeat_s` so readers can tell it is alive."""

    def __init__(self, conn: Connection, topic: str, *, heartbeat_s: float = 5.0,
                 client: Client | None = None, refresh: Callable[[], Progress] | None = None) -> None:
        """`client`: the Kafka client to use (default: the connection's; the worker passes its own);
        `refresh`: the party's current record, for heartbeats (default: the last one published, re-dated)."""
        self.conn, self.topic, self.heartbeat_s, self.refresh = conn, topic, heartbeat_s, refresh
        client = client or client_for(conn)
        ensure_progress_topic(conn, topic, client)
        self._producer = client.producer(client_id=f"{conn.client_id}-progress",
                                                   max_record_bytes=1 << 20)
        self._lock = threading.Lock()
        self._latest: Progress | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="progress-heartbeat", daemon=True)
        self._thread.start()

    def publish(self, record: Progress) -> None:
        with self._lock:
            self._latest = record
            self._producer.send(self.topic, encode_progress(record), progress_key(record))

    def retire(self, record: Progress) -> None:
        """A tombstone for this party (a producer that closed): readers forget it."""
        with self._lock:
            self._latest = None
            self._producer.send(self.topic, None, progress_key(record))

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            fresh = self.refresh() if self.refresh is not None and self._latest is not None else None
            with self._lock:
                if self._latest is None:
                    continue
                self._latest = fresh or msgspec.structs.replace(self._latest, updated_ms=now_ms())
                try:
                    self._producer.send(self.topic, encode_progress(self._latest), progress_key(self._latest))
                except Exception as exc:  # a heartbeat lost is harmless; the next one may pass
                    log_event(log, "progress.heartbeat_failed", logging.WARNING,
                              error=f"{type(exc).__name__}: {exc}")

    def close(self, timeout: float | None = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            try:
                self._producer.flush(timeout=timeout)
            finally:
                self._producer.close(timeout=timeout)


class ProgressBoard:
    """The newest record of every party on the progress topic, kept current by a background thread.

    Waits for the topic when it does not exist yet (the first trainer creates it). `wait_for_change`
    blocks until a record arrives; `wait_caught_up` until everything written before the board started
    has been read.
    """

    def __init__(self, conn: Connection, topic: str, *, poll_s: float = 0.05,
                 client: Client | None = None) -> None:
        self.conn, self.topic, self.poll_s = conn, topic, poll_s
        self.client = client or client_for(conn)
        self._records: dict[bytes, Progress] = {}
        self._changed = threading.Condition()
        self._updates = 0
        self._caught_up = threading.Event()
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="progress-board", daemon=True)
        self._thread.start()

    # ---- what it knows ---------------------------------------------------------------------------
    def trainer(self, group_id: str) -> TrainerProgress | None:
        found = self._records.get(f"trainer/{group_id}".encode())
        return found if isinstance(found, TrainerProgress) else None

    def trainers(self) -> list[TrainerProgress]:
        return sorted((r for r in list(self._records.values()) if isinstance(r, TrainerProgress)),
                      key=lambda r: r.group_id)

    def producers(self) -> list[ProducerProgress]:
        return sorted((r for r in list(self._records.values()) if isinstance(r, ProducerProgress)),
                      key=lambda r: r.producer_id)

    def stages(self) -> list[StageProgress]:
        return sorted((r for r in list(self._records.values()) if isinstance(r, StageProgress)),
                      key=lambda r: (r.group_id, r.instance_id))

    @property
    def updates(self) -> int:
        return self._updates

    def wait_for_change(self, seen: int, timeout: float) -> int:
        """Block until more than `seen` records were read, or `timeout` s; the count now."""
        with self._changed:
            self._changed.wait_for(lambda: self._updates > seen or self._stop.is_set(), timeout=timeout)
            return self._updates

    def wait_caught_up(self, timeout: float) -> bool:
        return self._caught_up.wait(timeout)

    # ---- the background reader -------------------------------------------------------------------
    def _run(self) -> None:
        """Read the topic; a Kafka failure (a timeout on a loaded broker, a leader moving) costs a fresh
        consumer a second later, never the board: the records read so far stay, and re-reading from the
        beginning only replaces them with the same or newer ones."""
        try:
            while not self._stop.is_set():
                try:
                    self._read()
                except KafkaFailure as exc:
                    log_event(log, "progress.read_failed", logging.WARNING, topic=self.topic,
                              error=f"{type(exc).__name__}: {exc}", action="reading again in 1 s")
                    self._stop.wait(1.0)
        except BaseException as exc:  # not Kafka's: surfaced by whoever waits on the board
            self.error = exc
            log_event(log, "progress.board_failed", logging.ERROR, topic=self.topic,
                      error=f"{type(exc).__name__}: {exc}")
        finally:
            with self._changed:
                self._changed.notify_all()

    def _read(self) -> None:
        consumer = self.client.assigned_consumer(client_id=f"{self.conn.client_id}-progress",
                                                 max_record_bytes=1 << 20)
        try:
            parts: set[int] | None = None
            while not self._stop.is_set():
                parts = consumer.partitions_for_topic(self.topic)
                if parts:
                    break
                self._stop.wait(0.5)  # not created yet: the first trainer or `topics create` makes it
            if not parts:
                return
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            consumer.assign(tps)
            consumer.seek_to_beginning(tps)
            ends = consumer.end_offsets(tps)
            while not self._stop.is_set():
                polled = consumer.poll(self.poll_s)
                got = 0
                for records in polled.values():
                    for rec in records:
                        got += self._take(rec.key, rec.value)
                if got:
                    with self._changed:
                        self._updates += got
                        self._changed.notify_all()
                if not self._caught_up.is_set() and all(consumer.position(tp) >= ends[tp] for tp in tps):
                    self._caught_up.set()
        finally:
            consumer.close()

    def _take(self, key: bytes | None, value: bytes | None) -> int:
        if key is None:
            return 0
        if value is None:
            self._records.pop(key, None)
            return 1
        try:
            self._records[key] = decode_progress(value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log_event(log, "progress.undecodable", logging.WARNING, key=key.decode(errors="replace"),
                      error=str(exc)[:200])
            return 0
        return 1

    def close(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=10)
