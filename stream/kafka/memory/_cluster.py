"""The cluster (state, one lock, test hooks) and the client that builds the seam's clients on it."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout_stream.kafka.memory._admin import MemoryAdmin
from rollout_stream.kafka.memory._consumers import MemoryAssignedConsumer
from rollout_stream.kafka.memory._group_consumer import MemoryGroupConsumer
from rollout_stream.kafka.memory._groups import Groups
from rollout_stream.kafka.memory._log import Isolation, Log, MemoryRecord, Transaction
from rollout_stream.kafka.memory._producer import MemoryProducer, SendFailure
from rollout_stream.kafka.seam import Committed, TopicPartition, TopicSpec

__all__ = ["MemoryClient", "MemoryCluster"]

MAX_POLL_RECORDS = 500  # kafka-python's default, which the real seam keeps


@dataclass(slots=True)
class _TransactionalId:
    epoch: int = 0
    open: Transaction | None = None


class MemoryCluster:
    """A Kafka cluster in memory. `client()` builds the seam's clients on it; the other public methods are
    test hooks. One lock guards all state, clients' included (listener callbacks run outside it)."""

    def __init__(self, *, clock_ms: int | None = None) -> None:
        self.lock = threading.RLock()
        self.clock_ms = int(time.time() * 1000) if clock_ms is None else clock_ms
        """Timestamp of records sent without one; moves only when a test sets it."""
        self._log = Log()
        self._groups = Groups(self._log)
        self._transactional: dict[str, _TransactionalId] = {}
        self._send_failures: dict[str, SendFailure] = {}
        self._commit_failure: BaseException | None = None

    def client(self) -> MemoryClient:
        return MemoryClient(self)

    def create_topic(self, name: str, partitions: int = 1, **configs: str) -> str:
        """Create a topic (raises TopicExists if it is there); returns its name."""
        failure = MemoryAdmin(self).create_topics([TopicSpec(name, partitions, configs=configs)])[name]
        if failure is not None:
            raise failure
        return name

    def records(self, topic: str, *, isolation: Isolation = "read_committed") -> list[MemoryRecord]:
        """Every record of `topic` a consumer with `isolation` can read now, by partition and offset."""
        with self.lock:
            return [r for p in range(self._log.count(topic))
                    for r in self._log.partition(TopicPartition(topic, p)).visible(isolation)]

    def committed(self, group_id: str) -> dict[TopicPartition, Committed]:
        with self.lock:
            return dict(self._groups.group(group_id).committed)

    def rebalance(self, group_id: str) -> None:
        """Start a rebalance of the group, as a membership change would."""
        with self.lock:
            self._groups.rebalance(group_id)

    def kick(self, consumer: MemoryGroupConsumer) -> None:
        """Remove a member as its session timeout would: the others take its partitions; it hears `on_lost`
        at its next poll (and then rejoins as a new member), and its group metadata is stale from now on."""
        with self.lock:
            member = consumer._member
            if member is not None and not member.kicked:
                self._groups.remove(consumer._group, member, kicked=True)

    def fail_sends(self, topic: str, error: BaseException | None, *, count: int | None = 1,
                   at_once: bool = False) -> None:
        """Refuse the next `count` sends to `topic` (None: all, until `fail_sends(topic, None)`) with `error`:
        on the future after a flush, as a broker refusal; or raised by `send()` when `at_once`, as a refusal
        the client knows before sending. Refused records are not written; in a transaction a refusal on the
        future makes the transaction abort-only, as in Kafka (one raised at once does not)."""
        with self.lock:
            if error is None:
                self._send_failures.pop(topic, None)
            else:
                self._send_failures[topic] = SendFailure(error, count, at_once)

    def fail_next_commit(self, error: BaseException) -> None:
        """Make the next `commit_transaction()` (of any producer) raise `error`. The transaction stays open,
        to be aborted (after a retriable error: or committed again); ProducerFenced fences the producer as
        a newer one would, aborting its transaction."""
        with self.lock:
            self._commit_failure = error

    # ---- for the clients, under the lock ----
    def _take_send_failure(self, topic: str) -> SendFailure | None:
        failure = self._send_failures.get(topic)
        if failure is not None and failure.count is not None:
            failure.count -= 1
            if failure.count <= 0:
                del self._send_failures[topic]
        return failure

    def _take_commit_failure(self) -> BaseException | None:
        error, self._commit_failure = self._commit_failure, None
        return error

    def _epoch(self, transactional_id: str) -> int:
        return self._transactional_id(transactional_id).epoch

    def _transactional_id(self, transactional_id: str) -> _TransactionalId:
        return self._transactional.setdefault(transactional_id, _TransactionalId())

    def _fence(self, transactional_id: str) -> int:
        """What a new producer's init_transactions does: abort the id's open transaction, bump its epoch."""
        state = self._transactional_id(transactional_id)
        if state.open is not None:
            self._end_transaction(state.open, commit=False)
        state.epoch += 1
        return state.epoch

    def _begin(self, transactional_id: str) -> Transaction:
        txn = self._transactional_id(transactional_id).open = Transaction(transactional_id)
        return txn

    def _end_transaction(self, txn: Transaction, commit: bool) -> None:
        self._log.end_transaction(txn, commit)
        if commit:
            for group_id, offsets in txn.offsets.items():
                self._groups.group(group_id).committed.update(offsets)
        state = self._transactional_id(txn.transactional_id)
        if state.open is txn:
            state.open = None


class MemoryClient:
    """Builds the seam's clients on one MemoryCluster (the seam's Client). Of the tuning it takes only
    `auto_offset_reset` (default earliest, as the real seam's) and `max_poll_records`; sizes are ignored."""

    name = "memory"

    def __init__(self, cluster: MemoryCluster) -> None:
        self.cluster = cluster

    def group_consumer(self, group_id: str, *, client_id: str = "memory", max_record_bytes: int = 0,
                       session_timeout_s: float = 45.0, instance_id: str | None = None,
                       isolation: str = "read_committed", **tuning: Any) -> MemoryGroupConsumer:
        return MemoryGroupConsumer(self.cluster, group_id, client_id=client_id, isolation=isolation,
                                   **_consumer_tuning(tuning))

    def assigned_consumer(self, *, client_id: str = "memory", max_record_bytes: int = 0,
                          isolation: str = "read_committed", commit_group: str | None = None,
                          **tuning: Any) -> MemoryAssignedConsumer:
        return MemoryAssignedConsumer(self.cluster, client_id=client_id, group_id=commit_group,
                                      isolation=isolation, **_consumer_tuning(tuning))

    def producer(self, *, client_id: str = "memory", max_record_bytes: int = 0,
                 transactional_id: str | None = None, transaction_timeout_s: float = 60.0,
                 **tuning: Any) -> MemoryProducer:
        return MemoryProducer(self.cluster, transactional_id=transactional_id)

    def admin(self, *, client_id: str = "memory", **tuning: Any) -> MemoryAdmin:
        return MemoryAdmin(self.cluster)


def _consumer_tuning(tuning: Mapping[str, Any]) -> dict[str, Any]:
    return {"auto_offset_reset": tuning.get("auto_offset_reset", "earliest"),
            "max_poll_records": int(tuning.get("max_poll_records", MAX_POLL_RECORDS))}
