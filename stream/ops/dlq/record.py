"""A dead-letter record as the tools see it: Kafka coordinates, original bytes, and its headers parsed."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import msgspec

from rollout_stream.codec import DeadLetterReason
from rollout_stream.codec.chunks import ChunkHeader, ChunkHeaderError, chunk_header_of, decode_chunk_header
from rollout_stream.core.rewards import declared_rollout_key
from rollout_stream.ops.dlq import headers as H

__all__ = [
    "DeadLetterRecord",
    "SampleHead",
    "iso_ms",
    "parse_iso_ms",
    "parse_record",
    "readable_header",
    "sample_head",
]


class SampleHead(msgspec.Struct, kw_only=True, tag="rollout_sample", tag_field="type"):
    """The identifying fields of a rollout sample (codec.Sample), decoded without its arrays.

    Listing a large dead-letter topic must not materialize 32K-token arrays per row: msgspec skips
    the fields this struct does not name.
    """

    schema_version: int = 1
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | str | None = None
    reward: float | dict[str, float] | None = None
    group_size: int | None = None
    sibling_count: int = 1
    sibling_index: int = 0
    run_id: str | None = None

    @property
    def rollout(self) -> int | str | None:
        """The rollout this sample belongs to (docs/spec.md §2.4: rollout_id, else index)."""
        return declared_rollout_key(self)


_head_decoder = msgspec.msgpack.Decoder(SampleHead)


def sample_head(value: bytes | None) -> SampleHead | None:
    """The sample's identifying fields, or None when the bytes are not a rollout sample."""
    if not value:
        return None
    try:
        return _head_decoder.decode(value)
    except (msgspec.DecodeError, ValueError, TypeError, RecursionError):
        return None


def parse_iso_ms(text: str) -> int | None:
    """Milliseconds since the epoch of an ISO-8601 time (naive means UTC), or None when it is not one."""
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


def iso_ms(ms: int) -> str:
    return (
        dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def readable_header(name: str, value: str) -> str:
    """A header value for a person: the epoch milliseconds of x-original-timestamp also as an ISO-8601 UTC
    time, the form x-failed-at has (the header itself stays as the worker wrote it)."""
    ms = _int(value) if name == H.ORIGINAL_TIMESTAMP else None
    if ms is None:
        return value
    try:
        return f"{value} ({iso_ms(ms)})"
    except (OverflowError, OSError, ValueError):  # not a time a datetime holds: show the value alone
        return value


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """One record of the dead-letter topic. Unknown reason codes are kept as text, never refused."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int  # the dead-letter record's Kafka timestamp: when it was dead-lettered (this time)
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    reason: str
    message: str
    group_key: str | None
    original_topic: str | None
    original_partition: int | None
    original_offset: int | None
    original_timestamp_ms: int | None
    stage_version: str
    failed_at_ms: int  # x-failed-at: first failure, kept across replays; else the Kafka timestamp
    replay_count: int  # x-replay-count: how often this record's bytes were replayed before it failed again
    replay_id: str | None
    replayed_from: str | None
    # x-chunk: this record is one slice of a larger value (docs/dlq.md, "Chunked values"). An unreadable
    # header leaves it None, so the record is shown and replayed as it is, like any record.
    chunk: ChunkHeader | None = None

    @property
    def coordinates(self) -> str:
        """`PARTITION:OFFSET`, the argument of `dlq show`."""
        return f"{self.partition}:{self.offset}"

    @property
    def known_reason(self) -> DeadLetterReason | None:
        try:
            return DeadLetterReason(self.reason)
        except ValueError:
            return None

    @property
    def key_text(self) -> str | None:
        return self.key.decode("utf-8", "backslashreplace") if self.key is not None else None

    @property
    def group(self) -> str | None:
        """The group key header, else the record key (a decode_error keeps the key it was sent with)."""
        return self.group_key or self.key_text

    def header_text(self) -> dict[str, str]:
        return H.header_map(self.headers)

    def summary(self) -> dict[str, Any]:
        """The fields of a `dlq list` row, JSON-ready."""
        head = sample_head(self.value)
        return {
            "partition": self.partition,
            "offset": self.offset,
            "dead_lettered_at": iso_ms(self.timestamp_ms),
            "first_failed_at": iso_ms(self.failed_at_ms),
            "reason": self.reason,
            "group_key": self.group,
            "rollout": head.rollout if head else None,
            "sibling_index": head.sibling_index if head else None,
            "message": self.message,
            "original": (
                f"{self.original_topic}:{self.original_partition}:{self.original_offset}"
                if self.original_topic is not None
                else None
            ),
            "replay_count": self.replay_count,
            "value_bytes": len(self.value) if self.value is not None else None,
        }


def parse_record(rec: Any) -> DeadLetterRecord:
    """A kafka-python ConsumerRecord of the dead-letter topic as a DeadLetterRecord."""
    raw_headers = tuple((k, v if v is not None else b"") for k, v in (rec.headers or ()))
    h = H.header_map(raw_headers)
    failed_at = parse_iso_ms(h.get(H.FAILED_AT, "")) if H.FAILED_AT in h else None
    return DeadLetterRecord(
        topic=rec.topic,
        partition=rec.partition,
        offset=rec.offset,
        timestamp_ms=rec.timestamp,
        key=rec.key,
        value=rec.value,
        headers=raw_headers,
        reason=h.get(H.REASON, "unknown"),
        message=h.get(H.MESSAGE, ""),
        group_key=h.get(H.GROUP_KEY) or None,
        original_topic=h.get(H.ORIGINAL_TOPIC) or None,
        original_partition=_int(h.get(H.ORIGINAL_PARTITION)),
        original_offset=_int(h.get(H.ORIGINAL_OFFSET)),
        original_timestamp_ms=_int(h.get(H.ORIGINAL_TIMESTAMP)),
        stage_version=h.get(H.STAGE_VERSION, ""),
        failed_at_ms=failed_at if failed_at is not None else rec.timestamp,
        replay_count=max(0, _int(h.get(H.REPLAY_COUNT)) or 0),
        replay_id=h.get(H.REPLAY_ID) or None,
        replayed_from=h.get(H.REPLAYED_FROM) or None,
        chunk=_chunk(raw_headers),
    )


def _chunk(headers: tuple[tuple[str, bytes], ...]) -> ChunkHeader | None:
    raw = chunk_header_of(headers)
    if raw is None:
        return None
    try:
        return decode_chunk_header(raw)
    except ChunkHeaderError:
        return None
