"""Progress records: where each party of a pipeline is, one compacted topic per train-data topic.

Keyed by party (`progress_key`), the latest record per key is the party's state; a tombstone (no value)
says a producer closed. Readers of the topic keep the newest record per key (docs/pacing.md).
"""

from __future__ import annotations

import msgspec

__all__ = ["ProducerProgress", "Progress", "StageProgress", "TrainerProgress", "decode_progress",
           "encode_progress", "progress_key"]


class TrainerProgress(msgspec.Struct, kw_only=True, tag="trainer", tag_field="type"):
    """Rank 0 of a trainer group (TrainDataReader), on set_weight_version, commit and every heartbeat."""

    group_id: str
    weight_version: int | None
    groups_per_batch: int
    max_weight_staleness: int | None
    batch: int | None  # index of the last batch yielded
    batch_version: int | None  # the weight version that batch was judged against
    consumed_groups: int  # groups taken into batches (trained or skipped) since this reader started
    skipped_stale_groups: int  # since this reader started
    trained_groups: int = 0  # groups in batches (not skipped) since this reader started
    accepted_tokens: int = 0  # tokens of the samples of those groups
    tokens_per_s: float = 0.0  # accepted tokens per second over the last minute or so
    # policy lag at consumption (the version judging the batch − the group's oldest version) -> trained groups
    lag_counts: dict[int, int] = msgspec.field(default_factory=dict)
    # staleness by rollout or token: rollouts and loss tokens left out of groups that trained, all told
    stale_rollouts: int = 0
    stale_tokens: int = 0
    # topic -> partition -> the highest source offset of a record of a group taken into a batch
    consumed_through: dict[str, dict[int, int]]
    updated_ms: int
    schema_version: int = 1


class ProducerProgress(msgspec.Struct, kw_only=True, tag="producer", tag_field="type"):
    """A paced RolloutProducer, on admit (throttled) and every heartbeat."""

    producer_id: str
    trainer_group: str
    topic: str
    newest_weight_version: int | None
    admitted: int  # groups admitted since it started
    outstanding: int  # its groups admitted and not yet consumed
    waiting: bool  # blocked in admit() now
    wait_s: float  # seconds spent waiting in admit() since it started
    updated_ms: int
    schema_version: int = 1


class StageProgress(msgspec.Struct, kw_only=True, tag="stage", tag_field="type"):
    """One worker instance, every few seconds."""

    group_id: str
    instance_id: str
    input_topic: str
    open_groups: int
    lag_records: int  # input records behind the high watermarks of its partitions
    groups_published: int  # since it started
    updated_ms: int
    schema_version: int = 1


Progress = TrainerProgress | ProducerProgress | StageProgress

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Progress)


def progress_key(record: Progress) -> bytes:
    """One key per party: its latest record is what compaction keeps."""
    if isinstance(record, TrainerProgress):
        return f"trainer/{record.group_id}".encode()
    if isinstance(record, ProducerProgress):
        return f"producer/{record.producer_id}".encode()
    return f"stage/{record.group_id}/{record.instance_id}".encode()


def encode_progress(record: Progress) -> bytes:
    return _encoder.encode(record)


def decode_progress(data: bytes | memoryview) -> Progress:
    """Raises msgspec.DecodeError (or ValidationError) for bytes that are not a progress record."""
    return _decoder.decode(data)
