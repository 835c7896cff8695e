"""Train data for trainers: records → whole prompt groups → one global order → batches (docs/spec.md §4.6).

Pure: decoded `codec.TrainSample`s and plain values in, decisions out; no Kafka, no clock, no logging.
`rollout_stream.reader` polls, feeds what it reads in here, and commits what this module says
(docs/reader.md).

* `SampleAssembler`: per partition, samples by group key until `group_sample_count` distinct records
  (by lineage) are held. Copies of a held record are dropped, and so is a complete copy of a group
  still remembered.
* `GroupMerger`: the global order, completed groups of all partitions merged by (completion
  timestamp, rollouts lineage, partition), each partition in its own order.
* `group_verdict`, `batch_length`, `plan_batch`: which groups train (neither stale nor invalid), where
  a batch ends, and this rank's share of it.
* `ReadMarks`, `Mark`, `commit_metadata`: per partition, what may be committed, and the metadata
  that lets a restart continue exactly.
* `choose_resume`: the commit every rank resumes from (the lowest batch index of all ranks).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from rollout_stream.codec import Sample, TrainSample
from rollout_stream.core.collate import (
    collation_problem,
    is_stale_version,
    oldest_weight_version,
    shard_groups,
)

__all__ = [
    "Lineage",
    "lineage",
    "group_identity",
    "AssembledGroup",
    "assembled_group",
    "AbandonedGroup",
    "Added",
    "SampleAssembler",
    "GroupMerger",
    "Verdict",
    "group_verdict",
    "batch_length",
    "BatchPlan",
    "plan_batch",
    "loss_tokens",
    "GroupInfo",
    "group_info",
    "Mark",
    "ReadMarks",
    "MAX_COMMIT_METADATA",
    "commit_metadata",
    "Resume",
    "choose_resume",
    "fetch_paused",
]

COMMIT_METADATA_PREFIX = "rollout-stream-reader/1"
MAX_COMMIT_METADATA = 3500  # brokers refuse commit metadata above offset.metadata.max.bytes (default 4096)

Lineage = tuple[str, int, int]
"""Where a train sample came from: (source topic, source partition, source offset)."""


def lineage(sample: TrainSample) -> Lineage:
    return (sample.source_topic, sample.source_partition, sample.source_offset)


def group_identity(key: str, lineages: Iterable[Lineage]) -> bytes:
    """16 bytes naming a group by its key and the lineage of its records: equal for complete copies."""
    return hashlib.blake2b(repr((key, sorted(lineages))).encode(), digest_size=16).digest()


# ---- group assembly ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class AssembledGroup:
    key: str
    partition: int
    samples: tuple[TrainSample, ...]
    offsets: tuple[int, ...]  # the records that form it (all chunk records of a chunked value), ascending
    timestamp_ms: int  # of the record that completed it: first in the merge key
    nbytes: int
    # Its place in the global order: completion timestamp, then the rollouts record that completed it
    # (source topic, partition, offset), then the partition. The stage sends a poll's groups within one
    # millisecond, in the order their last rollouts arrived, to train-data partitions chosen by key: ties
    # broken by lineage keep that order across train-data partitions (paced producers count a group consumed
    # once a later one of its rollouts partition is).
    merge_key: tuple[int, str, int, int, int]
    problem: str | None = None  # why it cannot be collated (skipped whole, counted)
    oldest_version: int | None = None  # oldest weight version of its samples
    version_problem: str | None = None  # a weight version that is not an integer

    @property
    def first_offset(self) -> int:
        return self.offsets[0]


def assembled_group(key: str, partition: int, samples: Sequence[TrainSample], offsets: Iterable[int],
                    timestamp_ms: int, nbytes: int) -> AssembledGroup:
    """A complete group, judged once: the first collation problem of its samples, its oldest version."""
    problem = next((p for p in map(collation_problem, samples) if p is not None), None)
    oldest, version_problem = None, None
    try:
        oldest = oldest_weight_version(samples)
    except ValueError as exc:
        version_problem = str(exc)
    last = max(samples, key=lambda s: s.source_offset)
    merge_key = (timestamp_ms, last.source_topic, last.source_partition, last.source_offset, partition)
    return AssembledGroup(key, partition, tuple(samples), tuple(sorted(offsets)), timestamp_ms, nbytes,
                          merge_key, problem, oldest, version_problem)


@dataclass(frozen=True, slots=True)
class AbandonedGroup:
    """An incomplete group evicted because its partition held too many incomplete groups."""

    key: str
    partition: int
    have: int
    expected: int
    offsets: tuple[int, ...]  # in arrival order

    @property
    def first_offset(self) -> int:
        return min(self.offsets)


@dataclass(frozen=True, slots=True)
class Added:
    """What one sample did to the assembly.

    `hold`: it was taken into a group not yet yielded, so its offset must not be committed past.
    `duplicate`: "record" when it copies a record already held (dropped); "group" when it completed a
    complete copy of a remembered group (the copy is dropped whole). `release`: offsets no longer held
    (a dropped group copy's, abandoned groups'). `group`: the new group it completed.
    """

    hold: bool
    group: AssembledGroup | None = None
    duplicate: Literal["record", "group"] | None = None
    release: tuple[int, ...] = ()
    abandoned: tuple[AbandonedGroup, ...] = ()


@dataclass(slots=True)
class _Pending:
    expected: int
    samples: list[TrainSample] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sources: set[Lineage] = field(default_factory=set)
    nbytes: int = 0


class SampleAssembler:
    """Whole groups from decoded train samples, each partition on its own.

    Per partition alone, so that what is held, remembered and forgotten depends on that partition's
    records, never on how fetches of different partitions interleave: every rank decides alike. A
    completed group is remembered by `group_identity` (~100 B each), the last `remember_per_partition`.
    """

    def __init__(self, *, max_pending_per_partition: int = 1024,
                 remember_per_partition: int = 20_000) -> None:
        if max_pending_per_partition < 1:
            raise ValueError(f"max_pending_per_partition must be >= 1, got {max_pending_per_partition}")
        if remember_per_partition < 0:
            raise ValueError(f"remember_per_partition must be >= 0, got {remember_per_partition}")
        self.max_pending = max_pending_per_partition
        self.remember = remember_per_partition
        self.pending: dict[int, OrderedDict[str, _Pending]] = {}
        self.recent: dict[int, OrderedDict[bytes, None]] = {}

    def add(self, partition: int, offset: int, timestamp_ms: int, sample: TrainSample, nbytes: int,
            chunks: tuple[int, ...] = ()) -> Added:
        """Take the sample read at `offset` of `partition` (`nbytes`: its record's size).

        `chunks`: for a value reassembled from chunk records, the offsets of all of them (`offset`, the
        one that completed it, among them): they stand for the record everywhere offsets are returned
        (the group's `offsets`, `release`), so none is committed past before the value is consumed.
        A sample dropped (`hold` False) holds none of them.
        """
        groups = self.pending.setdefault(partition, OrderedDict())
        key = sample.group_key
        pending = groups.get(key)
        source = lineage(sample)
        if pending is not None and source in pending.sources:
            return Added(hold=False, duplicate="record")
        abandoned: tuple[AbandonedGroup, ...] = ()
        if pending is None:
            pending = groups[key] = _Pending(max(1, sample.group_sample_count))
            abandoned = self._bound(partition, groups)
        pending.samples.append(sample)
        if chunks:
            pending.offsets.extend(chunks)
        else:
            pending.offsets.append(offset)
        pending.sources.add(source)
        pending.nbytes += nbytes
        release = tuple(o for old in abandoned for o in old.offsets)
        if len(pending.samples) < pending.expected:
            return Added(hold=True, release=release, abandoned=abandoned)
        del groups[key]
        if not self._remember(partition, group_identity(key, pending.sources)):
            return Added(hold=True, duplicate="group", release=release + tuple(pending.offsets),
                         abandoned=abandoned)
        group = assembled_group(key, partition, pending.samples, pending.offsets, timestamp_ms,
                                pending.nbytes)
        return Added(hold=True, group=group, release=release, abandoned=abandoned)

    def _bound(self, partition: int, groups: OrderedDict[str, _Pending]) -> tuple[AbandonedGroup, ...]:
        """Evict the oldest incomplete groups beyond the bound."""
        out = []
        while len(groups) > self.max_pending:
            key, old = groups.popitem(last=False)
            out.append(AbandonedGroup(key, partition, len(old.samples), old.expected, tuple(old.offsets)))
        return tuple(out)

    def _remember(self, partition: int, identity: bytes) -> bool:
        """Remember a completed group; False when it is already remembered (a complete copy)."""
        recent = self.recent.setdefault(partition, OrderedDict())
        if identity in recent:
            return False
        recent[identity] = None
        if len(recent) > self.remember:
            recent.popitem(last=False)
        return True


# ---- the global order --------------------------------------------------------------------------
class GroupMerger:
    """The global order: completed groups of all partitions merged by their `merge_key`."""

    def __init__(self, partitions: Sequence[int], idle_ms: int | None) -> None:
        self.queues: dict[int, deque[AssembledGroup]] = {p: deque() for p in partitions}
        self.idle_ms = idle_ms

    def push(self, group: AssembledGroup) -> None:
        self.queues[group.partition].append(group)

    def backlog(self, partition: int) -> int:
        return len(self.queues[partition])

    def pop(self, now_ms: int, caught_up: Callable[[int], bool]) -> AssembledGroup | None:
        """The next group of the global sequence, or None while another partition may still precede it."""
        heads = [(q[0].merge_key, p) for p, q in self.queues.items() if q]
        if not heads:
            return None
        (ts, *_), partition = min(heads)
        for p, q in self.queues.items():
            if q:
                continue
            # An empty partition could still deliver an earlier group, unless it is read to its end and
            # the candidate is older than the idle bound (later records carry later timestamps).
            if self.idle_ms is None or ts > now_ms - self.idle_ms or not caught_up(p):
                return None
        return self.queues[partition].popleft()


    def due_ms(self) -> int | None:
        """When the head group could next leave by the idle rule (its timestamp + idle), if one waits on
        an empty partition: the reader looks again then instead of at its next poll."""
        heads = [q[0].merge_key for q in self.queues.values() if q]
        if not heads or self.idle_ms is None or all(self.queues.values()):
            return None
        return min(heads)[0] + self.idle_ms


def fetch_paused(backlog: int, limit: int, paused: bool) -> bool:
    """Whether a partition's fetching stays paused: from `limit` merged-but-waiting groups until half."""
    if backlog >= limit:
        return True
    if backlog < limit // 2:
        return False
    return paused


# ---- batches -----------------------------------------------------------------------------------
Verdict = Literal["stale", "invalid"]


def group_verdict(group: AssembledGroup, weight_version: int | None,
                  max_staleness: int | None) -> Verdict | None:
    """None: the group trains; "stale" or "invalid": it is skipped whole (as
    rollout_stream.core.collate.is_stale).

    Invalid: it cannot be collated, or a staleness bound applies and a weight version is not an integer.
    """
    if group.problem is not None:
        return "invalid"
    if max_staleness is None or weight_version is None:
        return None
    if group.version_problem is not None:
        return "invalid"  # a weight version that is not an integer: the rule cannot be applied
    return "stale" if is_stale_version(group.oldest_version, weight_version, max_staleness) else None


def batch_length(verdicts: Sequence[Verdict | None], groups_per_batch: int) -> int | None:
    """How many queued groups the next batch takes: the shortest prefix holding `groups_per_batch`
    groups that train, or None while there are fewer."""
    if groups_per_batch < 1:
        raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
    good = 0
    for n, verdict in enumerate(verdicts, start=1):
        good += verdict is None
        if good == groups_per_batch:
            return n
    return None


def loss_tokens(s: TrainSample | Sample) -> int:
    """Response tokens that count in the loss (as `collate` masks them), of a train sample or the rollout
    sample it carries."""
    sample = s if isinstance(s, Sample) else s.sample
    if sample.remove_sample:
        return 0
    if sample.loss_mask is None:
        return sample.response_length
    return int(np.count_nonzero(sample.loss_mask.numpy()))


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """One batch, decided: the groups that train (every rank's), this rank's samples, what was skipped."""

    taken: int  # queued groups the batch consumes, trained and skipped
    groups: tuple[AssembledGroup, ...]  # the groups that train, in global order
    samples: tuple[TrainSample, ...]  # this rank's share of their samples, in global order
    skipped_stale: int
    invalid: tuple[AssembledGroup, ...]  # skipped because they cannot be collated or judged
    global_samples: int  # samples of the whole batch, over all ranks
    global_loss_tokens: int  # loss tokens of the whole batch, over all ranks

    @property
    def skipped_invalid(self) -> int:
        return len(self.invalid)


def plan_batch(queued: Sequence[AssembledGroup], verdicts: Sequence[Verdict | None], *, groups_per_batch: int,
               rank: int, world_size: int, balance_tokens: bool = False) -> BatchPlan:
    """The next batch from the queued groups and their verdicts; ValueError when it is not complete yet.

    Every rank that plans from the same queue gets the same groups and a disjoint share of their samples
    (`rollout_stream.core.collate.shard_groups`: whole rollouts, siblings together).
    """
    taken = batch_length(verdicts, groups_per_batch)
    if taken is None:
        raise ValueError(f"{verdicts.count(None)} queued groups train, a batch needs {groups_per_batch}")
    window = list(zip(queued[:taken], verdicts[:taken], strict=True))
    good = tuple(g for g, v in window if v is None)
    mine = shard_groups([g.samples for g in good], rank, world_size, balance_tokens=balance_tokens)
    return BatchPlan(
        taken=taken, groups=good, samples=tuple(mine),
        skipped_stale=sum(v == "stale" for _, v in window),
        invalid=tuple(g for g, v in window if v == "invalid"),
        global_samples=sum(len(g.samples) for g in good),
        global_loss_tokens=sum(loss_tokens(s) for g in good for s in g.samples),
    )


@dataclass(frozen=True, slots=True)
class GroupInfo:
    key: str
    partition: int
    first_offset: int
    last_offset: int
    timestamp_ms: int
    samples: int
    rollouts: int
    oldest_weight_version: int | None
    mean: float
    std: float
    zero_variance: bool


def group_info(g: AssembledGroup) -> GroupInfo:
    first = g.samples[0]
    return GroupInfo(g.key, g.partition, g.offsets[0], g.offsets[-1], g.timestamp_ms, len(g.samples),
                     first.group_rollout_count, g.oldest_version, first.group_mean, first.group_std,
                     first.zero_variance)


# ---- positions and resume ----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Mark:
    """A partition's position after a yielded group: commit `offset`; in [offset, end) only `keep` is new."""

    offset: int
    end: int
    keep: frozenset[int] = frozenset()

    def skips(self, offset: int) -> bool:
        return offset < self.end and offset not in self.keep

    def metadata(self, batch: int) -> str:
        runs: list[str] = []
        rel = sorted(k - self.offset for k in self.keep)
        i = 0
        while i < len(rel):
            j = i
            while j + 1 < len(rel) and rel[j + 1] == rel[j] + 1:
                j += 1
            runs.append(str(rel[i]) if i == j else f"{rel[i]}-{rel[j]}")
            i = j + 1
        return f"{COMMIT_METADATA_PREFIX} batch={batch} end={self.end} keep={','.join(runs)}"

    @staticmethod
    def parse(offset: int, metadata: str | None) -> tuple[int | None, Mark]:
        """(batch index or None, mark) from a committed offset and its metadata."""
        fields = dict(p.split("=", 1) for p in (metadata or "").split(" ")[1:] if "=" in p)
        if not (metadata or "").startswith(COMMIT_METADATA_PREFIX + " ") or "batch" not in fields:
            return None, Mark(offset, offset)  # a commit made by something else (e.g. an operator's reset)
        keep: list[int] = []
        for run in filter(None, fields.get("keep", "").split(",")):
            lo, _, hi = run.partition("-")
            keep.extend(range(offset + int(lo), offset + int(hi or lo) + 1))
        end = max(offset, int(fields.get("end", offset)))
        return int(fields["batch"]), Mark(offset, end, frozenset(keep))


def commit_metadata(mark: Mark, batch: int, limit: int = MAX_COMMIT_METADATA) -> tuple[str, bool]:
    """The metadata to commit with `mark.offset`, and whether it had to drop `keep` to fit in `limit`
    (too many interleaved offsets to list: they are read again after a restart)."""
    meta = mark.metadata(batch)
    if len(meta) <= limit:
        return meta, False
    return Mark(mark.offset, mark.offset).metadata(batch), True


class ReadMarks:
    """Per partition: offsets read but not yet yielded (held), and how far reading got."""

    def __init__(self) -> None:
        self.next: dict[int, int] = {}
        self.held: dict[int, set[int]] = {}
        self._resumed: dict[int, deque[int]] = {}  # held since the restart, not yet read again

    def start(self, partition: int, position: int, resume: Mark | None = None) -> None:
        """Reading starts at `position`; after a restart, the resumed mark's unread offsets stay held."""
        self.next[partition] = max(position, resume.end) if resume else position
        self.held[partition] = set(resume.keep) if resume else set()
        self._resumed[partition] = deque(sorted(resume.keep)) if resume else deque()

    def read(self, partition: int, offset: int, *, hold: bool) -> None:
        self.next[partition] = max(self.next.get(partition, 0), offset + 1)
        held = self.held.setdefault(partition, set())
        resumed = self._resumed.get(partition)
        while resumed and resumed[0] <= offset:
            gone = resumed.popleft()
            if gone < offset:
                held.discard(gone)  # no longer in the log (retention): nothing left to wait for
        if hold:
            held.add(offset)
        else:
            held.discard(offset)

    def release(self, partition: int, offsets: Iterable[int]) -> None:
        self.held[partition].difference_update(offsets)

    def snapshot(self) -> dict[int, Mark]:
        out: dict[int, Mark] = {}
        for p, end in self.next.items():
            held = self.held.get(p)
            out[p] = Mark(min(held), end, frozenset(held)) if held else Mark(end, end)
        return out


Committed = Mapping[int, tuple[int | None, str | None]]
"""One rank's commit: partition → (offset, metadata); an offset that is None or negative: none."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Where to resume: after batch `batch` (None: no batch was committed), from `rank`'s commit."""

    batch: int | None
    rank: int | None  # None: no rank committed anything, start from the beginning
    marks: dict[int, Mark]  # per partition with a commit


def choose_resume(commits: Sequence[Committed]) -> Resume:
    """The commit to resume from, given every rank's (`commits[rank]`): the lowest batch index, ties
    to the lowest rank, so ranks that crashed between their commits realign on the same batch.

    A rank's batch index is the highest one in its partitions' metadata; a commit without our metadata
    (an operator's reset) counts as -1, so it wins and every rank restarts from it.
    """
    best: tuple[int, int, dict[int, Mark]] | None = None
    for rank, committed in enumerate(commits):
        marks: dict[int, Mark] = {}
        batch = -1
        for partition, (offset, metadata) in committed.items():
            if offset is None or offset < 0:
                continue
            b, marks[partition] = Mark.parse(offset, metadata)
            batch = max(batch, b if b is not None else -1)
        if marks and (best is None or (batch, rank) < best[:2]):
            best = (batch, rank, marks)
    if best is None:
        return Resume(None, None, {})
    return Resume(best[0] if best[0] >= 0 else None, best[1], best[2])
