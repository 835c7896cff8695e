"""What replaying one dead-letter record means: where it goes, with which headers, or why it is refused."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rollout_stream.codec import DeadLetterReason
from rollout_stream.ops.dlq import headers as H
from rollout_stream.ops.dlq.record import DeadLetterRecord
from rollout_stream.ops.dlq.values import DeadLetterValue

__all__ = ["ReplayAction", "replay_headers", "decide", "decide_value"]

_DROPPED = frozenset(H.FAILURE_HEADERS) | frozenset(H.REPLAY_HEADERS)


@dataclass(frozen=True, slots=True)
class ReplayAction:
    """A record to publish to `topic` with `headers`; or, `topic` None, a refusal or a skip saying why."""

    record: DeadLetterRecord
    topic: str | None
    headers: tuple[tuple[str, bytes], ...] = ()
    refused: str | None = None  # not replayable as it is (--max-replays reached, no original topic)
    skipped: str | None = None  # replayed already, by this or another selection (the replay ledger)
    chunks: int = 0  # on the first record of a chunked value: how many chunk records go (or not) with it

    @property
    def kind(self) -> str:
        return "refused" if self.refused else "already_replayed" if self.skipped else "replay"

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


def decide(
    record: DeadLetterRecord,
    *,
    to: str | None,
    max_replays: int,
    replay_id: str,
    replayed_by: str | None = None,
) -> ReplayAction:
    """Replay to `to` (or the original topic) unless replayed before (`replayed_by`, from the ledger) or
    its bytes were replayed `max_replays` times already (x-replay-count)."""
    if replayed_by is not None:
        return ReplayAction(record, None, skipped=f"by replay {replayed_by[:12]}")
    if record.reason == DeadLetterReason.PROMPT_ATTEMPTS_EXHAUSTED:
        return ReplayAction(record, None, refused="a prompt's record, not a rollout's: its value is the "
                                                  "prompt's attempts, not a sample")
    if record.replay_count >= max_replays:
        return ReplayAction(
            record,
            None,
            refused=f"replay count {record.replay_count} reached --max-replays {max_replays}",
        )
    topic = to or record.original_topic
    if topic is None:
        return ReplayAction(record, None, refused="no x-original-topic header: give --to TOPIC")
    if topic == record.topic:
        return ReplayAction(record, None, refused=f"its original topic is the dead-letter topic {topic}")
    return ReplayAction(record, topic, replay_headers(record, replay_id))


def decide_value(
    value: DeadLetterValue,
    *,
    to: str | None,
    max_replays: int,
    replay_id: str,
    replayed_by: str | None = None,
) -> list[ReplayAction]:
    """One action per record of `value`, all alike: a chunked value is replayed whole or not at all, since
    the worker can only reassemble it from all of its chunks under one replay id."""
    actions = [decide(r, to=to, max_replays=max_replays, replay_id=replay_id, replayed_by=replayed_by)
               for r in value.records]
    if value.chunk is None:
        return actions
    problem = value.problem()
    if replayed_by is None and problem is not None:
        why = f"chunked value not whole: {problem}"
        actions = [ReplayAction(r, None, refused=why) for r in value.records]
    elif (no := next((a for a in actions if a.topic is None), None)) is not None:
        actions = [ReplayAction(r, None, refused=no.refused, skipped=no.skipped) for r in value.records]
    return [replace(actions[0], chunks=len(actions)), *actions[1:]]
