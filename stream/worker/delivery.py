"""How outputs and input offsets reach Kafka, as one `Delivery` protocol with two strategies:

* `ExactlyOnce`: outputs, dead-letters, the window changelog and input offsets commit in one Kafka
  transaction (KIP-447 fencing); it owns the changelog writes.
* `AtLeastOnce`: outputs are flushed and acknowledged before the input offsets below them are committed;
  nothing is journaled (a restart re-reads from the committed offsets).

Either writes the head of each published group it is given (stream/worker/heads.py) once the producer
said where the group's train records went: in the transaction before its offsets, or acknowledged before
the input offsets below it are committed.

`open_delivery` picks one by the configured name, the only place that does; the worker asks the one it has
what follows from it (`restores`, `lost`). The processor owns the offset ledger and the window store: it
lends the ledger to each commit (a delivery resolves what it sent and delivered, and marks what it
committed) and hands over the closed-group memory changed since the last commit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple, NoReturn, Protocol

from rollout_stream.codec import changelog_key, encode_changelog
from rollout_stream.codec.changelog import POSITION_KEY, ClosedGroupEntry, PartitionPosition
from rollout_stream.config import WorkerConfig
from rollout_stream.core.offsets import OffsetLedger
from rollout_stream.core.windows import ClosedGroup, WindowKey
from rollout_stream.errors import RuntimeFailure
from rollout_stream.kafka import (
    Client,
    CommitFailed,
    GroupConsumer,
    KafkaFailure,
    Producer,
    ProducerFenced,
    SendFuture,
    TopicPartition,
    authorization_cause,
    refusal_cause,
)
from rollout_stream.logs import log_event
from rollout_stream.names import transactional_id
from rollout_stream.topics import ensure_changelog
from rollout_stream.worker.heads import PendingHead
from rollout_stream.worker.outputs import OutputRecord

__all__ = ["AtLeastOnce", "ChangelogWrite", "CommitAborted", "Delivery", "ExactlyOnce", "ProduceFailed",
           "closed_entry", "open_delivery"]

log = logging.getLogger("rollout_stream.delivery")

#: A failure that is not retriable and aborts this many transactions in a row, with no commit between, stops
#: the worker: it comes back after every restore (a producer in a fatal state, say).
RECURRING_ABORTS = 3


class ProduceFailed(RuntimeFailure, RuntimeError):
    """The broker refused an output after the client's retries: stop without committing past it."""

    doing = "stopping without committing past an unpublished record"


class CommitAborted(RuntimeFailure, RuntimeError):
    """A transaction was aborted; the worker must restore its state from the last commit."""


class Delivery(Protocol):
    producer: Producer

    @property
    def open(self) -> bool:
        """Outputs sent and not yet committed."""
        ...
    @property
    def restores(self) -> bool:
        """Whether a failed commit undoes what was sent since the last one: the windows of a newly assigned
        partition, and of every partition after an abort, are then restored from the changelog, and what
        was routed since the last commit is routed (and counted) again."""
        ...
    @property
    def changelog_topic(self) -> str | None:
        """Where the windows are journaled; None when they are not."""
        ...

    def send(self, outs: list[OutputRecord], head: PendingHead | None = None) -> None:
        """Queue one group's outputs (or its dead letters), in order, and the group's `head` to write once
        they are. CommitAborted when a failure aborted the open transaction (the worker restores from the last
        commit)."""
        ...
    def commit(self, ledger: OffsetLedger, changes: Changes, active: set[int], timeout: float | None = None
               ) -> dict[int, int]:
        """Commit what is resolved in the `active` partitions, with the closed-group memory's `changes` since
        the last commit; the positions committed. CommitAborted when the worker must restore its state from
        the last commit."""
        ...
    def commit_on_revoke(self, ledger: OffsetLedger, changes: Changes, active: set[int]) -> None:
        """`commit` from inside the rebalance callback, before the partitions move."""
        ...
    def restored(self, partition: int, position: int) -> None:
        """The partition's restore resumes at `position`."""
        ...
    def abort(self, cause: BaseException | None = None) -> None: ...
    def forget(self, partition: int) -> None:
        """The partition is gone: nothing of it may be committed by this worker any more."""
        ...
    def lost(self, partitions: set[int]) -> bool:
        """The partitions were lost, not revoked (each already forgotten): True when what was sent since the
        last commit is thrown away with them, and the worker restores every partition from the last commit."""
        ...
    def close(self, timeout: float | None = None) -> None: ...


