"""The head record of a published group (codec/group_heads.py): planned when the group's train records are
routed, finished once the producer says where they were written.

The train records' offsets are known only from their delivery reports, so a head is written after them:
under exactly-once in the same transaction, after a flush inside it and before the input offsets (a head is
committed exactly when its group is); under at-least-once after the records are acknowledged and before
the input offsets below them are committed (a head may be repeated with its group, never missing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from rollout_stream.codec import Sample, decode_sample
from rollout_stream.codec.chunks import CHUNK_HEADER, decode_chunk_header
from rollout_stream.codec.group_heads import GroupHead, HeadSample, encode_group_head
from rollout_stream.core.assembly import loss_tokens
from rollout_stream.core.collate import collation_problem
from rollout_stream.core.records import Member, Published
from rollout_stream.core.staleness import span_loss_tokens
from rollout_stream.kafka import OutgoingRecord, Written
from rollout_stream.names import heads_topic
from rollout_stream.worker.outputs import OutputRecord

__all__ = ["PendingHead", "plan_head"]


@dataclass(frozen=True, slots=True)
class PendingHead:
    """A group's head without offsets, and which sample each of the group's output records carries."""

    head: GroupHead  # offsets left empty
    sample_of: tuple[int, ...]  # per output record (chunk records included), the index of its sample

    def finish(self, written: Sequence[Written]) -> OutgoingRecord:
        """The head record, given where each output record was written (in the order they were sent)."""
        offsets: list[list[int]] = [[] for _ in self.head.samples]
        for sample, where in zip(self.sample_of, written, strict=True):
            offsets[sample].append(where.offset)
        partition = written[0].partition
        samples = [_replace(s, offsets=sorted(o)) for s, o in zip(self.head.samples, offsets, strict=True)]
        # The timestamp of the record that completes the group for a whole-topic reader (its last): readers
        # of heads and of train-data then merge partitions by the same key, into the same batches.
        last = max(written, key=lambda w: w.offset)
        head = GroupHead(topic=self.head.topic, partition=partition, group_key=self.head.group_key,
                         rollout_count=self.head.rollout_count, mean=self.head.mean, std=self.head.std,
                         zero_variance=self.head.zero_variance, samples=samples, problem=self.head.problem,
                         timestamp_ms=last.timestamp_ms)
        # Same partition number as the train records: a reader folds heads partition by partition as it
        # would fold train-data's, so the global sequence keeps its rules.
        return OutgoingRecord(heads_topic(self.head.topic), head.group_key.encode(), encode_group_head(head),
                              (), partition)


_replace = msgspec.structs.replace


def plan_head(group: Published, outs: Sequence[OutputRecord]) -> PendingHead | None:
    """The pending head of a group whose train records are `outs` (chunked or not), in publication order;
    None when the outputs are not one whole group's train records (nothing to point at).

    It reads what the train records were made from: each member's rollout sample (its input bytes, which a
    train record embeds verbatim), its lineage, and the group's rewards."""
    if not outs:
        return None
    sample_of: list[int] = []
    row = -1
    for out in outs:
        chunk = next((v for k, v in out.headers if k == CHUNK_HEADER), None)
        # A value's chunks follow each other in order: a chunk of index 0 (or a plain record) starts a sample.
        if chunk is None or _chunk_index(chunk) == 0:
            row += 1
        sample_of.append(row)
    members = group.members
    if row != len(members) - 1:
        return None
    samples = [_rollout_sample(m) for m in members]
    problem = next((p for p in map(collation_problem, samples) if p is not None), None)
    stats = group.rewards
    nbytes = [0] * len(samples)
    for sample, out in zip(sample_of, outs, strict=True):
        nbytes[sample] += len(out.value or b"")
    # Rewards as their train record carries them: floats, also where the group's rewards hold an int.
    heads = [HeadSample(offsets=[], nbytes=n, source_topic=m.record.topic,
                        source_partition=m.record.partition, source_offset=m.record.offset,
                        rollout_id=s.rollout_id, index=s.index,
                        tokens=len(s.tokens) if s.tokens is not None else 0,
                        response_length=s.response_length, loss_tokens=loss_tokens(s),
                        weight_versions=list(s.weight_versions), raw_reward=float(raw), reward=float(reward),
                        metadata_raw_reward=s.metadata.get("raw_reward"),
                        has_metadata_raw_reward="raw_reward" in s.metadata,
                        weight_version_offsets=None if s.weight_version_offsets is None
                        else s.weight_version_offsets.tolist(), span_loss_tokens=span_loss_tokens(s))
             for m, s, raw, reward, n in zip(members, samples, stats.raw, stats.rewards, nbytes, strict=True)]
    return PendingHead(GroupHead(topic=outs[0].topic, partition=-1, group_key=group.group_key,
                                 rollout_count=stats.rollout_count, mean=stats.mean, std=stats.std,
                                 zero_variance=stats.zero_variance, samples=heads, problem=problem),
                       tuple(sample_of))


def _rollout_sample(member: Member) -> Sample:
    """The member's rollout sample: a window holds only a few of its fields (core.structs.HeldSample), its
    record the whole of it."""
    value = member.record.value
    return member.sample if value is None else decode_sample(value)


def _chunk_index(raw: bytes) -> int:
    return decode_chunk_header(raw).index
