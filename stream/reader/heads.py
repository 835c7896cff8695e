"""The heads fold (`fetch="own"`): group heads → groups of *outline* samples, in the fetch thread.

Every rank folds the small heads (`<train-data>.heads`, codec/group_heads.py) into the same global sequence
as it would fold train-data itself: a head becomes a group of outline samples (`outline_group`) that carry
exactly what the merge, staleness, `plan_batch` and `shard_groups` read (lineage, rollout ids, token and
loss-token counts, weight versions and their spans, rewards, the group's statistics), never the payload
arrays. The head travels with its group to the trainer's thread, where the rank fetches its own rows by
offset (`rollout_stream.reader.payloads`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from rollout_stream.codec import Array, DecodeError, Sample, TrainSample
from rollout_stream.codec.group_heads import GroupHead, decode_group_head
from rollout_stream.core.assembly import AssembledGroup, ReadMarks, assembled_group
from rollout_stream.core.staleness import spans_loss_mask
from rollout_stream.core.validate import version_offsets_problem
from rollout_stream.logs import log_event
from rollout_stream.reader.stats import ReaderStats

__all__ = ["HeadFold", "HeadMemory", "outline_group"]

log = logging.getLogger("rollout_stream.reader")


def _outline(head: GroupHead, row: int) -> TrainSample:
    s = head.samples[row]
    offsets = s.weight_version_offsets
    if offsets is not None and s.span_loss_tokens is not None and len(offsets) == len(s.span_loss_tokens) \
            and version_offsets_problem(offsets, len(s.weight_versions), s.response_length) is None:
        loss = spans_loss_mask(offsets, s.span_loss_tokens, s.response_length)  # staleness per token alike
    else:
        loss = np.zeros(s.response_length, dtype=np.uint8)
        loss[:min(s.loss_tokens, s.response_length)] = 1
    sample = Sample(index=s.index, rollout_id=s.rollout_id, tokens=Array(np.zeros(s.tokens, dtype=np.uint8)),
                    response_length=s.response_length, loss_mask=Array(loss),
                    weight_versions=list(s.weight_versions),
                    weight_version_offsets=None if offsets is None else Array(offsets),
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
    Its offsets are its train records' (as a whole-topic reader reports them), its timestamp its last train
    record's, as the head says (a head of an older stage: `timestamp_ms`, the head record's own)."""
    samples = [_outline(head, row) for row in range(len(head.samples))]
    offsets = sorted(o for s in head.samples for o in s.offsets)
    stamp = head.timestamp_ms if head.timestamp_ms is not None else timestamp_ms
    group = assembled_group(head.group_key, head.partition, samples, offsets, stamp,
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


class HeadFold:
    """Head records → outline groups, each head record held until its group is yielded (commits and resume
    are on the heads topic). Used by the fetch thread alone.

    `topic`: the train-data topic the heads describe (a head of another topic or partition is dropped);
    `marks`: the read marks of the heads topic; `stats`: where it counts; `memory`: the heads already folded.
    """

    def __init__(self, topic: str, marks: ReadMarks, stats: ReaderStats, memory: HeadMemory | None = None
                 ) -> None:
        self.topic, self.marks, self.stats = topic, marks, stats
        self.memory = memory or HeadMemory()
        # a group in the merge -> its head record's offset and its head: the fetch thread's own, never shared
        self._held: dict[int, tuple[int, GroupHead]] = {}

    def accept(self, partition: int, offset: int, timestamp_ms: int, value: bytes | None,
               headers: Sequence[tuple[str, bytes]] | None = None) -> AssembledGroup | None:
        """The group a head record describes, or None (undecodable, or a second head of a group)."""
        stats, marks = self.stats, self.marks
        stats.records += 1
        stats.bytes += len(value or b"")
        try:
            if value is None:
                raise DecodeError("record has no value (tombstone)")
            head = decode_group_head(value)
        except DecodeError as exc:
            stats.decode_errors += 1
            marks.read(partition, offset, hold=False)
            log_event(log, "head.undecodable", logging.WARNING, partition=partition, offset=offset,
                      error=exc.message[:300])
            return None
        ours = head.partition == partition and head.topic == self.topic
        if not ours or not self.memory.first(partition, head):
            stats.duplicate_groups += ours
            marks.read(partition, offset, hold=False)
            return None
        marks.read(partition, offset, hold=True)
        group = outline_group(head, timestamp_ms)
        self._held[id(group)] = (offset, head)
        return group

    def expire(self, now_ms: int, read_to_end: Callable[[int], bool]) -> None:
        """Nothing to expire: a head is whole."""

    def taken(self, group: AssembledGroup) -> tuple[Sequence[int], GroupHead]:
        """A merged group leaves the fold with its head; its head record may be committed once it is
        yielded."""
        offset, head = self._held.pop(id(group))
        return (offset,), head
