"""What the group heads of a train-data topic leave out: train-data records after those the last head of each
partition points at (groups a stage published without `--write-heads`), which `TrainDataReader(fetch="own")`
trainers never read. `rollout-stream lag` shows them next to such a trainer's position."""

from __future__ import annotations

import time

from rollout_stream.clients import Connection
from rollout_stream.codec import DecodeError
from rollout_stream.codec.group_heads import decode_group_head
from rollout_stream.kafka import AssignedConsumer, TopicPartition, client_for
from rollout_stream.names import heads_topic
from rollout_stream.ops.records_behind import BUDGET_S, records_from

__all__ = ["HEAD_LOOKBACK", "uncovered_records"]

HEAD_LOOKBACK = 16  # offsets before a heads partition's end read for its last head (markers sit between)


def uncovered_records(conn: Connection, topic: str) -> int:
    """Records of train-data `topic` after the records its heads topic's last head of each partition points
    at (every record of a partition whose heads partition holds none)."""
    client = client_for(conn)
    consumer = client.assigned_consumer(client_id=conn.client_id, max_record_bytes=1 << 20)
    try:
        partitions = sorted(consumer.partitions_for_topic(topic) or ())
        begin = consumer.beginning_offsets([TopicPartition(topic, p) for p in partitions])
        covered = _covered(consumer, topic, partitions)
        starts = {p: max(covered.get(p, -1) + 1, begin[TopicPartition(topic, p)]) for p in partitions}
        return records_from(consumer, topic, starts)
    finally:
        consumer.close()


def _covered(consumer: AssignedConsumer, topic: str, partitions: list[int]) -> dict[int, int]:
    """Per partition, the highest train-data offset the last head of its heads partition points at."""
    heads = heads_topic(topic)
    tps = [TopicPartition(heads, p) for p in partitions]
    begin, end = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
    spans = {tp: (max(begin[tp], end[tp] - HEAD_LOOKBACK), end[tp]) for tp in tps if end[tp] > begin[tp]}
    if not spans:
        return {}
    consumer.assign(list(spans))
    for tp, (start, _) in spans.items():
        consumer.seek(tp, start)
    out: dict[int, int] = {}
    reading = set(spans)
    deadline = time.monotonic() + BUDGET_S
    while reading and time.monotonic() < deadline:
        for tp, records in consumer.poll(0.2).items():
            for rec in records:
                try:
                    head = decode_group_head(rec.value or b"")
                except DecodeError:
                    continue
                if head.topic == topic and head.partition == tp.partition:
                    high = max(o for s in head.samples for o in s.offsets)
                    out[tp.partition] = max(out.get(tp.partition, -1), high)
        reading = {tp for tp in reading if consumer.fetch_position(tp) < spans[tp][1]}
    return out
