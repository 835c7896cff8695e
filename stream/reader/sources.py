"""Group sources: where a reader's groups come from, picked once by `fetch`.

* `WholeTopic` (`fetch="all"`): every rank reads every record of train-data and assembles the groups itself
  (`rollout_stream.reader.assembler.GroupAssembler`); a batch's rows carry their payloads.
* `HeadsAndPayloads` (`fetch="own"`): every rank folds the small group heads a stage run with `--write-heads`
  writes (`rollout_stream.reader.heads`), into the same sequence; once a batch is planned, the rank fetches
  its own rows' train records by offset (`rollout_stream.reader.payloads`). Commits and resume are on the
  heads topic.

A source has two halves, one per thread: `fold()` makes, for the fetch thread, the object that turns the
records it polls into groups (only that thread uses it); `payloads()`, `ahead()` and `close()` run on the
trainer's thread. What crosses between them is a `Fetched` item on the fetch thread's queue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from rollout_stream.codec import TrainSample
from rollout_stream.codec.group_heads import GroupHead
from rollout_stream.core.assembly import AssembledGroup, Mark, ReadMarks
from rollout_stream.kafka import Client
from rollout_stream.names import heads_topic
from rollout_stream.reader.assembler import GroupAssembler
from rollout_stream.reader.coverage import CoverageWatch
from rollout_stream.reader.heads import HeadFold
from rollout_stream.reader.payloads import PayloadFetcher, small_records
from rollout_stream.reader.stats import ReaderStats

__all__ = ["Fetch", "Fetched", "GroupFold", "GroupSource", "HeadsAndPayloads", "WholeTopic", "group_source"]

Fetch = Literal["all", "own"]


@dataclass(frozen=True)
class Fetched:
    """A group handed from the fetch thread to the trainer's: `group`; `marks`, the read marks (per
    partition) a commit after it writes; `head`, its head when the source folds heads (else None)."""

    group: AssembledGroup
    marks: dict[int, Mark]
    head: GroupHead | None = None


class GroupFold(Protocol):
    """Records of the source's topic → whole groups, in the fetch thread."""

    def accept(self, partition: int, offset: int, timestamp_ms: int, value: bytes | None,
               headers: Sequence[tuple[str, bytes]] | None = None) -> AssembledGroup | None:
        """One record read: the group it completed, if any (the offsets it holds stay held in the marks)."""
        ...

    def expire(self, now_ms: int, read_to_end: Callable[[int], bool]) -> None:
        """Once a turn: drop what waited too long in partitions read to their end."""
        ...

    def taken(self, group: AssembledGroup) -> tuple[Sequence[int], GroupHead | None]:
        """`group` left the merge: the offsets it held (released in the marks), and its head, if any."""
        ...


class GroupSource(Protocol):
    """Where groups come from: `read_topic` is the topic the fetch thread reads, commits and resumes on;
    `carries_payloads` says whether the groups hold their samples' payloads (else outline samples);
    `poll_records`: the most records the fetch thread folds per poll (None: the client's default)."""

    topic: str
    read_topic: str
    carries_payloads: bool
    poll_records: int | None

    def fold(self, marks: ReadMarks, stats: ReaderStats) -> GroupFold: ...

    def coverage(self) -> CoverageWatch | None:
        """For the fetch thread: what watches that the source's records cover train-data (None: nothing to
        watch, the source is train-data)."""
        ...

    def payloads(self, rows: Sequence[TrainSample], batch: Sequence[Fetched], stats: ReaderStats
                 ) -> list[TrainSample]:
        """The train samples behind `rows` (samples of `batch`'s groups), in order."""
        ...

    def fetches_ahead(self, batch: Sequence[Fetched]) -> bool:
        """Whether `ahead` would fetch anything for the groups of `batch` (else the trainer's thread need not
        plan it early)."""
        ...

    def ahead(self, rows: Sequence[TrainSample], batch: Sequence[Fetched]) -> None:
        """`rows` (of `batch`'s groups) are likely asked for next: their payloads may be fetched now."""
        ...

    def close(self) -> None: ...