Changes = dict[WindowKey, ClosedGroup | None]
"""Closed-group memory changed since the last commit (None: forgotten), as `WindowStore.drain_changes`."""


class ChangelogWrite(NamedTuple):
    """One changelog record of a transaction: an `Outgoing` record, so a commit's writes go to the producer in
    one call (a dataclass and a call per write were a visible share of the loop's time per closed group)."""

    topic: str
    partition: int
    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def inputs_of(outs: Sequence[OutputRecord]) -> dict[int, list[int]]:
    """The input offsets behind one send, by partition: a group's outputs, or its dead letters, come from one
    partition, so this is one list in all but odd cases."""
    sources = [out.source for out in outs]
    first = sources[0].partition
    if [source.partition for source in sources].count(first) == len(sources):
        if not any(source.chunks for source in sources):
            return {first: [source.offset for source in sources]}
        return {first: [offset for source in sources for offset in source.offsets]}
    by_partition: dict[int, list[int]] = {}
    for source in sources:
        by_partition.setdefault(source.partition, []).extend(source.offsets)
    return by_partition


def closed_entry(closed: ClosedGroup) -> ClosedGroupEntry:
    return ClosedGroupEntry(
        reason=closed.reason.value if closed.reason is not None else None, message=closed.message,
        deadline_ms=closed.deadline_ms, closed_at_ms=closed.closed_at_ms, digests=sorted(closed.digests),
        digest_algorithm=closed.digest_algorithm, first_offset=closed.first_offset)


def _committable(ledger: OffsetLedger, active: set[int]) -> dict[int, int]:
    return {p: pos for p, pos in ledger.due().items() if p in active}


