"""The replay ledger: which dead-letter records were ever replayed, whatever the selection that replayed them.

A compacted topic `<dead-letter topic>.replays`, one record per replayed dead-letter record (key
`PARTITION:OFFSET`), written in the same transaction as the replayed record itself. The per-selection
cursor (stream/ops/dlq/cursor.py) makes an identical second run cheap; the ledger makes overlapping
selections (`--reason incomplete_group`, then `--group run-7/4`) safe: a dead-letter record is
replayed at most once. A replayed copy that fails again is a new dead-letter record, which may be.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rollout_stream.clients import Connection
from rollout_stream.kafka import AssignedConsumer, TopicExists, TopicPartition, TopicSpec, client_for
from rollout_stream.names import replay_ledger_topic
from rollout_stream.ops.dlq.record import DeadLetterRecord
from rollout_stream.ops.dlq.scan import ScanStalled

__all__ = ["ReplayLedger", "ensure_ledger_topic", "load_ledger"]


@dataclass
class ReplayLedger:
    """Replayed dead-letter coordinates and the replay run that did it; one small dict per partition."""

    topic: str
    entries: dict[int, dict[int, str]] = field(default_factory=dict)

    def replayed_by(self, record: DeadLetterRecord) -> str | None:
        """The replay id that already replayed `record`, or None."""
        return self.entries.get(record.partition, {}).get(record.offset)

    def add(self, partition: int, offset: int, replay_id: str) -> None:
        self.entries.setdefault(partition, {})[offset] = sys.intern(replay_id)

    def __len__(self) -> int:
        return sum(len(v) for v in self.entries.values())

    def entry(self, record: DeadLetterRecord, replay_id: str, to: str, cursor: str) -> tuple[bytes, bytes]:
        """(key, value) of the ledger record for one replayed dead-letter record."""
        value = {"replay_id": replay_id, "to": to, "cursor": cursor, "at_ms": int(time.time() * 1000)}
        return f"{record.partition}:{record.offset}".encode(), json.dumps(
            value, separators=(",", ":")
        ).encode()


def ensure_ledger_topic(conn: Connection, dead_letter_topic: str) -> str:
    """Create the ledger topic when missing: one partition, compacted, the broker's replication factor."""
    name = replay_ledger_topic(dead_letter_topic)
    admin = client_for(conn).admin(client_id=conn.client_id)
    try:
        if name not in admin.list_topics():
            error = admin.create_topics([TopicSpec(name, 1, -1, {"cleanup.policy": "compact"})])[name]
            if error is not None and not isinstance(error, TopicExists):
                raise error
        return name
    finally:
        admin.close()


def load_ledger(
    consumer: AssignedConsumer, dead_letter_topic: str, stall_timeout_s: float = 30.0
) -> ReplayLedger:
    """Every committed ledger entry (an absent ledger is an empty one). `consumer` is read_committed."""
    ledger = ReplayLedger(replay_ledger_topic(dead_letter_topic))
    parts = consumer.partitions_for_topic(ledger.topic)
    if not parts:
        return ledger
    tps = [TopicPartition(ledger.topic, p) for p in sorted(parts)]
    ends = consumer.end_offsets(tps)
    consumer.assign(tps)
    consumer.seek_to_beginning(tps)
    last_move = time.monotonic()
    while any(consumer.position(tp) < ends[tp] for tp in tps):
        batch = consumer.poll(0.5, 5000)
        for records in batch.values():
            for rec in records:
                _read_entry(ledger, rec)
        if batch:
            last_move = time.monotonic()
        elif time.monotonic() - last_move > stall_timeout_s:
            raise ScanStalled(f"the replay ledger {ledger.topic} stopped advancing before its end offsets")
    return ledger


def _read_entry(ledger: ReplayLedger, rec: Any) -> None:
    try:
        part, _, off = (rec.key or b"").decode().partition(":")
        replay_id = json.loads(rec.value or b"{}").get("replay_id", "?")
        ledger.add(int(part), int(off), str(replay_id))
    except (ValueError, AttributeError):
        pass  # not an entry this version wrote: ignore rather than refuse to replay anything
