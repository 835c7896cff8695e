"""Checkpoint records on the admission log: find the newest to start a fold from, write one when due.

A newcomer reads the log's tail backwards, `WINDOW` records at a time, for the newest whole `Checkpoint` it
can load (every part of it, when it was split); it folds from there (`rollout_stream.core.checkpoint`). A
checkpoint it cannot load (another fold version, a part missing) is passed over for an older one. With
none (a young log, or only checkpoints it cannot load) it folds from the log's start, which is right only
while the log still holds its first record: the log keeps records 7 days, so a run longer than that needs
its checkpoints (a prompt source writes one every `CHECKPOINT_EVERY` records).
"""

from __future__ import annotations

import logging
import time

import msgspec

from rollout_stream.codec.admission import Checkpoint, decode_admission
from rollout_stream.codec.chunks import DEFAULT_CHUNK_BYTES, value_digest
from rollout_stream.core.checkpoint import FOLD_VERSION, CheckpointMismatch, dump_fold, load_fold
from rollout_stream.core.prompts import PromptLog
from rollout_stream.kafka import AssignedConsumer, Client, KafkaFailure, TopicPartition
from rollout_stream.logs import log_event

__all__ = ["CHECKPOINT_EVERY", "PART_BYTES", "checkpoint_due", "newest_fold", "take_checkpoint"]

log = logging.getLogger("rollout_stream.pacing")

CHECKPOINT_EVERY = 100_000  # records between checkpoints: a newcomer folds at most this many (about 1 s)
WINDOW = 20_000
PART_BYTES = DEFAULT_CHUNK_BYTES  # a part's slice of the state: under the log's 1 MiB max.message.bytes

_Set = tuple[int, int, bytes | None, int]  # through, fold version, digest, parts


def newest_fold(client: Client, topic: str, *, client_id: str = "rollout-stream-prompts",
                timeout_s: float = 30.0) -> PromptLog:
    """A fold from the newest loadable checkpoint on `topic` (a fresh fold when there is none)."""
    consumer = client.assigned_consumer(client_id=client_id, max_record_bytes=1 << 20)
    try:
        if not consumer.partitions_for_topic(topic):
            return PromptLog()
        tp = TopicPartition(topic, 0)
        begin = consumer.beginning_offsets([tp])[tp]
        high = consumer.end_offsets([tp])[tp]
        consumer.assign([tp])
        deadline = time.monotonic() + timeout_s
        found: dict[_Set, dict[int, bytes]] = {}  # parts seen, across windows (a set may straddle two)
        passed_over = False
        while high > begin:
            low = max(begin, high - WINDOW)
            for record in _checkpoints_in(consumer, tp, low, high, deadline):
                key = (record.through, record.fold_version, record.digest, record.parts)
                found.setdefault(key, {})[record.part] = record.state
            whole = [k for k, got in found.items() if len(got) == k[3]]
            for key in sorted(whole, key=lambda k: (k[0], k[1]), reverse=True):
                fold = _load(found.pop(key), key, topic)
                if fold is not None:
                    return fold
                passed_over = True
            high = low
        if begin > 0 or passed_over:
            log_event(log, "checkpoint.missing", logging.WARNING, topic=topic, first_offset=begin,
                      effect="no loadable checkpoint: folding from the log's first record"
                             + (", whose start was deleted" if begin > 0 else ""))
        return PromptLog()
    finally:
        consumer.close()


def _load(parts: dict[int, bytes], key: _Set, topic: str) -> PromptLog | None:
    through, version, digest, count = key
    state = b"".join(parts[i] for i in range(count))
    try:
        if digest is not None and value_digest(state) != digest:
            raise CheckpointMismatch(f"its {count} parts do not add up to the state they name")
        return load_fold(state, version)
    except CheckpointMismatch as exc:
        log_event(log, "checkpoint.unusable", logging.WARNING, topic=topic, through=through, error=str(exc),
                  action="looking further back")
        return None


def _checkpoints_in(consumer: AssignedConsumer, tp: TopicPartition, low: int, high: int,
                    deadline: float) -> list[Checkpoint]:
    consumer.seek(tp, low)
    found: list[Checkpoint] = []
    at = low
    while at < high:
        if time.monotonic() > deadline:
            raise KafkaFailure(f"reading {tp.topic} from offset {low} to {high} took too long")
        for records in consumer.poll(0.2).values():
            for rec in records:
                at = rec.offset + 1
                if rec.offset >= high or b"checkpoint" not in (rec.value or b""):
                    continue
                try:
                    record = decode_admission(rec.value or b"")
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                if isinstance(record, Checkpoint) and 0 <= record.part < record.parts:
                    found.append(record)
        at = max(at, consumer.fetch_position(tp))  # past a transaction's marker too (no record there)
    return found


def checkpoint_due(fold: PromptLog, every: int = CHECKPOINT_EVERY) -> bool:
    return fold.next_offset - 1 - fold.checkpointed_through >= every


def take_checkpoint(fold: PromptLog, part_bytes: int = PART_BYTES) -> list[Checkpoint]:
    """The fold's state as records, to append in order (call it while nothing is being folded): one, or
    one per `part_bytes` of the state."""
    state = dump_fold(fold)
    through = fold.next_offset - 1
    if len(state) <= part_bytes:
        return [Checkpoint(through=through, fold_version=FOLD_VERSION, state=state)]
    digest = value_digest(state)
    count = -(-len(state) // part_bytes)
    return [Checkpoint(through=through, fold_version=FOLD_VERSION, part=i, parts=count, digest=digest,
                       state=state[i * part_bytes:(i + 1) * part_bytes]) for i in range(count)]