class AtLeastOnce:
    """Outputs are flushed and acknowledged before the input offsets below them are committed."""

    restores = False  # what was sent stays sent; a partition resumes at its committed offset
    changelog_topic = None

    def __init__(self, producer: Producer, consumer: GroupConsumer, input_topic: str) -> None:
        self.producer, self.consumer, self.topic = producer, consumer, input_topic
        self.in_flight: list[tuple[SendFuture, OutputRecord]] = []
        # heads to write once their group's records are acknowledged: (head, the sends, input partition)
        self.heads: list[tuple[PendingHead, list[SendFuture], int]] = []

    @property
    def open(self) -> bool:
        return bool(self.in_flight)

    def send(self, outs: list[OutputRecord], head: PendingHead | None = None) -> None:
        futures = []
        for out in outs:
            future = self.producer.send(out.topic, out.value, out.key, partition=out.partition,
                                        headers=out.headers)
            self.in_flight.append((future, out))
            futures.append(future)
        if head is not None and outs:
            self.heads.append((head, futures, outs[0].source.partition))

    def _flush(self, ledger: OffsetLedger, timeout: float | None = None) -> None:
        if not self.in_flight:
            return
        self.producer.flush(timeout=timeout)
        in_flight, self.in_flight = self.in_flight, []
        for future, out in in_flight:
            if not future.done():
                raise ProduceFailed(f"output to {out.topic} not acknowledged within the flush timeout")
            error = future.exception()
            if error is not None:
                raise ProduceFailed(
                    f"broker refused output to {out.topic} for input "
                    f"{out.source.topic}:{out.source.partition}"
                    f"@{out.source.offset}: {error}"
                )
        self._write_heads(timeout)
        for _, out in in_flight:
            ledger.resolve(out.source.partition, out.source.offsets)

    def _write_heads(self, timeout: float | None) -> None:
        """The heads of the groups just acknowledged, acknowledged in turn: a group whose inputs are committed
        always has its head (a restart before this repeats both)."""
        heads, self.heads = self.heads, []
        if not heads:
            return
        sent = []
        for head, futures, _ in heads:
            record = head.finish([f.get(0) for f in futures])
            future = self.producer.send(record.topic, record.value, record.key, partition=record.partition)
            sent.append((future, record.topic))
        self.producer.flush(timeout=timeout)
        for future, topic in sent:
            error = future.exception() if future.done() else "not acknowledged within the flush timeout"
            if error is not None:
                raise ProduceFailed(f"group head to {topic}: {error}")

    def commit(self, ledger: OffsetLedger, changes: Changes, active: set[int], timeout: float | None = None
               ) -> dict[int, int]:
        # `changes` are not journaled: a restart re-reads from the committed offsets
        self._flush(ledger, timeout)
        due = _committable(ledger, active)
        if due:
            self.consumer.commit({TopicPartition(self.topic, p): pos for p, pos in due.items()})
            ledger.mark_committed(due)
        return due

    def commit_on_revoke(self, ledger: OffsetLedger, changes: Changes, active: set[int]) -> None:
        self.commit(ledger, changes, active)

    def restored(self, partition: int, position: int) -> None:
        """Nothing to note: at-least-once restores nothing (a partition resumes at its committed offset)."""

    def abort(self, cause: BaseException | None = None) -> None:
        """Nothing to abort: what was sent stays sent, and is read again from the last commit."""

    def forget(self, partition: int) -> None:
        self.in_flight = [(f, o) for f, o in self.in_flight if o.source.partition != partition]
        self.heads = [h for h in self.heads if h[2] != partition]

    def lost(self, partitions: set[int]) -> bool:
        """Nothing to throw away: what was sent stays sent, and the lost partitions' part was forgotten."""
        return False

    def close(self, timeout: float | None = None) -> None:
        self.producer.close(timeout=timeout)


