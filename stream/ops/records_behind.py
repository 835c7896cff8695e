"""How many records of a topic a consumer group has not committed: records, not offsets.

A transactional writer (the stage, a paced producer) ends each transaction with a commit marker in every
partition it wrote to: an offset that no consumer ever receives. A caught-up, idle worker's commit stands just
before such a marker, so `end offset - committed offset` says 1 per partition where nothing is left to read.
Here the offsets a group has not committed are read with read_committed, which returns records only: each
marker and aborted record drops out. Only the last `TAIL_OFFSETS` offsets of a partition are read (a group far
behind counts the offsets before them as records, markers among them: a small error on a large number), and
for at most `BUDGET_S` in all (a partition not read to its end in time counts its unread offsets as records).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from rollout_stream.clients import Connection
from rollout_stream.kafka import AssignedConsumer, TopicPartition, client_for
from rollout_stream.retry import retrying

__all__ = ["BUDGET_S", "TAIL_OFFSETS", "records_behind", "records_from"]

TAIL_OFFSETS = 64
BUDGET_S = 5.0


def records_behind(conn: Connection, topic: str, groups: Mapping[str, str]) -> dict[str, int | None]:
    """Per name, the records of `topic` after the commits of its consumer group (`groups`: name → group id);
    None where the group has committed nothing."""
    if not groups:
        return {}
    client = client_for(conn)
    consumer = client.assigned_consumer(client_id=conn.client_id, max_record_bytes=1 << 20)
    admin = client.admin(client_id=conn.client_id)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return dict.fromkeys(groups)
        ends = consumer.end_offsets(tps)
        # retried: the offsets topic of a fresh cluster may still be being made
        found = retrying(lambda: admin.group_offsets(list(groups.values()), tps), within_s=10)
        committed = {name: {tp: om[0] for tp, om in found.get(group, {}).items()} for name, group in
                     groups.items()}
        # Per partition, where the tail read starts: the earliest tail a group that has committed needs.
        tails = [{tp: max(c.get(tp, 0), ends[tp] - TAIL_OFFSETS) for tp in tps}
                 for c in committed.values() if c]
        spans = {tp: (start, ends[tp]) for tp in tps
                 if tails and (start := min(t[tp] for t in tails)) < ends[tp]}
        readable = _readable_offsets(consumer, spans)
    finally:
        admin.close()
        consumer.close()
    out: dict[str, int | None] = {}
    for name, offsets in committed.items():
        if not offsets:
            out[name] = None
            continue
        behind = 0
        for tp in tps:
            c, end = offsets.get(tp, 0), ends[tp]
            if c >= end:
                continue
            tail = max(c, end - TAIL_OFFSETS)
            behind += (tail - c) + sum(1 for o in readable.get(tp, ()) if o >= tail)
        out[name] = behind
    return out


def records_from(consumer: AssignedConsumer, topic: str, starts: Mapping[int, int]) -> int:
    """The records of `topic` from `starts` (per partition, an offset) to its end, counted as `records_behind`
    counts them (read_committed, the last TAIL_OFFSETS offsets of each partition read)."""
    tps = [TopicPartition(topic, p) for p in sorted(starts)]
    ends = consumer.end_offsets(tps)
    tails = {tp: max(starts[tp.partition], ends[tp] - TAIL_OFFSETS) for tp in tps}
    readable = _readable_offsets(consumer, {tp: (tails[tp], ends[tp]) for tp in tps if tails[tp] < ends[tp]})
    return sum(max(0, tails[tp] - starts[tp.partition])
               + sum(1 for o in readable.get(tp, ()) if o >= tails[tp]) for tp in tps)


def _readable_offsets(consumer: AssignedConsumer, spans: dict[TopicPartition, tuple[int, int]]
                      ) -> dict[TopicPartition, list[int]]:
    """The offsets of the records a read_committed read of each span [start, end) returns; a span not read to
    its end within BUDGET_S has its unread offsets added as if each were a record."""
    if not spans:
        return {}
    consumer.assign(list(spans))
    for tp, (start, _end) in spans.items():
        consumer.seek(tp, start)
    seen: dict[TopicPartition, list[int]] = {tp: [] for tp in spans}
    reading = set(spans)
    deadline = time.monotonic() + BUDGET_S
    while reading and time.monotonic() < deadline:
        for tp, records in consumer.poll(0.2).items():
            key = TopicPartition(*tp)
            if key in seen:
                end = spans[key][1]
                seen[key] += [r.offset for r in records if r.offset < end]
        # the fetch position moves past markers and aborted records too: the end is reached without a record
        reading = {tp for tp in reading if consumer.fetch_position(tp) < spans[tp][1]}
    for tp in reading:  # not read to its end in time: what is left counts as records
        start, end = spans[tp]
        position = max(start, consumer.fetch_position(tp), (seen[tp][-1] + 1) if seen[tp] else start)
        seen[tp] += list(range(position, end))
    return seen
