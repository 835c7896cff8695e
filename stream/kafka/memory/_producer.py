"""The producer on the memory cluster: idempotent sends, and transactions with epochs that fence zombies."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollout_stream.kafka.errors import CommitFailed, KafkaFailure, ProducerFenced, RecordRefused
from rollout_stream.kafka.memory._consumers import committed_offsets, illegal
from rollout_stream.kafka.memory._groups import GroupMetadata
from rollout_stream.kafka.memory._log import BROKER_DEFAULTS, MemoryRecord, Transaction, unknown_topic
from rollout_stream.kafka.partitioner import murmur2
from rollout_stream.kafka.seam import Header, Offsets, Outgoing, TopicPartition, Written

if TYPE_CHECKING:
    from rollout_stream.kafka.memory._cluster import MemoryCluster

__all__ = ["MemoryProducer", "SendFailure", "murmur2"]




@dataclass(slots=True)
class SendFailure:
    """A refusal the cluster was told to give the next sends to a topic (`MemoryCluster.fail_sends`)."""

    error: BaseException
    count: int | None  # None: every send until cleared
    at_once: bool


class _Future:
    """Done once the producer flushed (flush, commit, abort or close), as a client's batch is acknowledged."""

    __slots__ = ("_done", "_error", "_written")

    def __init__(self, error: BaseException | None = None, written: Written | None = None) -> None:
        self._done, self._error, self._written = False, error, written

    def done(self) -> bool:
        return self._done

    def exception(self) -> BaseException | None:
        return self._error if self._done else None

    def get(self, timeout: float | None = None) -> Written:
        if not self._done:
            raise KafkaFailure("not acknowledged: the producer has not flushed it", kind="KafkaTimeoutError",
                               retriable=True)
        if self._error is not None:
            raise self._error
        assert self._written is not None
        return self._written


def _abortable(cause: BaseException) -> KafkaFailure:
    failure = KafkaFailure(f"the transaction can only abort: {cause}", kind="TransactionAbortableError")
    failure.__cause__ = cause  # authorization_cause() finds a refused ACL behind it
    return failure


