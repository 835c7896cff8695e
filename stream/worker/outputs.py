"""What the stage writes: train-data records for published groups, dead-letter records with their headers."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

import msgspec

from rollout_stream.codec import TrainSample, encode_train_sample, encode_train_samples
from rollout_stream.codec import headers as H
from rollout_stream.codec.chunks import CHUNK_HEADER, split
from rollout_stream.core.config import RewardConfig
from rollout_stream.core.records import DeadLettered, InputRecord, Published

__all__ = ["STAGE_VERSION", "OutputRecord", "train_records", "dead_letter_records", "DLQ_HEADERS", "chunked"]

try:
    STAGE_VERSION = version("rollout-stream")
except PackageNotFoundError:  # running from a source tree without installation
    STAGE_VERSION = "0+unknown"

DLQ_HEADERS = H.DEAD_LETTER_HEADERS
# Kafka headers should stay small; the full message is also logged.
_MAX_MESSAGE_HEADER = 4096


class OutputRecord(msgspec.Struct, frozen=True, gc=False):
    """One record the stage writes (a struct: one is built per published sample)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]]
    source: InputRecord
    partition: int | None = None  # None: the producer's partitioner picks it from the key


def train_records(
    group: Published, reward: RewardConfig, topic: str, partition: int | None = None
) -> list[OutputRecord]:
    """One train sample per member, in the group's publication order, keyed by the group (all to `partition`
    when given: the one the key maps to, computed once per group)."""
    key = group.group_key.encode()
    stats = group.rewards
    members = group.members
    first = members[0].record
    # What every member of the group shares, built once: each member's record is a copy with its own
    # sample bytes, rewards and source (one struct copy instead of a 17-field construction and the copy
    # encode_train_sample makes to embed the raw bytes; tests/stream/worker/test_train_records.py checks the
    # bytes against that path).
    shared = TrainSample(
        sample=_NO_SAMPLE,  # type: ignore[arg-type]  # replaced in every copy
        raw_reward=0.0,
        reward=0.0,
        group_key=group.group_key,
        group_rollout_count=stats.rollout_count,
        group_sample_count=len(group.members),
        group_mean=stats.mean,
        group_std=stats.std,
        zero_variance=stats.zero_variance,
        advantage_estimator=reward.advantage_estimator,
        rewards_normalization=reward.rewards_normalization,
        grpo_std_normalization=reward.grpo_std_normalization,
        reward_key=reward.reward_key,
        source_topic=first.topic,
        source_partition=first.partition,
        source_offset=0,
        stage_version=STAGE_VERSION,
    )
    # as always: a window holds valid records (with their bytes) of one partition of one topic
    if all(m.record.value is not None and m.record.partition == first.partition
           and m.record.topic == first.topic for m in members):
        sources = [m.record for m in members]
        values = encode_train_samples(shared, [src.value for src in sources if src.value is not None],
                                      stats.raw, stats.rewards, [src.offset for src in sources])
        return [OutputRecord(topic, key, value, (), src, partition)
                for value, src in zip(values, sources, strict=True)]
    out: list[OutputRecord] = []
    for member, raw, value in zip(members, stats.raw, stats.rewards, strict=True):
        src = member.record
        # The original input bytes verbatim (a valid member always has them): unknown fields survive.
        sample = member.sample if src.value is None else msgspec.Raw(src.value)
        train = _copy(shared, sample=sample, raw_reward=raw, reward=value, source_topic=src.topic,
                      source_partition=src.partition, source_offset=src.offset)
        out.append(OutputRecord(topic, key, encode_train_sample(train), (), src, partition))
    return out


_NO_SAMPLE = msgspec.Raw(b"")
_copy = msgspec.structs.replace


def chunked(outs: list[OutputRecord], chunk_bytes: int) -> list[OutputRecord]:
    """`outs` with each value larger than `chunk_bytes` as chunk records of its key (docs/chunks.md), in
    place and in order; a chunk refused whole (it carries its header) goes out as it came."""
    if all(out.value is None or len(out.value) <= chunk_bytes for out in outs):
        return outs
    result: list[OutputRecord] = []
    for out in outs:
        value = out.value
        if value is None or len(value) <= chunk_bytes or any(k == CHUNK_HEADER for k, _ in out.headers):
            result.append(out)
            continue
        result += [OutputRecord(out.topic, out.key, part, (*out.headers, (CHUNK_HEADER, header)), out.source,
                                out.partition) for header, part in split(value, chunk_bytes)]
    return result


def _iso_ms(ms: int) -> str:
    return (
        dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def dead_letter_records(failure: DeadLettered, topic: str) -> list[OutputRecord]:
    """Every refused record with its original key and value bytes and the docs/spec.md §4.4 headers."""
    message = failure.message
    if len(message) > _MAX_MESSAGE_HEADER:
        message = message[: _MAX_MESSAGE_HEADER - 1] + "…"
    out: list[OutputRecord] = []
    for src in failure.records:
        # A replayed record that fails again keeps the time it first failed.
        first_failed = next((v for k, v in src.headers if k == H.FAILED_AT), None) \
            or _iso_ms(failure.first_failed_at_ms).encode()
        headers = [
            (H.REASON, failure.reason.value.encode()),
            (H.MESSAGE, message.encode()),
            (H.ORIGINAL_TOPIC, src.topic.encode()),
            (H.ORIGINAL_PARTITION, str(src.partition).encode()),
            (H.ORIGINAL_OFFSET, str(src.offset).encode()),
            (H.ORIGINAL_TIMESTAMP, str(src.timestamp_ms).encode()),
            (H.GROUP_KEY, (failure.group_key or "").encode()),
            (H.STAGE_VERSION, STAGE_VERSION.encode()),
            (H.FAILED_AT, first_failed),
        ]
        # Producer headers travel along (lineage), minus any stale dead-letter headers of an earlier pass.
        headers += [(k, v) for k, v in src.headers if k not in DLQ_HEADERS]
        out.append(OutputRecord(topic, src.key, src.value, headers, src))
    return out
