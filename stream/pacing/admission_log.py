"""The admission log on Kafka: one partition per train-data topic (`rollout_stream.names.admission_topic`).

`AdmissionWriter` appends records; `AdmissionFollower` reads the log from its start in a thread of its own
and folds every record with `rollout_stream.core.admission.AdmissionLog`, so a producer learns the answer to
its request when the fold reaches the record that decides it. The topic keeps records by time (never
compacted: every record counts, not only the newest per key) and stamps them with the broker's clock
(LogAppendTime), the only clock the rule uses.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import msgspec

from rollout_stream.clients import Connection
from rollout_stream.codec.admission import AdmissionRecord, decode_admission, encode_admission
from rollout_stream.core.admission import AdmissionLog, AdmissionSnapshot, Decision
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka import (
    Admin,
    Client,
    KafkaFailure,
    SendFuture,
    TopicExists,
    TopicPartition,
    TopicSpec,
    UnknownTopic,
    client_for,
)
from rollout_stream.logs import log_event
from rollout_stream.topics import replication_for

__all__ = ["ADMISSION_TOPIC_CONFIGS", "AdmissionFollower", "AdmissionWriter", "ensure_admission_topic"]

log = logging.getLogger("rollout_stream.pacing")

T = TypeVar("T")

ADMISSION_TOPIC_CONFIGS = {
    "cleanup.policy": "delete",
    "message.timestamp.type": "LogAppendTime",
    "retention.ms": str(7 * 24 * 3600 * 1000),
    "segment.ms": str(3600 * 1000),
    "max.message.bytes": str(1 << 20),
}


def ensure_admission_topic(conn: Connection, topic: str, client: Client | None = None, *,
                           replication_factor: int | None = None,
                           min_insync_replicas: int | None = None) -> bool:
    """Create the admission log if it is missing (True: created now); refuse one that is compacted or has
    more than one partition, where parties could fold different records in different orders."""
    admin = (client or client_for(conn)).admin(client_id=conn.client_id)
    try:
        if topic not in admin.list_topics():
            replication = replication_for(admin, replication_factor, min_insync_replicas)
            configs = {**ADMISSION_TOPIC_CONFIGS, **replication.configs()}
            spec = TopicSpec(topic, 1, replication.factor, configs)
            error = admin.create_topics([spec])[topic]
            if error is None:
                return True
            if not isinstance(error, TopicExists):
                raise error
        configs = _configs_once_known(admin, topic)
        if "compact" in configs.get("cleanup.policy", "delete"):
            raise ConfigurationError(
                f"the admission log {topic} has cleanup.policy={configs['cleanup.policy']}: compaction drops "
                f"records every party must fold; set cleanup.policy=delete")
        return False
    finally:
        admin.close()


def _configs_once_known(admin: Admin, topic: str, wait_s: float = 10.0) -> dict[str, str]:
    """Its configs; a topic another party has just created may be unknown to this broker for a moment."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return admin.topic_configs(topic)
        except UnknownTopic:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


class AdmissionWriter:
    """Appends records to the log (acks=all, idempotent, no linger: a request waits on its own append)."""

    def __init__(self, conn: Connection, topic: str, client: Client | None = None) -> None:
        self.topic = topic
        self._producer = (client or client_for(conn)).producer(client_id=f"{conn.client_id}-admission",
                                                               max_record_bytes=1 << 20, linger_ms=0)
        self._lock = threading.Lock()

    def send(self, record: AdmissionRecord, timeout: float = 10.0) -> SendFuture:
        """Append and wait until the broker has it (or `timeout`): the future of its acknowledgement. Every
        record is flushed at once: whoever wrote it goes on only once the log may hold it."""
        with self._lock:
            future = self._producer.send(self.topic, encode_admission(record), partition=0)
            self._producer.flush(timeout=timeout)
            return future

    def append(self, record: AdmissionRecord, timeout: float = 10.0) -> int:
        """Append and wait for the broker; the record's offset."""
        return self.send(record, timeout).get(timeout).offset

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            try:
                self._producer.flush(timeout=timeout)
            finally:
                self._producer.close(timeout=timeout)


