"""The seam's partitions and offsets in kafka-python's types."""

from __future__ import annotations

from kafka import TopicPartition as KTP
from kafka.structs import OffsetAndMetadata

from rollout_stream.kafka.seam import Offsets, TopicPartition


def _ktp(tp: TopicPartition) -> KTP:
    return KTP(tp.topic, tp.partition)


def _offsets(offsets: Offsets) -> dict[KTP, OffsetAndMetadata]:
    out = {}
    for tp, pos in offsets.items():
        offset, meta = (pos, "") if isinstance(pos, int) else (pos.offset, pos.metadata)
        out[_ktp(tp)] = OffsetAndMetadata(offset, meta, -1)
    return out
