"""A consumer slower than its fetcher reads a backlog without idle pauses.

librdkafka stops fetching a partition whose local queue is over its threshold and, by default, looks again
only a second later: a backlog then came in bursts with idle seconds between (the stage's 32K-token drains
ran at 1,200 samples/s instead of 3,000). The seam's consumers look again after 20 ms.
"""

from __future__ import annotations

import time

from rollout_stream.clients import Connection
from rollout_stream.kafka import TopicPartition, client_for
from rollout_stream.kafka.kafka_python import raw_producer

RECORDS, RECORD_BYTES = 200, 64 * 1024  # 12.5 MiB: a dozen times the queue this test gives librdkafka


def test_a_slow_consumer_reads_a_backlog_larger_than_its_fetch_queue_without_idle_pauses(
    kafka_bootstrap, topic_factory, kafka_client
):
    conn = Connection(kafka_bootstrap)
    topic = topic_factory(1)
    producer = raw_producer(conn)
    for i in range(RECORDS):
        producer.send(topic, key=b"k", value=bytes([i % 256]) * RECORD_BYTES)
    producer.flush()
    producer.close()
    # librdkafka's queue threshold at 1 MiB, so that the backlog overruns it a dozen times (kafka-python has
    # no such queue: the same reading must hold there too).
    tuning = {"queued.max.messages.kbytes": 1024} if kafka_client == "confluent" else {}
    consumer = client_for(conn).assigned_consumer(client_id="fetch-queue-test", max_record_bytes=1 << 20,
                                                  **tuning)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        seen, longest_gap, last = 0, 0.0, None
        started = time.monotonic()
        while seen < RECORDS and time.monotonic() - started < 60:
            got = sum(map(len, consumer.poll(1.0, 10).values()))
            now = time.monotonic()
            if got:
                if last is not None:
                    longest_gap = max(longest_gap, now - last)
                seen, last = seen + got, now
            time.sleep(0.005)  # the consumer's own work per poll: the fetcher runs ahead of it
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    assert seen == RECORDS
    # With librdkafka's default 1 s pause: about 10 s in all and gaps of about a second.
    assert longest_gap < 0.5, f"records stopped coming for {longest_gap:.2f} s"
    assert elapsed < 8.0, f"{RECORDS} records took {elapsed:.1f} s"