class AdmissionFollower:
    """Folds the log as it grows; `wait_for` blocks until the fold has decided a request."""

    def __init__(self, conn: Connection, topic: str, client: Client | None = None, *, poll_s: float = 0.02,
                 fold: AdmissionLog | None = None,
                 on_decisions: Callable[[list[Decision]], None] | None = None) -> None:
        self.conn, self.topic, self.poll_s = conn, topic, poll_s
        self.client = client or client_for(conn)
        self.fold = fold or AdmissionLog()
        self.on_decisions = on_decisions
        self.error: BaseException | None = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="admission-follower", daemon=True)
        self._thread.start()

    # ---- what the fold knows ---------------------------------------------------------------------
    def wait_for(self, request: int, timeout: float | None) -> Decision | None:
        """The decision on `request` (its offset), or None if the fold did not reach one within `timeout`."""
        with self._changed:
            self._changed.wait_for(lambda: request in self.fold.decided or self._stop.is_set()
                                   or self.error is not None, timeout=timeout)
            return self.fold.decided.get(request)

    def wait_folded(self, offset: int, timeout: float | None) -> bool:
        """Whether the fold has reached `offset` (within `timeout`)."""
        with self._changed:
            return self._changed.wait_for(lambda: self.fold.next_offset > offset or self._stop.is_set(),
                                          timeout=timeout)

    def read(self, look: Callable[[AdmissionLog], T]) -> T:
        """`look` at the fold while no record is being folded."""
        with self._changed:
            return look(self.fold)

    def snapshot(self) -> AdmissionSnapshot:
        with self._changed:
            return self.fold.snapshot()

    # ---- the background reader -------------------------------------------------------------------
    def _run(self) -> None:
        """A Kafka failure costs a fresh consumer a second later that goes on from the next offset to fold;
        anything else stops the follower and is raised to whoever waits on it."""
        try:
            while not self._stop.is_set():
                try:
                    self._read()
                except KafkaFailure as exc:
                    log_event(log, "admission.read_failed", logging.WARNING, topic=self.topic,
                              error=f"{type(exc).__name__}: {exc}", action="reading on in 1 s")
                    self._stop.wait(1.0)
        except BaseException as exc:
            self.error = exc
            log_event(log, "admission.follower_failed", logging.ERROR, topic=self.topic,
                      error=f"{type(exc).__name__}: {exc}")
        finally:
            with self._changed:
                self._changed.notify_all()

    def _read(self) -> None:
        consumer = self.client.assigned_consumer(client_id=f"{self.conn.client_id}-admission",
                                                 max_record_bytes=1 << 20)
        try:
            while not consumer.partitions_for_topic(self.topic):
                if self._stop.wait(0.5):  # not created yet: the first paced party or `topics create` makes it
                    return
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, self.fold.next_offset)
            while not self._stop.is_set():
                polled = consumer.poll(self.poll_s)
                decided: list[Decision] = []
                with self._changed:
                    for records in polled.values():
                        for rec in records:
                            decided += self._fold(rec.offset, rec.timestamp, rec.value)
                    # past a transaction's marker (or an aborted record): nothing to fold, but folded through
                    # it, so whoever waits for the log's end offset is not left waiting
                    passed = consumer.fetch_position(tp) > self.fold.next_offset
                    if passed:
                        self.fold.next_offset = consumer.fetch_position(tp)
                    if polled or passed:
                        self._changed.notify_all()
                if decided and self.on_decisions is not None:
                    self.on_decisions(decided)
        finally:
            consumer.close()

    def _fold(self, offset: int, log_ms: int, value: bytes | None) -> list[Decision]:
        if offset < self.fold.next_offset:
            return []
        try:
            record = decode_admission(value or b"")
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Every party skips the same bytes the same way: the clock still moves.
            log_event(log, "admission.undecodable", logging.WARNING, offset=offset, error=str(exc)[:200])
            return self.fold.tick(offset, log_ms)
        return self.fold.apply(offset, log_ms, record)

    def close(self) -> None:
        self._stop.set()
        with self._changed:
            self._changed.notify_all()
        self._thread.join(timeout=10)
