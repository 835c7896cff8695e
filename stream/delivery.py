"""How outputs and input offsets reach Kafka: at-least-once (flush, then commit offsets) or exactly-once
(outputs, changelog and offsets in one transaction, KIP-447 fencing). One commit object per worker."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaError, ProducerFencedError
from kafka.partitioner.default import murmur2
from kafka.structs import OffsetAndMetadata

from core.offsets import OffsetLedger
from stream.access import authorization_cause
from stream.logs import log_event
from stream.outputs import OutputRecord

__all__ = ["ProduceFailed", "CommitAborted", "ChangelogWrite", "AtLeastOnce", "ExactlyOnce", "partition_of"]

log = logging.getLogger("rollout_stream.delivery")


class ProduceFailed(RuntimeError):
    """The broker refused an output after the client's retries: stop without committing past it."""


class CommitAborted(RuntimeError):
    """A transaction was aborted; the worker must restore its state from the last commit."""


@dataclass(frozen=True, slots=True)
class ChangelogWrite:
    partition: int
    key: bytes
    value: bytes | None


def partition_of(producer: Any, topic: str, key: bytes) -> int | None:
    """The partition the producer's default partitioner gives `key` (the Java client's murmur2 rule).

    kafka-python runs murmur2 in pure Python for every send (a quarter of `send()` in the stage's profile);
    members of a group share their key, so the stage computes it once per group and names the partition.
    None when the topic's partitions are unknown (e.g. not authorized): `send()` then fails the way the
    delivery checks for.
    """
    try:
        partitions = sorted(producer.partitions_for(topic) or ())
    except KafkaError:
        return None
    if not partitions:
        return None
    return partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]


def _send(producer: Any, out: OutputRecord) -> Any:
    return producer.send(out.topic, value=out.value, key=out.key, headers=out.headers, partition=out.partition)


def _offsets(topic: str, positions: dict[int, int]) -> dict[TopicPartition, OffsetAndMetadata]:
    return {TopicPartition(topic, p): OffsetAndMetadata(pos, "", -1) for p, pos in positions.items()}


class AtLeastOnce:
    """Outputs are flushed and acknowledged before the input offsets below them are committed."""

    transactional = False

    def __init__(self, producer: Any, consumer: Any, input_topic: str, ledger: OffsetLedger) -> None:
        self.producer, self.consumer, self.topic, self.ledger = producer, consumer, input_topic, ledger
        self.in_flight: list[tuple[Any, OutputRecord]] = []

    def send(self, out: OutputRecord) -> None:
        self.in_flight.append((_send(self.producer, out), out))

    def flush(self, timeout: float | None = None) -> None:
        if not self.in_flight:
            return
        self.producer.flush(timeout=timeout)
        in_flight, self.in_flight = self.in_flight, []
        for future, out in in_flight:
            if not future.is_done:
                raise ProduceFailed(f"output to {out.topic} not acknowledged within the flush timeout")
            if future.failed():
                raise ProduceFailed(
                    f"broker refused output to {out.topic} for input {out.source.topic}:{out.source.partition}"
                    f"@{out.source.offset}: {type(future.exception).__name__}: {future.exception}")
            self.ledger.resolve(out.source.partition, (out.source.offset,))

    def commit(self, assigned: set[int], changelog: list[ChangelogWrite], timeout: float | None = None) -> dict[int, int]:
        self.flush(timeout)
        due = {p: pos for p, pos in self.ledger.due().items() if p in assigned}
        if due:
            self.consumer.commit(_offsets(self.topic, due))
            self.ledger.mark_committed(due)
        return due

    async def commit_on_revoke(self, assigned: set[int]) -> None:
        self.flush()
        due = {p: pos for p, pos in self.ledger.due().items() if p in assigned}
        if due:
            # The blocking commit() may not run on kafka-python's IO thread; this is the coroutine under it.
            await self.consumer._coordinator._commit_offsets_sync_async(_offsets(self.topic, due))
            self.ledger.mark_committed(due)

    def forget(self, partition: int) -> None:
        self.in_flight = [(f, o) for f, o in self.in_flight if o.source.partition != partition]

    def close(self, timeout: float | None = None) -> None:
        self.producer.close(timeout=timeout)


