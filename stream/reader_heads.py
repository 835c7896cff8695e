"""Rank-local fetch for `TrainDataReader(fetch="own")`: groups from the heads topic, payloads by offset.

Every rank folds the small heads (`<train-data>.heads`, codec/group_heads.py) into the same global sequence
as it would fold train-data itself: a head becomes a group of *outline* samples (`outline_group`) that carry
exactly what the merge, staleness, `plan_batch` and `shard_groups` read (lineage, rollout ids, token and
loss-token counts, weight versions, rewards, the group's statistics), never the payload arrays. Once a batch
is planned, the rank fetches its own rows' train records by offset (`PayloadFetcher`) and checks each
against its head's lineage; the rows of other ranks are never fetched.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from rollout_stream.clients import Connection
from rollout_stream.codec import Array, DecodeError, Sample, TrainSample, decode_train_sample
from rollout_stream.codec.chunks import chunk_header_of, decode_chunk_header, value_digest
from rollout_stream.codec.group_heads import GroupHead
from rollout_stream.core.assembly import AssembledGroup, assembled_group
from rollout_stream.errors import RuntimeFailure
from rollout_stream.kafka import AssignedConsumer, TopicPartition, client_for

__all__ = ["HeadMemory", "PayloadError", "PayloadFetcher", "fetch_tuning", "outline_group"]

# How long a rank waits for a record its head points at: the head is committed with (exactly-once) or after
# (at-least-once) the records, so they are readable; only a broker away keeps them.
PAYLOAD_TIMEOUT_S = 120.0


_Value = tuple[bytes, bytes | None]  # a record's value and its chunk header, if it is a chunk


class PayloadError(RuntimeFailure, RuntimeError):
    """A train record a head points at is missing, or is not the sample the head says (lineage, digest)."""


def _outline(head: GroupHead, row: int) -> TrainSample:
    s = head.samples[row]
    loss = np.zeros(s.response_length, dtype=np.uint8)
    loss[:min(s.loss_tokens, s.response_length)] = 1
    sample = Sample(index=s.index, rollout_id=s.rollout_id, tokens=Array(np.zeros(s.tokens, dtype=np.uint8)),
                    response_length=s.response_length, loss_mask=Array(loss),
                    weight_versions=list(s.weight_versions),
                    metadata={"raw_reward": s.metadata_raw_reward} if s.has_metadata_raw_reward else {})
    return TrainSample(sample=sample, raw_reward=s.raw_reward, reward=s.reward, group_key=head.group_key,
                       group_rollout_count=head.rollout_count, group_sample_count=len(head.samples),
                       group_mean=head.mean, group_std=head.std, zero_variance=head.zero_variance,
                       advantage_estimator="", rewards_normalization=False, grpo_std_normalization=False,
                       reward_key=None, source_topic=s.source_topic, source_partition=s.source_partition,
                       source_offset=s.source_offset)


def outline_group(head: GroupHead, timestamp_ms: int) -> AssembledGroup:
    """The group a head describes, with outline samples (token counts as zero-filled uint8 rows, the loss mask
    as its count of ones): what ordering and batching read is the real group's, the payload is not there.
    Its offsets are its train records' (as a whole-topic reader reports them), its timestamp the head's."""
    samples = [_outline(head, row) for row in range(len(head.samples))]
    offsets = sorted(o for s in head.samples for o in s.offsets)
    group = assembled_group(head.group_key, head.partition, samples, offsets, timestamp_ms,
                            sum(s.nbytes for s in head.samples))
    return replace(group, problem=head.problem) if head.problem is not None else group


class HeadMemory:
    """Heads already folded, per partition (the last `size`): a group republished at least once by the stage
    has its head written again, with the same key and lineage."""

    def __init__(self, size: int = 20_000) -> None:
        self.size = size
        self.seen: dict[int, OrderedDict[tuple[str, frozenset[tuple[str, int, int]]], None]] = {}

    def first(self, partition: int, head: GroupHead) -> bool:
        """True the first time a head of this group (key and lineage) is seen in its partition."""
        key = (head.group_key, frozenset((s.source_topic, s.source_partition, s.source_offset)
                                         for s in head.samples))
        seen = self.seen.setdefault(partition, OrderedDict())
        if key in seen:
            return False
        seen[key] = None
        if len(seen) > self.size:
            seen.popitem(last=False)
        return True


def fetch_tuning(client: str) -> dict[str, Any]:
    """Consumer settings that make the broker answer with one record batch per fetch and the client never
    fetch ahead of the offsets asked for (docs/reader.md, "Bytes each rank fetches"): the smallest fetch
    sizes (a first batch larger than them still comes whole) and, on librdkafka, one message in the local
    queue."""
    if client == "confluent":
        return {"max_partition_fetch_bytes": 1, "fetch_max_bytes": 1000, "message.max.bytes": 1000,
                "queued.min.messages": 1}
    if client == "kafka-python":
        return {"max_partition_fetch_bytes": 1, "fetch_max_bytes": 1, "max_poll_records": 1}
    return {"max_poll_records": 1}  # the in-memory seam: one record per poll


class PayloadFetcher:
    """Train records by offset: assign, seek, read the records asked for, seek past gaps."""

    def __init__(self, conn: Connection, topic: str, max_record_bytes: int) -> None:
        client = client_for(conn)
        self.topic = topic
        self.consumer: AssignedConsumer = client.assigned_consumer(
            client_id=conn.client_id, max_record_bytes=max_record_bytes, **fetch_tuning(client.name))
        self.fetched_bytes = 0  # record bytes received, wanted or not

    def samples(self, outlines: Sequence[TrainSample], groups: Sequence[AssembledGroup],
                heads: dict[int, GroupHead], timeout_s: float = PAYLOAD_TIMEOUT_S) -> list[TrainSample]:
        """The train samples behind `outlines` (rows of `groups`, whose heads are `heads` by id of the group),
        in order, each checked against its head's lineage."""
        where: dict[int, tuple[int, list[int]]] = {}  # id(outline) -> (partition, offsets)
        for group in groups:
            head = heads[id(group)]
            for outline, s in zip(group.samples, head.samples, strict=True):
                where[id(outline)] = (head.partition, s.offsets)
        wanted: dict[int, set[int]] = {}
        for o in outlines:
            partition, offsets = where[id(o)]
            wanted.setdefault(partition, set()).update(offsets)
        values = self._fetch(wanted, timeout_s)
        out = []
        for o in outlines:
            partition, offsets = where[id(o)]
            sample = self._whole(partition, offsets, values)
            if (sample.group_key, sample.source_topic, sample.source_partition, sample.source_offset) != (
                    o.group_key, o.source_topic, o.source_partition, o.source_offset):
                raise PayloadError(
                    f"{self.topic} partition {partition} offsets {offsets} hold sample {sample.group_key} "
                    f"{sample.source_topic}:{sample.source_partition}@{sample.source_offset}, its head says "
                    f"{o.group_key} {o.source_topic}:{o.source_partition}@{o.source_offset}")
            out.append(sample)
        return out

    def _whole(self, partition: int, offsets: list[int], values: dict[tuple[int, int], _Value]
               ) -> TrainSample:
        parts = [values[(partition, o)] for o in offsets]
        if len(parts) == 1 and parts[0][1] is None:
            value = parts[0][0]
        else:
            headers = [decode_chunk_header(h) for _, h in parts if h is not None]
            indexes = sorted(h.index for h in headers)
            if len(headers) != len(parts) or indexes != list(range(headers[0].count)):
                raise PayloadError(
                    f"{self.topic} partition {partition} offsets {offsets}: not one value's chunks")
            value = b"".join(v for _, v in sorted(zip(headers, (v for v, _ in parts), strict=True),
                                                  key=lambda hv: hv[0].index))
            if value_digest(value) != headers[0].digest:
                raise PayloadError(f"{self.topic} partition {partition} offsets {offsets}: digest mismatch")
        try:
            return decode_train_sample(value)
        except DecodeError as exc:
            raise PayloadError(
                f"{self.topic} partition {partition} offsets {offsets}: {exc.message}") from exc

    def _fetch(self, wanted: dict[int, set[int]], timeout_s: float) -> dict[tuple[int, int], _Value]:
        c, got = self.consumer, dict[tuple[int, int], _Value]()
        for partition, offsets in sorted(wanted.items()):
            tp = TopicPartition(self.topic, partition)
            c.assign([tp])
            pending = sorted(offsets)
            c.seek(tp, pending[0])
            deadline = time.monotonic() + timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise PayloadError(f"{self.topic} partition {partition}: offsets {pending[:5]}… not read "
                                       f"within {timeout_s:g}s")
                last = None
                # One record a poll: a poll takes what the client fetched ahead too, which a seek then drops
                # (librdkafka's local queue holds the next record already).
                for records in c.poll(0.1, max_records=1).values():
                    for rec in records:
                        self.fetched_bytes += len(rec.value or b"")
                        last = rec.offset
                        if rec.offset in offsets and rec.value is not None:
                            got[(partition, rec.offset)] = (rec.value, chunk_header_of(rec.headers))
                pending = [o for o in pending if (partition, o) not in got]
                if pending and last is not None and pending[0] > last + 1:
                    c.seek(tp, pending[0])  # skip the records of other ranks
        return got

    def close(self) -> None:
        self.consumer.close()