class WholeTopic:
    """Every rank reads the whole train-data topic `topic`; the groups carry their payloads.

    `max_open_chunk_bytes`, `chunk_timeout_s`: the chunk limits of the fold (`GroupAssembler`).
    """

    carries_payloads = True
    poll_records: int | None = None

    def __init__(self, topic: str, *, max_open_chunk_bytes: int, chunk_timeout_s: float) -> None:
        self.topic = self.read_topic = topic
        self.max_open_chunk_bytes, self.chunk_timeout_s = max_open_chunk_bytes, chunk_timeout_s

    def fold(self, marks: ReadMarks, stats: ReaderStats) -> GroupAssembler:
        return GroupAssembler(marks, stats, max_open_chunk_bytes=self.max_open_chunk_bytes,
                              chunk_timeout_s=self.chunk_timeout_s)

    def coverage(self) -> None:
        return None

    def payloads(self, rows: Sequence[TrainSample], batch: Sequence[Fetched], stats: ReaderStats
                 ) -> list[TrainSample]:
        return list(rows)

    def fetches_ahead(self, batch: Sequence[Fetched]) -> bool:
        return False  # the rows carry their payloads

    def ahead(self, rows: Sequence[TrainSample], batch: Sequence[Fetched]) -> None:
        pass

    def close(self) -> None:
        pass


class HeadsAndPayloads:
    """Groups from the heads topic of train-data topic `topic`; each rank's rows fetched by offset.

    `client`: the seam's client the payload consumer is made with (on the first batch), under `client_id`;
    `max_record_bytes`: the largest record it accepts.
    """

    carries_payloads = False
    # A head is a whole group: a poll of the client's 500 heads folded 500 groups (4,000 outline samples at 8
    # a group) before the merge handed out the first, most of a second of start-up on a loaded machine.
    poll_records: int | None = 64

    def __init__(self, topic: str, client: Client, client_id: str, max_record_bytes: int) -> None:
        self.topic, self.read_topic = topic, heads_topic(topic)
        self.client, self.client_id, self.max_record_bytes = client, client_id, max_record_bytes
        self._fetcher: PayloadFetcher | None = None
        self._counted = 0  # of the fetcher's bytes, those in the stats

    def fold(self, marks: ReadMarks, stats: ReaderStats) -> HeadFold:
        return HeadFold(self.topic, marks, stats)

    def coverage(self) -> CoverageWatch:
        """Train-data records no head covers hold the reader back, then stop it
        (rollout_stream.reader.coverage)."""
        return CoverageWatch(self.client, self.client_id, self.topic, self.read_topic, self.max_record_bytes)

    def payloads(self, rows: Sequence[TrainSample], batch: Sequence[Fetched], stats: ReaderStats
                 ) -> list[TrainSample]:
        """This rank's rows, fetched by offset (only theirs) and checked against their heads."""
        if not rows:
            return []
        fetcher = self._payload_fetcher()
        try:
            return fetcher.samples(rows, [(f.group, f.head) for f in batch if f.head is not None])
        finally:  # what its thread fetched since, this batch's rows and those fetched ahead
            stats.payload_bytes += fetcher.fetched_bytes - self._counted
            self._counted = fetcher.fetched_bytes

    def fetches_ahead(self, batch: Sequence[Fetched]) -> bool:
        """Rows of large records are fetched ahead; small ones are read on ahead as they come."""
        return not small_records([(f.group, f.head) for f in batch if f.head is not None])

    def ahead(self, rows: Sequence[TrainSample], batch: Sequence[Fetched]) -> None:
        """Fetch `rows` on the fetcher's thread while the trainer trains (one batch ahead at most)."""
        if rows:
            self._payload_fetcher().ahead(rows, [(f.group, f.head) for f in batch if f.head is not None])

    def _payload_fetcher(self) -> PayloadFetcher:
        if self._fetcher is None:
            self._fetcher = PayloadFetcher(self.client, self.client_id, self.topic, self.max_record_bytes)
        return self._fetcher

    def close(self) -> None:
        if self._fetcher is not None:
            self._fetcher.close()


def group_source(fetch: Fetch, topic: str, client: Client, *, client_id: str, max_record_bytes: int,
                 max_open_chunk_bytes: int, chunk_timeout_s: float) -> GroupSource:
    """The source `fetch` names: "all" (`WholeTopic`) or "own" (`HeadsAndPayloads`)."""
    if fetch == "all":
        return WholeTopic(topic, max_open_chunk_bytes=max_open_chunk_bytes, chunk_timeout_s=chunk_timeout_s)
    if fetch == "own":
        return HeadsAndPayloads(topic, client, f"{client_id}-own", max_record_bytes)
    raise ValueError(f"fetch must be all or own, got {fetch!r}")
