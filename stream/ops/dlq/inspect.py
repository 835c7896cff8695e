"""`dlq show`: one record in full, its decoded sample or a hex preview, and its group's members nearby."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rollout_stream.codec import DeadLetterReason, DecodeError, Sample, decode_sample
from rollout_stream.codec.arrays import Array
from rollout_stream.core.rewards import RewardSelectionError, select_reward
from rollout_stream.errors import RuntimeFailure
from rollout_stream.ops.dlq.record import DeadLetterRecord, SampleHead
from rollout_stream.ops.dlq.scan import DeadLetterScanner, PartitionRange, ScanPlan
from rollout_stream.ops.dlq.values import DeadLetterValue, group_values

__all__ = [
    "RecordNotFound",
    "RolloutRewards",
    "fetch_record",
    "group_members",
    "members_of",
    "nearby_values",
    "value_of",
    "decode_value",
    "sample_fields",
    "hexdump",
    "compare_rewards",
]

# Reasons whose records were dead-lettered as a whole group, so the group's other members are nearby.
GROUP_REASONS = frozenset(
    {
        DeadLetterReason.INVALID_SAMPLE,
        DeadLetterReason.SHARED_REWARD_VIOLATION,
        DeadLetterReason.CONFLICTING_DUPLICATE,
        DeadLetterReason.INCOMPLETE_GROUP,
    }
)


class RecordNotFound(RuntimeFailure, LookupError):
    """No record at the given coordinates (out of range, compacted away, or an aborted/control record)."""


def fetch_record(scanner: DeadLetterScanner, partition: int, offset: int) -> DeadLetterRecord:
    """The record at partition:offset of the scanner's topic."""
    if partition not in scanner.partitions():
        raise RecordNotFound(f"{scanner.topic} has no partition {partition}")
    full = scanner.plan(partitions=[partition]).ranges[0]
    if not full.low <= offset < full.end:
        span = f"offsets {full.low}..{full.end - 1}" if full.end > full.low else "empty"
        raise RecordNotFound(f"offset {offset} is outside {scanner.topic}:{partition} ({span})")
    one = ScanPlan(scanner.topic, (PartitionRange(partition, full.low, offset, offset + 1),))
    for record in scanner.records(one):
        if record.offset == offset:
            return record
    raise RecordNotFound(
        f"no record at {scanner.topic}:{partition}:{offset} (a transaction marker or aborted record)"
    )


def nearby_values(
    scanner: DeadLetterScanner, record: DeadLetterRecord, context: int
) -> list[DeadLetterValue]:
    """The values within `context` offsets of `record` (its group and the rest of its chunks were written
    with it)."""
    p = record.partition
    plan = scanner.plan(
        partitions=[p], starts={p: max(0, record.offset - context)}, stops={p: record.offset + context + 1}
    )
    # One window spans the whole scan: chunks as far apart as the scan reaches still make one value.
    return group_values(scanner.records(plan), window=2 * context + 1)


def value_of(record: DeadLetterRecord, values: list[DeadLetterValue]) -> DeadLetterValue:
    """The value `record` is part of: the whole value when it is one of its chunks."""
    for value in values:
        if record.offset in value.offsets:
            return value
    return DeadLetterValue([record])


def members_of(
    values: list[DeadLetterValue], record: DeadLetterRecord
) -> list[tuple[DeadLetterRecord, SampleHead | None]]:
    """Values of the same group and reason as `record`: each as its first record and sample head."""
    group = record.group
    if group is None:
        return []
    return [(v.first, v.head()) for v in values if v.first.group == group and v.first.reason == record.reason]


def group_members(
    scanner: DeadLetterScanner, record: DeadLetterRecord, context: int
) -> list[tuple[DeadLetterRecord, SampleHead | None]]:
    """Records (values) of the same group and reason within `context` offsets of `record` (written
    together)."""
    if record.group is None:
        return []
    return members_of(nearby_values(scanner, record, context), record)


def decode_value(value: bytes | None) -> Sample | DecodeError:
    if value is None:
        return DecodeError("record has no value (tombstone)")
    try:
        return decode_sample(value)
    except DecodeError as exc:
        return exc


def _preview(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _array(a: Array | None) -> Any:
    if a is None:
        return None
    head = a.values[:8].tolist()
    return {"dtype": str(a.dtype), "length": len(a), "head": head}


def sample_fields(sample: Sample) -> list[tuple[str, Any]]:
    """The decoded sample as (field, value) pairs; arrays as dtype, length and first values."""
    return [
        ("schema_version", sample.schema_version),
        ("run_id", sample.run_id),
        ("group_index", sample.group_index),
        ("index", sample.index),
        ("rollout_id", sample.rollout_id),
        ("group_size", sample.group_size),
        ("sibling", f"{sample.sibling_index} of {sample.sibling_count}"),
        ("reward", sample.reward),
        ("status", sample.status),
        ("remove_sample", sample.remove_sample),
        ("response_length", sample.response_length),
        ("tokens", _array(sample.tokens)),
        ("loss_mask", _array(sample.loss_mask)),
        ("rollout_log_probs", _array(sample.rollout_log_probs)),
        ("weight_versions", sample.weight_versions),
        ("prompt", _preview(sample.prompt)),
        ("response", _preview(sample.response)),
        ("label", sample.label),
        ("metadata", _preview(repr(sample.metadata), 200) if sample.metadata else {}),
    ]


def hexdump(data: bytes, limit: int = 256) -> list[str]:
    """`offset  hex bytes  |ascii|` lines of the first `limit` bytes."""
    lines = []
    for i in range(0, min(len(data), limit), 16):
        chunk = data[i : i + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:08x}  {hexes:<47}  |{text}|")
    if len(data) > limit:
        lines.append(f"… {len(data) - limit} more bytes ({len(data)} in all)")
    return lines


@dataclass(frozen=True, slots=True)
class RolloutRewards:
    """The raw rewards of one rollout's siblings, by sibling_index, and whether they agree."""

    rollout: Any
    sibling_count: int
    rewards: tuple[tuple[int, Any, str], ...]  # (sibling_index, reward, PARTITION:OFFSET)
    consistent: bool


def _selected(reward: Any, reward_key: str | None) -> Any:
    """The raw reward the worker compares (core's selection); for a record it could not select one from
    (an invalid_sample), what the record holds: the key's value (None without it) or the whole reward."""
    try:
        return select_reward(reward, reward_key)
    except RewardSelectionError:
        return reward.get(reward_key) if reward_key and isinstance(reward, dict) else reward


def compare_rewards(
    members: list[tuple[DeadLetterRecord, SampleHead | None]], reward_key: str | None = None
) -> list[RolloutRewards]:
    """One row per rollout (first-seen order): its siblings' rewards side by side (docs/spec.md §2.5)."""
    by_rollout: dict[Any, list[tuple[int, Any, str, int]]] = {}
    for record, head in members:
        if head is None:
            continue
        rollout = head.rollout if head.rollout is not None else f"row {record.coordinates}"
        by_rollout.setdefault(rollout, []).append(
            (head.sibling_index, _selected(head.reward, reward_key), record.coordinates, head.sibling_count)
        )
    rows = []
    for rollout, sibs in by_rollout.items():
        sibs.sort(key=lambda s: s[0])
        distinct = {repr(s[1]) for s in sibs}
        rows.append(
            RolloutRewards(
                rollout, max(s[3] for s in sibs), tuple((s[0], s[1], s[2]) for s in sibs), len(distinct) <= 1
            )
        )
    return rows
