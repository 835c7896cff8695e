"""kafka-python's producer: a send that failed before leaving raises at once, transactional calls are bounded
in time (a hung producer is replaced), a key's partition is computed once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import kafka.errors as ke
from kafka import KafkaProducer
from kafka.partitioner.default import murmur2

from rollout_stream.kafka.bounded import Hung, call_within
from rollout_stream.kafka.errors import BrokerUnavailable, KafkaFailure
from rollout_stream.kafka.kafka_python.convert import _offsets
from rollout_stream.kafka.kafka_python.errors import _translated, translate
from rollout_stream.kafka.seam import Header, Offsets, Outgoing, Written
from rollout_stream.logs import log_event

log = logging.getLogger("rollout_stream.kafka")

# A transactional call (send_offsets_to_transaction, commit, abort) takes milliseconds. kafka-python 3.0 can
# wait for it forever once the broker of the group or transaction coordinator is SIGKILLed (seen on the
# local 3-node cluster: TxnOffsetCommit never answered, never retried); past this the producer is replaced.
TXN_TIMEOUT_S = 15.0


class _Future:
    __slots__ = ("_f",)

    def __init__(self, future: Any) -> None:
        self._f = future

    def done(self) -> bool:
        done: bool = self._f.is_done
        return done

    def exception(self) -> BaseException | None:
        if not self._f.is_done or not self._f.failed():
            return None
        failure: BaseException = self._f.exception
        return translate(failure)

    def get(self, timeout: float | None = None) -> Written:
        with _translated:
            md = self._f.get(timeout)
        stamp = getattr(md, "timestamp", None)
        return Written(md.topic, md.partition, md.offset, stamp if stamp is not None and stamp >= 0 else None)


class _Producer:
    def __init__(self, producer: KafkaProducer, settings: dict[str, Any] | None = None) -> None:
        self._p = producer
        self._settings = settings  # a transactional producer's, to build a fresh one when a call hangs
        self._needs_init = False  # a fresh producer whose init_transactions() has not succeeded yet
        self._replaced = False  # no transaction of its own open yet: nothing to abort

    def _transactional(self, what: str, call: Any) -> None:
        """A transactional call, bounded in time (TXN_TIMEOUT_S). Past it, the wedged producer is abandoned
        for a fresh one with the same transactional id, whose init_transactions() fences the old one and
        aborts its open transaction; the call fails as an aborted transaction would (retriable), so the
        worker restores from its last commit and goes on."""
        producer = self._p
        try:
            with _translated:
                call_within(TXN_TIMEOUT_S, lambda: call(producer), f"kafka-python-{what}")
            return
        except Hung:
            pass
        log_event(log, "producer.replaced", logging.WARNING, call=what, after_s=TXN_TIMEOUT_S,
                  reason="a transactional call did not return (its coordinator's broker went away)")
        if self._settings is None:
            raise BrokerUnavailable(f"{what} hung", kind="TransactionHung")
        stuck = self._p

        def close_stuck() -> None:
            try:
                stuck.close(timeout=0)
            except Exception:  # noqa: BLE001 - it is being abandoned: whatever it says is moot
                pass

        threading.Thread(target=close_stuck, name="kafka-python-abandoned", daemon=True).start()
        with _translated:
            self._p = KafkaProducer(**self._settings)
        self._needs_init, self._replaced = True, True
        self._init()
        raise KafkaFailure(f"{what} hung for {TXN_TIMEOUT_S:g} s; the transaction was aborted and the "
                           "producer replaced", kind="TransactionHung", retriable=True)

    def _init(self) -> None:
        with _translated:
            self._p.init_transactions()
        self._needs_init = False

    def send(self, topic: str, value: bytes | None, key: bytes | None = None, *, partition: int | None = None,
             headers: Sequence[Header] | None = None, timestamp_ms: int | None = None) -> _Future:
        with _translated:
            future = self._p.send(topic, value=value, key=key, headers=list(headers) if headers else None,
                                  partition=partition, timestamp_ms=timestamp_ms)
        if future.is_done and future.failed():  # refused before it left (e.g. no Describe on the topic)
            raise translate(future.exception)
        return _Future(future)

    def send_in_transaction(self, topic: str, value: bytes | None, key: bytes | None = None, *,
                            partition: int | None = None, headers: Sequence[Header] | None = None) -> None:
        self.send(topic, value, key, partition=partition, headers=headers)  # kafka-python makes one anyway

    def send_all_in_transaction(self, records: Sequence[Outgoing]) -> None:
        for r in records:
            self.send(r.topic, r.value, r.key, partition=r.partition, headers=r.headers)

    def partitions_for(self, topic: str) -> list[int] | None:
        try:
            found = self._p.partitions_for(topic)
        except ke.KafkaError:
            return None
        return sorted(found) if found else None

    def partition_for(self, topic: str, key: bytes) -> int | None:
        # kafka-python runs murmur2 in pure Python for every send (a quarter of `send()` in the stage's
        # profile); members of a group share their key, so the stage asks once per group and names it.
        partitions = self.partitions_for(topic)
        if not partitions:
            return None
        index: int = (murmur2(key) & 0x7FFFFFFF) % len(partitions)
        return partitions[index]

    def flush(self, timeout: float | None = None) -> None:
        with _translated:
            self._p.flush(timeout=timeout)

    def close(self, timeout: float | None = None) -> None:
        self._p.close(timeout=timeout)

    def init_transactions(self) -> None:
        self._init()

    def begin_transaction(self) -> None:
        if self._needs_init:  # the fresh producer's first init failed (no coordinator yet): again now
            self._init()
        with _translated:
            self._p.begin_transaction()
        self._replaced = False

    def send_offsets_to_transaction(self, offsets: Offsets, group_metadata: Any) -> None:
        positions = _offsets(offsets)
        self._transactional("send_offsets_to_transaction",
                            lambda p: p.send_offsets_to_transaction(positions, group_metadata))

    def commit_transaction(self) -> None:
        self._transactional("commit_transaction", lambda p: p.commit_transaction())

    def abort_transaction(self) -> None:
        if self._replaced:  # the fresh producer's init_transactions() aborted the open transaction already
            return
        try:
            self._transactional("abort_transaction", lambda p: p.abort_transaction())
        except KafkaFailure:
            if not self._replaced:
                raise
            # The abort hung and the producer was replaced, whose init_transactions() aborted the
            # transaction: what was asked.
