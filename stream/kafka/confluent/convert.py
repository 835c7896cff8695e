"""The seam's partitions and offsets as librdkafka's `TopicPartition`s."""

from __future__ import annotations

from confluent_kafka import TopicPartition as RdTP

from rollout_stream.kafka.seam import Offsets, TopicPartition


def _rd(tp: TopicPartition, offset: int | None = None, metadata: str | None = None) -> RdTP:
    if offset is None:
        return RdTP(tp.topic, tp.partition)
    return RdTP(tp.topic, tp.partition, offset) if metadata is None else RdTP(tp.topic, tp.partition, offset,
                                                                            metadata=metadata)


def _rd_offsets(offsets: Offsets) -> list[RdTP]:
    out = []
    for tp, pos in offsets.items():
        if isinstance(pos, int):
            out.append(_rd(tp, pos))
        else:
            out.append(_rd(tp, pos.offset, pos.metadata or None))
    return out
