"""The benchmark's latency measurement on the real broker: it reports the delay a stage adds, waits for every
group it offered, and is not fooled by other records arriving on the output topic meanwhile."""

from __future__ import annotations

import gc
import threading
import time
from collections import deque

import pytest
from kafka import TopicPartition

from bench.latency import measure_latency
from bench.workloads import Workload
from rollout_stream.clients import Connection
from rollout_stream.kafka.kafka_python import raw_consumer, raw_producer

# any client: the latency arithmetic over records any client reads
pytestmark = pytest.mark.any_client

DELAY_S = 0.3


class _DelayingForwarder(threading.Thread):
    """Copies input records to the output topic DELAY_S after reading them, while writing records with keys
    of its own (a backlog of older groups) to the output topic all along."""

    def __init__(self, conn: Connection, input_topic: str, output_topic: str) -> None:
        super().__init__(daemon=True)
        self.conn, self.input_topic, self.output_topic = conn, input_topic, output_topic
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.forwarded = 0

    def run(self) -> None:
        consumer = raw_consumer(self.conn, group_id=None, fetch_max_wait_ms=10)
        producer = raw_producer(self.conn, linger_ms=0)
        tps = [TopicPartition(self.input_topic, p) for p in consumer.partitions_for_topic(self.input_topic)]
        consumer.assign(tps)
        consumer.seek_to_end(*tps)
        for tp in tps:
            consumer.position(tp)
        self.ready.set()
        held: deque[tuple[float, bytes, bytes]] = deque()
        noise = 0
        try:
            while not self.stop.is_set():
                for records in consumer.poll(timeout_ms=5).values():
                    held.extend((time.monotonic() + DELAY_S, r.key, r.value) for r in records)
                while held and held[0][0] <= time.monotonic():
                    _, key, value = held.popleft()
                    producer.send(self.output_topic, key=key, value=value)
                    self.forwarded += 1
                for _ in range(4):  # several foreign keys per offered group
                    producer.send(self.output_topic, key=f"older-group/{noise}".encode(), value=b"x")
                    noise += 1
                producer.flush()
        finally:
            consumer.close(autocommit=False)
            producer.close(timeout=5)


@pytest.mark.kafka(timeout=60)
def test_latency_is_the_added_delay_for_every_offered_group(kafka_bootstrap, topic_factory):
    conn = Connection(kafka_bootstrap)
    input_topic, output_topic = topic_factory(2), topic_factory(2)
    forwarder = _DelayingForwarder(conn, input_topic, output_topic)
    forwarder.start()
    assert forwarder.ready.wait(20)
    try:
        result = measure_latency(conn, input_topic, output_topic, Workload("a", 64, 4, 1), rate=200.0,
                                 seconds=1.5, run_id="latency-test")
    finally:
        forwarder.stop.set()
        forwarder.join(10)
    # Foreign keys outnumber the offered groups long before the last group is forwarded: the measurement
    # must still wait for each offered group by its key.
    assert result.groups == 75 and result.seen == result.groups, result
    assert result.p50_ms is not None and result.p99_ms is not None
    assert DELAY_S * 1000 <= result.p50_ms <= result.p99_ms < DELAY_S * 1000 + 700, result
    # The phase stops this process's collector while the clock runs, and gives it back as it found it.
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.kafka(timeout=60)
def test_a_group_never_seen_counts_with_the_time_waited_for_it(kafka_bootstrap, topic_factory):
    """Left out, groups a stage never published (it fell behind, or a record was lost) would improve its
    percentiles: they count with the wait, a lower bound of their latency."""
    conn = Connection(kafka_bootstrap)
    input_topic, output_topic = topic_factory(2), topic_factory(2)
    result = measure_latency(conn, input_topic, output_topic, Workload("a", 64, 4, 1), rate=200.0,
                             seconds=0.5, run_id="latency-unseen", drain_s=1.0)
    assert result.groups == 25 and result.seen == 0, result
    assert result.p50_ms is not None and result.p99_ms is not None and result.max_ms is not None
    assert 1000 <= result.p50_ms <= result.p99_ms <= result.max_ms < 1000 + 500 + 1000, result