class ExactlyOnce:
    """Outputs, dead-letters, changelog records and input offsets commit in one Kafka transaction."""

    transactional = True

    def __init__(self, producer: Any, consumer: Any, input_topic: str, ledger: OffsetLedger,
                 changelog_topic: str) -> None:
        self.producer, self.consumer, self.topic, self.ledger = producer, consumer, input_topic, ledger
        self.changelog_topic = changelog_topic
        self.open = False
        self.pending: list[OutputRecord] = []
        self.fatal: BaseException | None = None  # after it, nothing may be committed (see _checked)
        self.producer.init_transactions()

    def _begin(self) -> None:
        if not self.open:
            self.producer.begin_transaction()
            self.open = True

    def send(self, out: OutputRecord) -> None:
        self._begin()
        self._checked(lambda: _send(self.producer, out))
        self.pending.append(out)

    def _checked(self, send: Any) -> None:
        """kafka-python fails a send whose topic metadata the broker refused (TOPIC_AUTHORIZATION_FAILED, ...) at
        once, without failing the transaction: committing would succeed without that record and lose it. Such a
        send, and any send refused for lack of an ACL, aborts the transaction, and every later commit (the
        worker's shutdown commit included) is refused: an ACL does not come back by retrying."""
        try:
            future = send()
        except KafkaError as exc:
            self._fatal_if_denied(exc)
            raise
        if future.is_done and future.failed():
            self._fatal_if_denied(future.exception)
            raise future.exception

    def _fatal_if_denied(self, exc: BaseException) -> None:
        denied = authorization_cause(exc)
        if denied is not None:
            if self.fatal is None:
                self.abort(denied)
                self.fatal = denied
            if denied is exc:
                raise denied
            raise denied from exc

    def _prepare(self, assigned: set[int], changelog: list[ChangelogWrite]) -> dict[int, int]:
        # Everything sent in this transaction is resolved if (and only if) the transaction commits.
        for out in self.pending:
            self.ledger.resolve(out.source.partition, (out.source.offset,))
        due = {p: pos for p, pos in self.ledger.due().items() if p in assigned}
        if changelog or due:
            self._begin()
        for w in changelog:
            self._checked(lambda w=w: self.producer.send(self.changelog_topic, key=w.key, value=w.value,
                                                         partition=w.partition))
        if due:
            self.producer.send_offsets_to_transaction(_offsets(self.topic, due), self.consumer.group_metadata())
        return due

    def _finish(self, due: dict[int, int]) -> None:
        if self.open:
            self.producer.commit_transaction()
            self.open = False
        self.pending = []
        self.ledger.mark_committed(due)

    def commit(self, assigned: set[int], changelog: list[ChangelogWrite], timeout: float | None = None) -> dict[int, int]:
        stale = sorted({out.source.partition for out in self.pending} - assigned)
        if stale:  # outputs of partitions this worker no longer owns: their new owner produces them again
            cause = CommitAborted(f"the transaction holds outputs of partitions {stale}, no longer assigned here")
            self.abort(cause)
            raise cause
        if self.fatal is not None:
            raise self.fatal
        try:
            due = self._prepare(assigned, changelog)
            self._finish(due)
            return due
        except ProducerFencedError:
            raise
        except KafkaError as exc:
            self._fatal_if_denied(exc)  # an ACL went missing: retrying cannot help, and must not commit
            self.abort(exc)
            raise CommitAborted(f"{type(exc).__name__}: {exc}") from exc

    async def commit_on_revoke(self, assigned: set[int], changelog: list[ChangelogWrite]) -> None:
        # Producer calls block on the producer's own sender thread, not on the consumer's IO thread.
        self.commit(assigned, changelog)

    def abort(self, cause: BaseException | None = None) -> None:
        log_event(log, "transaction.aborted", logging.WARNING,
                  cause=f"{type(cause).__name__}: {cause}" if cause else "shutdown", outputs=len(self.pending))
        self.pending = []
        if self.open:
            try:
                self.producer.abort_transaction()
            except KafkaError as exc:
                log_event(log, "transaction.abort_failed", logging.ERROR, error=f"{type(exc).__name__}: {exc}")
            self.open = False

    def forget(self, partition: int) -> None:
        """Nothing to do: a transaction covers every partition and is committed or aborted as a whole."""

    def close(self, timeout: float | None = None) -> None:
        self.producer.close(timeout=timeout)
