"""The client's ceiling: consume raw bytes → produce raw bytes → commit, with the worker's clients.

No decode, no windows, no normalization: what is left is what the Kafka client costs for the same records
under the same delivery guarantee (exactly-once: one transaction per commit carrying the outputs and
the input offsets via send_offsets_to_transaction; at-least-once: flush, then commit offsets).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Literal

from rollout_stream.clients import Connection
from rollout_stream.kafka import GroupConsumer, KafkaFailure, Producer, TopicPartition, client_for
from rollout_stream.worker.cadence import POLL_RECORDS, CommitCadence, caught_up

__all__ = ["Passthrough"]

REJOIN_S = 10.0
"""No partition for this long after subscribing: rejoin the group (a drain that reads nothing is retried)."""


class _Rebalances:
    """The passthrough keeps no state per partition: a rebalance needs nothing from it."""

    def on_assigned(self, partitions: set[int]) -> None: ...
    def on_revoked(self, partitions: set[int]) -> None: ...
    def on_lost(self, partitions: set[int]) -> None: ...


class Passthrough:
    """Copies every record of the input topic to the output topic; counters readable from other threads."""

    def __init__(
        self,
        conn: Connection,
        *,
        group_id: str,
        input_topic: str,
        output_topic: str,
        delivery: Literal["exactly-once", "at-least-once"],
        commit_interval_s: float,
        commit_max_records: int,
        max_record_bytes: int,
        session_timeout_s: float = 45.0,
        transactional_id: str | None = None,
        transaction_timeout_s: float = 60.0,
        extra_work_us: float = 0.0,
    ) -> None:
        self.conn, self.group_id = conn, group_id
        self.input_topic, self.output_topic = input_topic, output_topic
        self.eos = delivery == "exactly-once"
        self.cadence = CommitCadence(commit_interval_s, commit_max_records)  # the worker's
        self.max_record_bytes, self.session_timeout_s = max_record_bytes, session_timeout_s
        self.transactional_id = transactional_id or f"bench-passthrough-{group_id}"
        self.transaction_timeout_s = transaction_timeout_s
        # Calibration only: busy CPU work per record, to find how much the loop absorbs (headroom_bench.py).
        self.extra_work_s = extra_work_us / 1e6
        self.records_in = 0
        self.bytes_in = 0
        self.commits = 0
        self.committed: dict[int, int] = {}
        self._stop = threading.Event()

    def request_stop(self) -> None:
        self._stop.set()

    def commit_soon(self) -> None:
        self.cadence.soon()

    def run(self) -> None:
        client = client_for(self.conn)
        consumer = client.group_consumer(self.group_id, client_id=self.conn.client_id,
                                         max_record_bytes=self.max_record_bytes,
                                         session_timeout_s=self.session_timeout_s, rejoin_after_s=REJOIN_S)
        if self.eos:
            producer = client.producer(client_id=self.conn.client_id, max_record_bytes=self.max_record_bytes,
                                       transactional_id=self.transactional_id,
                                       transaction_timeout_s=self.transaction_timeout_s)
            producer.init_transactions()
        else:
            producer = client.producer(client_id=self.conn.client_id, max_record_bytes=self.max_record_bytes)
        consumer.subscribe(self.input_topic, _Rebalances())
        positions: dict[int, int] = {}
        in_txn = False
        self.cadence.committed(time.monotonic())
        try:
            while not self._stop.is_set():
                wait_ms = self.cadence.poll_timeout_ms(time.monotonic())
                batch = consumer.poll(wait_ms / 1000, POLL_RECORDS)
                for tp, records in batch.items():
                    for rec in records:
                        if self.eos and not in_txn:
                            producer.begin_transaction()
                            in_txn = True
                        if self.extra_work_s:
                            _busy(self.extra_work_s)
                        # The record as it came, headers too (a chunk record's manifest header).
                        headers = rec.headers or None
                        if self.eos:  # as the stage's ExactlyOnce sends: no report per record
                            producer.send_in_transaction(self.output_topic, rec.value, rec.key,
                                                         headers=headers)
                        else:
                            producer.send(self.output_topic, rec.value, rec.key, headers=headers)
                        positions[tp.partition] = rec.offset + 1
                        self.records_in += 1
                        self.bytes_in += len(rec.value or b"") + len(rec.key or b"")
                        self.cadence.uncommitted += 1
                        self.cadence.outputs += 1
                now = time.monotonic()
                returned = sum(map(len, batch.values()))
                if self.cadence.due(now, caught_up=caught_up(consumer, returned)):
                    self.cadence.committed(now)
                    due = {p: o for p, o in positions.items() if o > self.committed.get(p, -1)}
                    in_txn = self._commit(producer, consumer, due, in_txn)
                    self.cadence.finished(time.monotonic())
        finally:
            try:
                if in_txn:
                    producer.abort_transaction()
            except KafkaFailure as exc:
                # What was measured is committed; a broker refusing to abort what is left at shutdown
                # ("invalid state", seen once on librdkafka) must not fail the run and have it repeated.
                print(f"passthrough: abort at shutdown failed: {exc}", file=sys.stderr, flush=True)
            finally:
                consumer.close()
                producer.close(timeout=30)

    def _commit(self, producer: Producer, consumer: GroupConsumer, due: dict[int, int], in_txn: bool) -> bool:
        offsets = {TopicPartition(self.input_topic, p): o for p, o in due.items()}
        if self.eos:
            if due and not in_txn:
                producer.begin_transaction()
                in_txn = True
            if due:
                producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            if in_txn:
                producer.commit_transaction()
        else:
            producer.flush()
            if due:
                consumer.commit(offsets)
        if due:
            self.committed.update(due)
            self.commits += 1
        return False


def _busy(seconds: float) -> None:
    """Hold the CPU (and the GIL, as the stage's own Python work does) for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
