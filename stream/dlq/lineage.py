"""What replaying one dead-letter record means: where it goes, with which headers, or why it is refused."""

from __future__ import annotations

from dataclasses import dataclass

from stream.dlq import headers as H
from stream.dlq.record import DeadLetterRecord

__all__ = ["ReplayAction", "replay_headers", "decide"]

_DROPPED = frozenset(H.FAILURE_HEADERS) | frozenset(H.REPLAY_HEADERS)


@dataclass(frozen=True, slots=True)
class ReplayAction:
    """A record to publish to `topic` with `headers`, or a refusal (`refused` says why, `topic` is None)."""

    record: DeadLetterRecord
    topic: str | None
    headers: tuple[tuple[str, bytes], ...] = ()
    refused: str | None = None

    @property
    def replay_count(self) -> int:
        """The x-replay-count the replayed record carries (or would carry)."""
        return self.record.replay_count + 1


def replay_headers(record: DeadLetterRecord, replay_id: str) -> tuple[tuple[str, bytes], ...]:
    """The record's headers without the failure headers, plus lineage (docs/dlq.md, "Replay contract").

    Kept in order: x-original-topic/partition/offset/timestamp, x-failed-at, every producer header. Replaced:
    x-replay-id, x-replay-count (previous + 1) and x-replayed-from (`topic:partition:offset` in the DLQ).
    """
    kept = tuple((k, v) for k, v in record.headers if k not in _DROPPED)
    return kept + (
        (H.REPLAY_ID, replay_id.encode()),
        (H.REPLAY_COUNT, str(record.replay_count + 1).encode()),
        (H.REPLAYED_FROM, f"{record.topic}:{record.partition}:{record.offset}".encode()),
    )


def decide(record: DeadLetterRecord, *, to: str | None, max_replays: int, replay_id: str) -> ReplayAction:
    """Replay to `to` (or the original topic) unless the record was replayed `max_replays` times already."""
    if record.replay_count >= max_replays:
        return ReplayAction(
            record,
            None,
            refused=(f"replayed {record.replay_count} time(s) already (--max-replays {max_replays})"),
        )
    topic = to or record.original_topic
    if topic is None:
        return ReplayAction(record, None, refused="no x-original-topic header: give --to TOPIC")
    if topic == record.topic:
        return ReplayAction(record, None, refused=f"its original topic is the dead-letter topic {topic}")
    return ReplayAction(record, topic, replay_headers(record, replay_id))
