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

from rollout_stream.codec import TrainSample
from rollout_stream.codec.chunks import CHUNK_HEADER, decode_chunk_header
from rollout_stream.codec.group_heads import GroupHead, HeadSample, encode_group_head
from rollout_stream.core.collate import collation_problem
from rollout_stream.core.records import Published
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
        head = GroupHead(topic=self.head.topic, partition=partition, group_key=self.head.group_key,
                         rollout_count=self.head.rollout_count, mean=self.head.mean, std=self.head.std,
                         zero_variance=self.head.zero_variance, samples=samples, problem=self.head.problem)
        # Same partition number as the train records: a reader folds heads partition by partition as it
        # would fold train-data's, so the global sequence keeps its rules.
        return OutgoingRecord(heads_topic(self.head.topic), head.group_key.encode(), encode_group_head(head),
                              (), partition)


_replace = msgspec.structs.replace


def _loss_tokens(s: TrainSample) -> int:
    sample = s.sample
    if sample.remove_sample:
        return 0
    if sample.loss_mask is None:
        return sample.response_length
    return int((sample.loss_mask.numpy() != 0).sum())


def plan_head(group: Published, outs: Sequence[OutputRecord], samples: Sequence[TrainSample]
              ) -> PendingHead | None:
    """The pending head of a group whose train records are `outs` (chunked or not) and whose decoded train
    samples are `samples`, in publication order; None when the outputs are not one whole group's train
    records (nothing to point at)."""
    if not outs or len(samples) != len(group.members):
        return None
    sample_of: list[int] = []
    row = -1
    for out in outs:
        chunk = next((v for k, v in out.headers if k == CHUNK_HEADER), None)
        # A value's chunks follow each other in order: a chunk of index 0 (or a plain record) starts a sample.
        if chunk is None or _chunk_index(chunk) == 0:
            row += 1
        sample_of.append(row)
    if row != len(samples) - 1:
        return None
    problem = next((p for p in map(collation_problem, samples) if p is not None), None)
    stats = group.rewards
    heads = [HeadSample(offsets=[], nbytes=0, source_topic=s.source_topic,
                        source_partition=s.source_partition, source_offset=s.source_offset,
                        rollout_id=s.sample.rollout_id, index=s.sample.index,
                        tokens=len(s.sample.tokens) if s.sample.tokens is not None else 0,
                        response_length=s.sample.response_length, loss_tokens=_loss_tokens(s),
                        weight_versions=list(s.sample.weight_versions), raw_reward=s.raw_reward,
                        reward=s.reward, metadata_raw_reward=s.sample.metadata.get("raw_reward"),
                        has_metadata_raw_reward="raw_reward" in s.sample.metadata) for s in samples]
    nbytes = [0] * len(samples)
    for sample, out in zip(sample_of, outs, strict=True):
        nbytes[sample] += len(out.value or b"")
    heads = [_replace(h, nbytes=n) for h, n in zip(heads, nbytes, strict=True)]
    return PendingHead(GroupHead(topic=outs[0].topic, partition=-1, group_key=group.group_key,
                                 rollout_count=stats.rollout_count, mean=stats.mean, std=stats.std,
                                 zero_variance=stats.zero_variance, samples=heads, problem=problem),
                       tuple(sample_of))


def _chunk_index(raw: bytes) -> int:
    return decode_chunk_header(raw).index
