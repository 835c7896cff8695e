"""Checkpoint records on the admission log: find the newest to start a fold from, write one when due.

A newcomer reads the log's tail backwards, `WINDOW` records at a time, for the newest `Checkpoint` it can
load; it folds from there (`rollout_stream.core.checkpoint`). With none (a young log, or only checkpoints of
another fold version) it folds from the log's start, which is right only while the log still holds its first
record: the log keeps records 7 days, so a run longer than that needs its checkpoints (a prompt source writes
one every `CHECKPOINT_EVERY` records).
"""

from __future__ import annotations

import logging
import time

import msgspec

from rollout_stream.codec.admission import Checkpoint, decode_admission
from rollout_stream.core.checkpoint import FOLD_VERSION, CheckpointMismatch, dump_fold, load_fold
from rollout_stream.core.prompts import PromptLog
from rollout_stream.kafka import AssignedConsumer, Client, KafkaFailure, TopicPartition
from rollout_stream.logs import log_event

__all__ = ["CHECKPOINT_EVERY", "checkpoint_due", "newest_fold", "take_checkpoint"]

log = logging.getLogger("rollout_stream.pacing")

CHECKPOINT_EVERY = 100_000  # records between checkpoints: a newcomer folds at most this many (< 1 s)
WINDOW = 20_000


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
        while high > begin:
            low = max(begin, high - WINDOW)
            found = _newest_in(consumer, tp, low, high, deadline)
            if found is not None:
                try:
                    return load_fold(found.state, found.fold_version)
                except CheckpointMismatch as exc:
                    log_event(log, "checkpoint.unusable", logging.WARNING, topic=topic, through=found.through,
                              error=str(exc), action="folding from the log's start")
                    return PromptLog()
            high = low
        if begin > 0:
            log_event(log, "checkpoint.missing", logging.WARNING, topic=topic, first_offset=begin,
                      effect="the log's start was deleted and no checkpoint holds what it said")
        return PromptLog()
    finally:
        consumer.close()


def _newest_in(consumer: AssignedConsumer, tp: TopicPartition, low: int, high: int,
               deadline: float) -> Checkpoint | None:
    consumer.seek(tp, low)
    newest: Checkpoint | None = None
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
                if isinstance(record, Checkpoint):
                    newest = record
        at = max(at, consumer.fetch_position(tp))  # past a transaction's marker too (no record there)
    return newest


def checkpoint_due(fold: PromptLog, every: int = CHECKPOINT_EVERY) -> bool:
    return fold.next_offset - 1 - fold.checkpointed_through >= every


def take_checkpoint(fold: PromptLog) -> Checkpoint:
    """The fold's state as a record (call it while nothing is being folded)."""
    return Checkpoint(through=fold.next_offset - 1, fold_version=FOLD_VERSION, state=dump_fold(fold))
