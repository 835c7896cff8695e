"""Classic group protocol against KIP-848's (`group.protocol=consumer`, Kafka 4.x) on librdkafka: how long a
consumer waits for its partitions, alone and when a second member joins, and whether exactly-once commits
(send_offsets_to_transaction with the consumer's group metadata) work on each. The new protocol is worth
taking only if it measures better.

    .venv/bin/python bench/scripts/group_protocol_bench.py --bootstrap-servers \
        127.0.0.1:9092 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]  # confluent_kafka.admin exports it at run time

PARTITIONS = 6


def _consumer(bootstrap: str, group: str, protocol: str) -> Consumer:
    settings = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                "isolation.level": "read_committed", "auto.offset.reset": "earliest"}
    if protocol == "consumer":
        settings["group.protocol"] = "consumer"  # the broker assigns; session settings are the broker's
    else:
        settings.update({"partition.assignment.strategy": "range", "session.timeout.ms": 45000,
                         "heartbeat.interval.ms": 3000})  # the worker's (kafka.heartbeat_interval_ms)
    return Consumer(settings)


def _wait_assigned(consumers: list[Consumer], want: int, timeout: float = 60.0) -> float:
    """Seconds until the members hold `want` partitions between them, each member at least one."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        for c in consumers:
            c.poll(0.02)
        held = [len(c.assignment()) for c in consumers]
        if sum(held) == want and all(held):
            return time.monotonic() - started
    raise TimeoutError(f"not assigned within {timeout} s")


def one_round(bootstrap: str, topic: str, protocol: str) -> tuple[float, float, bool]:
    group = f"gp-{protocol}-{uuid.uuid4().hex[:6]}"
    first = _consumer(bootstrap, group, protocol)
    first.subscribe([topic])
    alone = _wait_assigned([first], PARTITIONS)
    # Exactly-once commit with this protocol's group metadata.
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{group}-txn"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"x", partition=0)
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 1)], first.consumer_group_metadata(), 30)
    producer.commit_transaction(30)
    committed = first.committed([TopicPartition(topic, 0)], timeout=30)[0].offset == 1
    second = _consumer(bootstrap, group, protocol)
    second.subscribe([topic])
    joined = _wait_assigned([first, second], PARTITIONS)
    for c in (first, second):
        c.close()
    return alone, joined, committed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    topic = f"gp-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap_servers})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    try:
        for protocol in ("classic", "consumer"):
            rounds = [one_round(args.bootstrap_servers, topic, protocol) for _ in range(args.rounds)]
            alone = [r[0] for r in rounds]
            joined = [r[1] for r in rounds]
            print(f"{protocol:8s}: assigned alone median {statistics.median(alone):.2f} s "
                  f"(range {min(alone):.2f}-{max(alone):.2f}); second member in, both assigned median "
                  f"{statistics.median(joined):.2f} s (range {min(joined):.2f}-{max(joined):.2f}); "
                  f"transactional offset commit worked in {sum(r[2] for r in rounds)}/{len(rounds)}")
    finally:
        admin.delete_topics([topic])


if __name__ == "__main__":
    main()
