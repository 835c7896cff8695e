"""Resume and commit: where a rank starts, and what it commits after a batch.

Rank r commits to its own consumer group `<group_id>-rank<r>`: per partition the lowest offset not yet
yielded, plus metadata (batch index, read end, the offsets above it still to yield; `core.assembly.Mark`).
On start every rank reads the commits of ranks 0..world_size-1 and resumes from the one with the lowest batch
index (`core.assembly.choose_resume`), so ranks that crashed between commits realign on the same batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from rollout_stream.core.assembly import Mark, choose_resume, commit_metadata
from rollout_stream.kafka import AssignedConsumer, Client, Committed, TopicPartition
from rollout_stream.logs import log_event
from rollout_stream.names import rank_group_id
from rollout_stream.retry import retrying

__all__ = ["RESUME_RETRY_S", "BatchPosition", "Committer", "resume_point"]

log = logging.getLogger("rollout_stream.reader")

# How long the commits of the ranks are asked for again while the cluster answers with retriable errors (the
# group coordinator of a fresh cluster still being elected).
RESUME_RETRY_S = 60.0


@dataclass(frozen=True)
class BatchPosition:
    """Where a yielded batch ends (`TrainDataReader.position`): `index`, the batch's index, and `marks`, per
    partition the read mark a commit after it writes."""

    index: int
    marks: dict[int, Mark]


def resume_point(client: Client, client_id: str, topic: str, group_id: str, world_size: int,
                 partitions: Sequence[int], stop: threading.Event | None = None
                 ) -> tuple[int | None, dict[int, Mark]]:
    """The last batch committed and the marks to resume from: the commit of the rank with the lowest batch
    index of trainer group `group_id` on `topic` (None and no marks: no rank has committed)."""
    groups = [rank_group_id(group_id, i) for i in range(world_size)]
    tps = [TopicPartition(topic, p) for p in partitions]
    admin = client.admin(client_id=client_id)
    try:
        found = retrying(lambda: admin.group_offsets(groups, tps), within_s=RESUME_RETRY_S, stop=stop)
    finally:
        admin.close()
    resume = choose_resume([{tp.partition: om for tp, om in found.get(g, {}).items()} for g in groups])
    if resume.rank is None:
        return None, {}
    log_event(log, "reader.resume", topic=topic, group=groups[resume.rank],
              batch=-1 if resume.batch is None else resume.batch,
              offsets=",".join(f"{p}:{m.offset}" for p, m in sorted(resume.marks.items())))
    return resume.batch, resume.marks


class Committer:
    """Commits the batch positions of rank `rank` of trainer group `group_id` on `topic`, to the rank's
    consumer group (`<group_id>-rank<rank>`), never backwards; its consumer (made with `client`, `client_id`,
    `max_record_bytes`) on the first commit."""

    def __init__(self, client: Client, client_id: str, topic: str, group_id: str, rank: int,
                 max_record_bytes: int) -> None:
        self.client, self.client_id, self.topic = client, client_id, topic
        self.group = rank_group_id(group_id, rank)
        self.max_record_bytes = max_record_bytes
        self.committed: BatchPosition | None = None
        self._consumer: AssignedConsumer | None = None

    def commit(self, position: BatchPosition) -> bool:
        """Commit `position`; False if it is not past the last commit."""
        if position == self.committed:
            return False
        if self.committed is not None and position.index <= self.committed.index:
            return False  # never back: a later batch was committed already
        offsets = {}
        for p, mark in position.marks.items():
            meta, truncated = commit_metadata(mark, position.index)
            if truncated:  # too many interleaved offsets to list: re-read them on restart
                log_event(log, "commit.metadata_truncated", logging.WARNING, partition=p, keep=len(mark.keep))
            offsets[TopicPartition(self.topic, p)] = Committed(mark.offset, meta)
        if self._consumer is None:
            self._consumer = self.client.assigned_consumer(
                client_id=self.client_id, max_record_bytes=self.max_record_bytes, commit_group=self.group)
        self._consumer.commit(offsets)
        self.committed = position
        return True

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