class MemoryProducer:
    """The seam's Producer: idempotent, transactional when given a transactional id. A send is written at
    once (in a transaction: invisible to read_committed consumers until it commits); its future is done at
    the next flush."""

    def __init__(self, cluster: MemoryCluster, *, transactional_id: str | None) -> None:
        self._cluster, self._tid = cluster, transactional_id
        self._epoch: int | None = None  # set by init_transactions()
        self._txn: Transaction | None = None
        self._unflushed: list[_Future] = []
        self._round_robin = itertools.count()  # keyless sends that name no partition
        self._closed = False

    def send(self, topic: str, value: bytes | None, key: bytes | None = None, *, partition: int | None = None,
             headers: Sequence[Header] | None = None, timestamp_ms: int | None = None) -> _Future:
        cluster = self._cluster
        with cluster.lock:
            if self._closed:
                raise illegal("the producer is closed")
            txn = self._transaction("send") if self._tid is not None else None
            if txn is not None and txn.failed is not None:
                raise _abortable(txn.failed)
            tp = TopicPartition(topic, self._choose_partition(topic, key, partition))
            part = cluster._log.partition(tp)
            failure = cluster._take_send_failure(topic) or self._too_large(topic, key, value, headers)
            if failure is not None and failure.at_once:
                raise failure.error
            configs = cluster._log.topics[topic].configs
            log_time = configs.get("message.timestamp.type") == "LogAppendTime"
            stamp = cluster.clock_ms if timestamp_ms is None or log_time else timestamp_ms
            written = Written(topic, tp.partition, len(part.entries), stamp)
            future = _Future(None if failure is None else failure.error, written if failure is None else None)
            if failure is None:
                record = MemoryRecord(topic, tp.partition, len(part.entries), stamp, key, value,
                                      tuple(headers or ()))
                cluster._log.append(tp, record, txn)
            elif txn is not None:
                txn.failed = failure.error  # a refused batch makes the transaction abort-only, as in Kafka
            self._unflushed.append(future)
            return future

    def _choose_partition(self, topic: str, key: bytes | None, partition: int | None) -> int:
        if partition is not None:
            return partition
        count = self._cluster._log.count(topic)
        if count == 0:
            raise unknown_topic(f"topic {topic!r}")
        if key is not None:
            return (murmur2(key) & 0x7FFFFFFF) % count
        return next(self._round_robin) % count

    def _too_large(self, topic: str, key: bytes | None, value: bytes | None,
                   headers: Sequence[Header] | None) -> SendFailure | None:
        configs = self._cluster._log.topics[topic].configs
        limit = int(configs.get("max.message.bytes", BROKER_DEFAULTS["max.message.bytes"]))
        size = len(key or b"") + len(value or b"") + sum(len(k) + len(v) for k, v in headers or ())
        if size <= limit:
            return None
        error = RecordRefused(f"a {size}-byte record is over max.message.bytes={limit} of {topic!r}",
                              kind="MessageSizeTooLargeError")
        return SendFailure(error, 1, at_once=False)

    def send_in_transaction(self, topic: str, value: bytes | None, key: bytes | None = None, *,
                            partition: int | None = None, headers: Sequence[Header] | None = None) -> None:
        self.send(topic, value, key, partition=partition, headers=headers)

    def send_all_in_transaction(self, records: Sequence[Outgoing]) -> None:
        for r in records:
            self.send(r.topic, r.value, r.key, partition=r.partition, headers=r.headers)

    def partitions_for(self, topic: str) -> list[int] | None:
        with self._cluster.lock:
            return list(range(self._cluster._log.count(topic))) or None

    def partition_for(self, topic: str, key: bytes) -> int | None:
        partitions = self.partitions_for(topic)
        return partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)] if partitions else None

    def flush(self, timeout: float | None = None) -> None:
        with self._cluster.lock:
            for future in self._unflushed:
                future._done = True
            self._unflushed = []

    def close(self, timeout: float | None = None) -> None:
        """Flush; abort an open transaction unless fenced (the Java client's close aborts it too)."""
        with self._cluster.lock:
            if self._closed:
                return
            fenced = self._tid is not None and self._epoch != self._cluster._epoch(self._tid)
            if self._txn is not None and not fenced:
                self._cluster._end_transaction(self._txn, commit=False)
            self._txn = None
            self.flush()
            self._closed = True

    # ---- transactions ----
    def _checked_epoch(self, action: str) -> str:
        if self._tid is None:
            raise illegal(f"{action}: the producer has no transactional id")
        if self._closed:
            raise illegal("the producer is closed")
        if self._epoch is None:
            raise illegal(f"{action}: call init_transactions() first")
        if self._epoch != self._cluster._epoch(self._tid):
            raise ProducerFenced(f"a newer producer with transactional id {self._tid!r} took over",
                                 kind="ProducerFencedError")
        return self._tid

    def _transaction(self, action: str) -> Transaction:
        self._checked_epoch(action)
        if self._txn is None:
            raise illegal(f"{action}: no transaction is open (call begin_transaction() first)")
        return self._txn

    def init_transactions(self) -> None:
        with self._cluster.lock:
            if self._tid is None:
                raise illegal("init_transactions: the producer has no transactional id")
            self._epoch, self._txn = self._cluster._fence(self._tid), None

    def begin_transaction(self) -> None:
        with self._cluster.lock:
            tid = self._checked_epoch("begin_transaction")
            if self._txn is not None:
                raise illegal("begin_transaction: a transaction is already open")
            self._txn = self._cluster._begin(tid)

    def send_offsets_to_transaction(self, offsets: Offsets, group_metadata: Any) -> None:
        """Stage group offsets, committed with the transaction; refused (CommitFailed, and the transaction
        made abort-only) when `group_metadata` is of a member the group no longer has in that generation."""
        with self._cluster.lock:
            txn = self._transaction("send_offsets_to_transaction")
            if not isinstance(group_metadata, GroupMetadata) or not group_metadata.group_id:
                raise KafkaFailure(f"not a memory consumer's group metadata: {group_metadata!r}",
                                   kind="InvalidGroupIdError")
            staged = committed_offsets(offsets)
            for tp in staged:
                self._cluster._log.partition(tp)
            group = self._cluster._groups.group(group_metadata.group_id)
            try:
                group.validate(group_metadata, transactional=True)
            except CommitFailed as exc:  # KIP-447: a zombie's transaction must not commit
                txn.failed = exc
                raise
            txn.offsets.setdefault(group_metadata.group_id, {}).update(staged)

    def commit_transaction(self) -> None:
        cluster = self._cluster
        with cluster.lock:
            txn = self._transaction("commit_transaction")
            self.flush()
            if txn.failed is not None:
                raise _abortable(txn.failed)
            injected = cluster._take_commit_failure()
            if isinstance(injected, ProducerFenced):
                cluster._fence(txn.transactional_id)
                self._txn = None
            elif injected is not None and not getattr(injected, "retriable", False):
                txn.failed = injected
            if injected is not None:
                raise injected
            cluster._end_transaction(txn, commit=True)
            self._txn = None

    def abort_transaction(self) -> None:
        with self._cluster.lock:
            txn = self._transaction("abort_transaction")
            self.flush()
            self._cluster._end_transaction(txn, commit=False)
            self._txn = None
