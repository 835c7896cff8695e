"""librdkafka's producer: a future per send that delivery reports complete, transactional calls bounded in
time (a hung or fatally failed producer replaced), partition lists cached."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka import Producer as _RdProducer

from rollout_stream.kafka.bounded import Hung, call_within
from rollout_stream.kafka.confluent.convert import _rd_offsets
from rollout_stream.kafka.confluent.errors import _FENCED, _translated, translate
from rollout_stream.kafka.confluent.settings import TIMEOUT_S
from rollout_stream.kafka.errors import BrokerUnavailable, KafkaFailure
from rollout_stream.kafka.seam import Header, Offsets, Outgoing, Written

log = logging.getLogger("rollout_stream.kafka")

_UNASSIGNED = -1  # librdkafka's RD_KAFKA_PARTITION_UA: its partitioner picks the partition
TXN_TIMEOUT_S = 10.0  # a transactional call normally takes milliseconds: past this it has hung
PARTITIONS_TTL_S = 30.0  # how long a topic's partition list is kept (the Java client refreshes every 5 min)


class _Future:
    __slots__ = ("_done", "_error", "_message", "_producer")

    def __init__(self, producer: _Producer) -> None:
        self._done = False
        self._error: BaseException | None = None
        self._message: Message | None = None
        self._producer = producer

    def _report(self, error: KafkaError | None, message: Message) -> None:
        # Called for every record (on poll/flush): the Written is made only when asked for.
        self._done = True
        if error is not None:
            self._error = translate(KafkaException(error))
            if self._producer._failed is None and self._producer._settings is None:
                # not transactional: a transaction reports its refusals itself, and an abort purges records
                self._producer._failed = self._error
        else:
            self._message = message

    def done(self) -> bool:
        return self._done

    def exception(self) -> BaseException | None:
        return self._error if self._done else None

    def get(self, timeout: float | None = None) -> Written:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise BrokerUnavailable("not acknowledged in time", kind="KafkaTimeoutError")
            self._producer._p.poll(min(0.1, left) if left is not None else 0.1)
        if self._error is not None:
            raise self._error
        m = self._message
        assert m is not None  # delivered without an error
        topic, partition, offset = m.topic(), m.partition(), m.offset()
        assert topic is not None and partition is not None and offset is not None  # as for every delivery
        kind, stamp = m.timestamp()
        return Written(topic, partition, offset, stamp if kind != 0 and stamp >= 0 else None)


class _Producer:
    def __init__(self, producer: _RdProducer, settings: dict[str, Any] | None = None) -> None:
        self._p = producer
        self._settings = settings  # to build a fresh one when a transactional call hangs
        self._replaced = False
        self._failed: BaseException | None = None  # the first delivery failure since the last flush
        self._sends = 0
        self._partitions: dict[str, tuple[float, list[int]]] = {}  # topic: (when asked, partitions)

    def _transactional(self, what: str, call: Any) -> None:
        """A transactional call, bounded in time. librdkafka can wait forever for a group or transaction
        coordinator that went away with a broker restart, whatever timeout it is given (librdkafka#5456,
        #5511): past TIMEOUT_S the wedged producer is abandoned for a fresh one with the same transactional id
        (its init_transactions() fences the old one and aborts its open transaction) and the call fails as
        an aborted transaction would, so the caller restores and goes on."""
        producer = self._p
        try:
            # librdkafka's own timeout is TXN_TIMEOUT_S: it may not keep it
            call_within(TXN_TIMEOUT_S + 5, lambda: call(producer), f"rdkafka-{what}")
            return
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            # A fatal error other than fencing leaves the producer unusable, yet nobody else owns its id: seen
            # as INVALID_TXN_STATE on ending a transaction while the coordinator's broker died.
            if not (isinstance(error, KafkaError) and error.fatal() and error.code() not in _FENCED
                    and self._settings is not None):
                raise translate(exc) from exc
            log.warning("%s: %s: replacing the transactional producer", what, error.str())
            self._replace()
            raise KafkaFailure(f"{what}: {error.str()}; the transaction was aborted and the producer "
                               "replaced", kind="TransactionFatal", retriable=True) from exc
        except Hung:
            pass
        log.warning("%s did not return in %.0f s (librdkafka#5456): replacing the transactional producer",
                    what, TXN_TIMEOUT_S + 5)
        if self._settings is None:
            raise BrokerUnavailable(f"{what} hung", kind="TransactionHung")
        self._replace()
        raise KafkaFailure(f"{what} hung; the transaction was aborted and the producer replaced",
                           kind="TransactionHung", retriable=True)

    def _replace(self) -> None:
        """A fresh producer with the same transactional id: its init_transactions() fences the old one and
        aborts the old one's open transaction."""
        assert self._settings is not None
        fresh = _RdProducer(self._settings)
        with _translated:
            fresh.init_transactions(TIMEOUT_S * 2)
        self._p = fresh
        self._replaced = True  # no transaction of its own open yet: nothing to abort

    def send(self, topic: str, value: bytes | None, key: bytes | None = None, *, partition: int | None = None,
             headers: Sequence[Header] | None = None, timestamp_ms: int | None = None) -> _Future:
        future = _Future(self)
        kwargs: dict[str, Any] = {"on_delivery": future._report}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = list(headers)
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        self._produce(topic, value, key, kwargs)
        return future

    def send_in_transaction(self, topic: str, value: bytes | None, key: bytes | None = None, *,
                            partition: int | None = None, headers: Sequence[Header] | None = None) -> None:
        # No on_delivery: librdkafka then serves the record's report in C. A report per record cost the
        # loop a Python call with a Message object made for it (docs/benchmarks.md); a failed record fails
        # the transaction, which commit_transaction raises.
        kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
        if headers:
            kwargs["headers"] = list(headers)
        self._produce(topic, value, key, kwargs)

    def send_all_in_transaction(self, records: Sequence[Outgoing]) -> None:
        # One Python call per record, not the five layers of send_in_transaction and a kwargs dict. A full
        # queue or a refusal goes the one-record way, which waits for room or raises.
        produce, queued = self._p.produce, 0
        for r in records:
            partition = _UNASSIGNED if r.partition is None else r.partition
            try:
                if r.headers:
                    produce(r.topic, r.value, r.key, partition, headers=list(r.headers))
                else:
                    produce(r.topic, r.value, r.key, partition)
                queued += 1
            except (BufferError, KafkaException):
                self.send_in_transaction(r.topic, r.value, r.key, partition=r.partition, headers=r.headers)
        self._count(queued)

    def _produce(self, topic: str, value: bytes | None, key: bytes | None, kwargs: dict[str, Any]) -> None:
        while True:
            try:
                self._p.produce(topic, value, key, **kwargs)
                break
            except BufferError:  # the local queue is full: serve delivery reports until there is room
                self._p.poll(0.05)
            except KafkaException as exc:
                raise self._refusal(exc) from exc
        self._count(1)

    def _refusal(self, exc: KafkaException) -> BaseException:
        """The seam's error for a record librdkafka would not queue. Once a transaction has failed (e.g. the
        broker refused to add a partition, TOPIC_AUTHORIZATION_FAILED), every record is refused with _STATE
        ("Erroneous state") and the cause is kept for the next transactional call: begin_transaction()
        answers with it and changes nothing, as it acts only in state READY, before any record."""
        error = exc.args[0] if exc.args else None
        if self._settings is None or not isinstance(error, KafkaError) or error.code() != KafkaError._STATE:
            return translate(exc)
        try:
            self._p.begin_transaction()
        except KafkaException as state:
            cause = state.args[0] if state.args else None
            if isinstance(cause, KafkaError) and cause.code() != KafkaError._STATE:
                return translate(state)
        return translate(exc)

    def _count(self, sends: int) -> None:
        before, self._sends = self._sends, self._sends + sends
        if before // 1000 != self._sends // 1000:
            self._p.poll(0)  # delivery reports, without waiting

    def partitions_for(self, topic: str) -> list[int] | None:
        # A metadata request per call cost the stage half its time (one per group): known partitions are kept
        # for a while, as the Java client and kafka-python keep their metadata.
        known = self._partitions.get(topic)
        now = time.monotonic()
        if known is not None and now - known[0] < PARTITIONS_TTL_S:
            return known[1]
        try:
            meta = self._p.list_topics(topic, timeout=TIMEOUT_S)
        except KafkaException:
            return None
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return None
        partitions = sorted(found.partitions)
        self._partitions[topic] = (now, partitions)
        return partitions

    def partition_for(self, topic: str, key: bytes) -> int | None:
        # librdkafka's `murmur2_random` partitioner (ConfluentClient.producer) puts a keyed record where Java
        # would, in C: naming the partition from Python cost the stage a murmur2 in Python per group
        # (docs/benchmarks.md).
        return None

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every record sent; raise the first one the broker refused since the last flush. librdkafka
        reports refusals (no Write ACL) only in delivery reports: synth exited 0 having delivered nothing."""
        with _translated:
            self._p.flush(-1 if timeout is None else timeout)
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def close(self, timeout: float | None = None) -> None:
        try:
            self._p.flush(-1 if timeout is None else timeout)
        except KafkaException as exc:  # e.g. a transaction left fatal by an interrupt: what failed was said
            log.warning("closing the producer: %s", exc.args[0].str() if exc.args else exc)
        failed, self._failed = self._failed, None
        if failed is not None:  # records the broker refused are not dropped silently on closing either
            raise failed

    def init_transactions(self) -> None:
        with _translated:
            self._p.init_transactions(TIMEOUT_S * 2)

    def begin_transaction(self) -> None:
        with _translated:
            self._p.begin_transaction()
        self._replaced = False

    def send_offsets_to_transaction(self, offsets: Offsets, group_metadata: Any) -> None:
        positions = _rd_offsets(offsets)
        self._transactional("send_offsets_to_transaction",
                            lambda p: p.send_offsets_to_transaction(positions, group_metadata, TXN_TIMEOUT_S))

    def commit_transaction(self) -> None:
        self._resumed("commit_transaction", lambda p: p.commit_transaction(TXN_TIMEOUT_S))

    def abort_transaction(self) -> None:
        if self._replaced:  # its predecessor's transaction was aborted by the replacement
            self._replaced = False
            return
        try:
            self._resumed("abort_transaction", lambda p: p.abort_transaction(TXN_TIMEOUT_S))
        except KafkaFailure:
            if not self._replaced:
                raise
            # The abort failed for good and the producer was replaced, whose init_transactions() aborted the
            # transaction: what was asked. Seen as INVALID_TXN_STATE on an abort right after a begin and a
            # send (librdkafka#4849).
            self._replaced = False

    def _resumed(self, what: str, call: Any) -> None:
        """librdkafka's contract for commit and abort: a retriable error (e.g. _TIMED_OUT while a coordinator
        moves) means "call again to resume"; aborting instead fails with _CONFLICT (the commit is still in
        progress). Seen on the 3-node cluster when the coordinator's broker was killed. (Ctrl-C cannot
        interleave an abort here: call_within lets the interrupted call finish first.)"""
        deadline = time.monotonic() + 3 * TXN_TIMEOUT_S
        while True:
            try:
                self._transactional(what, call)
                return
            except KafkaFailure as exc:
                error = exc.__cause__.args[0] if isinstance(exc.__cause__, KafkaException) else None
                if not (isinstance(error, KafkaError) and error.retriable()) or time.monotonic() > deadline:
                    raise
                log.warning("%s: %s; calling it again to resume (librdkafka's contract)", what, error.str())