class ExactlyOnce:
    """Outputs, dead-letters, changelog records and input offsets commit in one Kafka transaction."""

    restores = True  # an aborted transaction leaves nothing: the windows come back from the changelog

    def __init__(self, producer: Producer, consumer: GroupConsumer, input_topic: str, changelog_topic: str
                 ) -> None:
        self.producer, self.consumer, self.topic = producer, consumer, input_topic
        self.changelog_topic = changelog_topic
        self.positions: dict[int, int] = {}  # per partition: the read position last written to the changelog
        self._open = False
        # The inputs behind each send of the open transaction, by partition (not the outputs: the producer has
        # copied them, and one resolve call per output cost the loop time for every record).
        self.pending: list[dict[int, list[int]]] = []
        self.pending_outputs = 0
        # heads to write before this transaction's offsets: (head, the sends of its group's records)
        self.heads: list[tuple[PendingHead, list[SendFuture]]] = []
        self.fatal: BaseException | None = None  # after it, nothing may be committed (see _failed)
        self._unaborted = False  # an abort failed: it is asked again before the next transaction
        self._streak: tuple[str, int] = ("", 0)  # the kind of failure, not retriable, behind the last aborts
        self.producer.init_transactions()

    @property
    def open(self) -> bool:
        return self._open

    def _begin(self) -> None:
        if self._unaborted:  # the last abort failed: asked again before anything new (librdkafka's rule)
            self._unaborted = False
            try:
                self.producer.abort_transaction()
            except KafkaFailure as exc:
                # It may have ended meanwhile, and the client then refuses an abort out of place: whether a
                # new transaction can begin says which (if not, its failure goes the way of any other).
                log_event(log, "transaction.abort_failed", logging.WARNING, error=str(exc),
                          action="beginning the next transaction anyway")
        if not self._open:
            self.producer.begin_transaction()
            self._open = True

    def send(self, outs: list[OutputRecord], head: PendingHead | None = None) -> None:
        try:
            self._begin()
            # Some of the group's outputs may be queued and others not, and the ledger knows of none: after a
            # failure the transaction must never commit (see _failed).
            if head is None or not outs:
                self.producer.send_all_in_transaction(outs)
            else:  # with a delivery report each: its head needs their offsets
                self.heads.append((head, [self.producer.send(o.topic, o.value, o.key, partition=o.partition,
                                                             headers=o.headers or None) for o in outs]))
        except ProducerFenced:
            raise
        except KafkaFailure as exc:
            self._failed(exc)
        if outs:
            self.pending.append(inputs_of(outs))
            self.pending_outputs += len(outs)

    def _failed(self, exc: KafkaFailure) -> NoReturn:
        """The one decision after a failed send or commit: abort, then stop or restore.

        Stop when the failure would come back after every restore: an ACL is missing, the records themselves
        are refused (too large for their topic), or the same failure that is not retriable aborted the last
        RECURRING_ABORTS transactions in a row. The worker then exits; its shutdown commits nothing after
        this. Anything else (a broker or coordinator away, a transaction that can only abort) is a failed
        commit: CommitAborted, and the worker reads everything again from the last commit."""
        fatal: KafkaFailure | None = authorization_cause(exc) or refusal_cause(exc)
        kind, count = self._streak
        # A rebalance that fenced the commit (CommitFailed) is what a restore is for: it never counts.
        passing = exc.retriable or isinstance(exc, CommitFailed)
        self._streak = ("", 0) if passing else (exc.kind, count + 1 if kind == exc.kind else 1)
        if fatal is None and self._streak[1] >= RECURRING_ABORTS:
            fatal = exc
            log_event(log, "transaction.failing_again", logging.ERROR, error=str(exc),
                      aborts_in_a_row=self._streak[1],
                      action="stopping: the same failure came back after every restore")
        if fatal is not None:
            if self.fatal is None:
                self.abort(exc)
                self.fatal = exc
            raise exc
        self.abort(exc)
        raise CommitAborted(str(exc)) from exc

    def changelog_writes(self, ledger: OffsetLedger, changes: Changes, active: set[int]
                         ) -> list[ChangelogWrite]:
        """Closed-group memory changed since the last commit, and each partition's read position."""
        topic = self.changelog_topic
        writes = [
            ChangelogWrite(topic, k[0], changelog_key(k[1], k[2]),
                           encode_changelog(closed_entry(c)) if c else None)
            for k, c in changes.items() if k[0] in active
        ]
        for p in active:
            position = ledger.next_offset(p)
            if position is not None and position != self.positions.get(p):
                writes.append(ChangelogWrite(topic, p, POSITION_KEY,
                                             encode_changelog(PartitionPosition(position))))
                self.positions[p] = position
        return writes

    def restored(self, partition: int, position: int) -> None:
        """The changelog already holds `position` for the partition (its restore resumes there)."""
        self.positions[partition] = position

    def _prepare(self, ledger: OffsetLedger, changes: Changes, active: set[int]) -> dict[int, int]:
        # Everything sent in this transaction is resolved if (and only if) the transaction commits.
        for inputs in self.pending:
            for partition, offsets in inputs.items():
                ledger.resolve(partition, offsets)
        due = _committable(ledger, active)
        writes = self.changelog_writes(ledger, changes, active)
        if writes or due:
            self._begin()
        if writes:
            self.producer.send_all_in_transaction(writes)
        if due:
            self.producer.send_offsets_to_transaction(
                {TopicPartition(self.topic, p): pos for p, pos in due.items()}, self.consumer.group_metadata()
            )
        return due

    def commit(self, ledger: OffsetLedger, changes: Changes, active: set[int], timeout: float | None = None
               ) -> dict[int, int]:
        stale = sorted({partition for inputs in self.pending for partition in inputs} - active)
        if stale:  # outputs of partitions this worker no longer owns: their new owner produces them again
            cause = CommitAborted(
                f"the transaction holds outputs of partitions {stale}, no longer assigned here"
            )
            self.abort(cause)
            raise cause
        if self.fatal is not None:
            raise self.fatal
        try:
            self._write_heads(timeout)
            due = self._prepare(ledger, changes, active)
            if self._open:
                self.producer.commit_transaction()
                self._open = False
        except ProducerFenced:
            raise
        except KafkaFailure as exc:
            self._failed(exc)
        self.pending, self.pending_outputs = [], 0
        self._streak = ("", 0)
        ledger.mark_committed(due)
        return due

    def _write_heads(self, timeout: float | None) -> None:
        """The heads of this transaction's groups, in it: a flush inside the open transaction gives the
        offsets of their train records (read_committed readers see none of them before the commit)."""
        heads, self.heads = self.heads, []
        if not heads:
            return
        self.producer.flush(timeout=timeout)
        self.producer.send_all_in_transaction(
            [head.finish([f.get(timeout) for f in futures]) for head, futures in heads])

    def commit_on_revoke(self, ledger: OffsetLedger, changes: Changes, active: set[int]) -> None:
        # Producer calls block on the producer's own sender thread, not on the consumer's IO thread.
        self.commit(ledger, changes, active)

    def abort(self, cause: BaseException | None = None) -> None:
        log_event(
            log,
            "transaction.aborted",
            logging.WARNING,
            cause=f"{type(cause).__name__}: {cause}" if cause else "shutdown",
            outputs=self.pending_outputs,
        )
        self.pending, self.pending_outputs = [], 0
        self.heads = []
        if self._open or self._unaborted:
            try:
                self.producer.abort_transaction()
                self._unaborted = False
            except KafkaFailure as exc:
                log_event(log, "transaction.abort_failed", logging.ERROR, error=str(exc),
                          action="aborting again before the next transaction begins")
                self._unaborted = True
            self._open = False

    def forget(self, partition: int) -> None:
        """A transaction covers every partition and is committed or aborted as a whole; only the changelog
        position is forgotten (the partition's next owner writes its own)."""
        self.positions.pop(partition, None)

    def lost(self, partitions: set[int]) -> bool:
        if not self._open:
            return False
        # Lost while this worker was stalled or cut off: the new owner produces these outputs again, so the
        # open transaction must never commit (after a rejoin its offsets would pass the generation check).
        self.abort(CommitAborted(f"partitions {','.join(map(str, sorted(partitions)))} were lost"))
        return True

    def close(self, timeout: float | None = None) -> None:
        self.producer.close(timeout=timeout)


def open_delivery(config: WorkerConfig, client: Client, consumer: GroupConsumer, *, client_id: str,
                  instance_id: str | None, changelog_topic: str, partitions: int) -> Delivery:
    """The delivery `config.delivery` names, with its producer; exactly-once first makes sure its changelog
    topic exists (`partitions`: the input topic's)."""
    # With heads, every record its own record batch: a rank fetching its records by offset receives whole
    # batches, so records of other ranks sharing one would be fetched too (docs/reader.md).
    tuning: dict[str, Any] = {"batch_size": 1} if config.write_heads else {}
    if config.delivery == "exactly-once":
        ensure_changelog(client, changelog_topic, partitions)
        producer = client.producer(
            client_id=client_id, max_record_bytes=config.max_record_bytes,
            transactional_id=transactional_id(config.group_id, instance_id or ""),
            transaction_timeout_s=config.transaction_timeout_s, **tuning)
        return ExactlyOnce(producer, consumer, config.topics.input, changelog_topic)
    producer = client.producer(client_id=client_id, max_record_bytes=config.max_record_bytes, **tuning)
    return AtLeastOnce(producer, consumer, config.topics.input)
