"""The trainer's side of batching: groups held until a batch is complete, judged, planned and logged.

The next `groups_per_batch` groups that are neither stale nor invalid make a batch, judged when the batch is
completed against the weight version set at that moment (`core.assembly.group_verdict`). Every rank plans the
same batch (`core.assembly.plan_batch`) and keeps its share. For groups of a prompt source, a fence lets one
attempt of each prompt train (docs/loop.md); the others are skipped as superseded.
"""

from __future__ import annotations

import logging
import time

from rollout_stream.core.assembly import (
    AssembledGroup,
    BatchPlan,
    Verdict,
    group_verdict,
    lineage,
    plan_batch,
)
from rollout_stream.core.pacing import doomed_through
from rollout_stream.core.prompt_keys import PromptFence
from rollout_stream.logs import log_event
from rollout_stream.reader.sources import Fetched

__all__ = ["WAITING_LOG_S", "HeldGroups", "WaitingLog"]

log = logging.getLogger("rollout_stream.reader")

# The least time between two `batch.waiting` log lines, which say what a batch that is not complete waits for.
WAITING_LOG_S = 5.0


class HeldGroups:
    """Groups fetched and not yet in a batch, in global order (`items`), and the batch they make.

    `groups_per_batch`, `rank`, `world_size`, `balance_tokens`: how batches are made and sharded
    (`plan_batch`); `max_weight_staleness`: the staleness bound (None: none); `fence`: the rule that lets one
    attempt of a prompt train (None: every group may).
    """

    def __init__(self, *, groups_per_batch: int, rank: int, world_size: int, balance_tokens: bool,
                 max_weight_staleness: int | None, fence: PromptFence | None) -> None:
        self.groups_per_batch, self.rank, self.world_size = groups_per_batch, rank, world_size
        self.balance_tokens, self.fence = balance_tokens, fence
        self.max_weight_staleness = max_weight_staleness
        self.items: list[Fetched] = []
        self._superseded: dict[str, str] = {}  # held groups the fence refused: key -> why

    def verdict(self, group: AssembledGroup, weight_version: int | None) -> Verdict | None:
        verdict = group_verdict(group, weight_version, self.max_weight_staleness)
        if verdict is None and self.fence is not None and not self.fence.admit(group.key):
            # another attempt of its prompt trains: skipped like an invalid group, reported apart
            self._superseded[group.key] = self.fence.refusal(group.key) or "superseded"
            return "invalid"
        self._superseded.pop(group.key, None)
        return verdict

    def doomed(self, verdicts: list[Verdict | None]) -> tuple[dict[str, dict[int, int]], list[str]]:
        """What paced producers stop counting now (docs/pacing.md): the source offsets through which every
        held group is skipped, and the keys of the held groups that will be."""
        pairs = list(zip(self.items, verdicts, strict=True))
        through = doomed_through([([lineage(s) for s in f.group.samples], v is not None) for f, v in pairs])
        return through, [f.group.key for f, v in pairs if v is not None]

    def take(self, verdicts: list[Verdict | None]) -> tuple[BatchPlan, list[Fetched], int]:
        """The batch the held groups complete: its plan, the items it consumes (trained and skipped), and how
        many of them the fence skipped. Skipped groups are logged, and give their prompt's claim back."""
        plan = plan_batch([f.group for f in self.items], verdicts, groups_per_batch=self.groups_per_batch,
                          rank=self.rank, world_size=self.world_size, balance_tokens=self.balance_tokens)
        items, self.items = self.items[:plan.taken], self.items[plan.taken:]
        if self.fence is not None:  # a group skipped after all gives its prompt's claim back
            for item, verdict in zip(items, verdicts, strict=False):
                if verdict is not None:
                    self.fence.release(item.group.key)
        superseded = 0
        for group in plan.invalid:
            if (why := self._superseded.get(group.key)) is not None:
                superseded += 1  # the fence's: the prompt trains once, this copy is expected to be skipped
                log_event(log, "group.skipped_superseded", group=group.key, partition=group.partition,
                          offset=group.first_offset, problem=why)
                continue
            log_event(log, "group.skipped_invalid", logging.WARNING, group=group.key,
                      partition=group.partition, offset=group.first_offset,
                      problem=group.problem or group.version_problem)
        for item in items:
            self._superseded.pop(item.group.key, None)
        return plan, items, superseded

    def log_stale(self, index: int, items: list[Fetched], verdicts: list[Verdict | None],
                  weight_version: int | None) -> None:
        """One line a batch: which groups its version bound left out, and how old they were."""
        stale = [f.group for f, v in zip(items, verdicts, strict=False) if v == "stale"]
        if not stale:
            return
        versions = [g.oldest_version for g in stale if g.oldest_version is not None]
        log_event(log, "batch.skipped_stale", batch=index, groups=len(stale), oldest_version=min(versions),
                  newest_version=max(versions), weight_version=weight_version,
                  max_weight_staleness=self.max_weight_staleness, first=",".join(g.key for g in stale[:5]))


class WaitingLog:
    """`batch.waiting`, at most every WAITING_LOG_S while a batch is not complete: the groups held of those
    needed, and the partitions read to their end (all of them: the topic has no more groups for now).
    `topic`: the topic named in the line; `now`: when the wait started (monotonic seconds)."""

    def __init__(self, topic: str, now: float) -> None:
        self.topic, self.started, self.next = topic, now, now + WAITING_LOG_S

    def timeout(self, remaining: float | None) -> float:
        """How long the next wait on the queue may last: until the next line is due, at the latest."""
        until_log = max(0.0, self.next - time.monotonic())
        return until_log if remaining is None else min(remaining, until_log)

    def due(self, now: float, *, batch: int, good: int, needed: int, held: int, at_end: tuple[int, ...]
            ) -> bool:
        """Log the line if it is due (True: the wait goes on), else False (the caller's timeout passed)."""
        if now < self.next:
            return False
        log_event(log, "batch.waiting", topic=self.topic, batch=batch, groups=f"{good}/{needed}", held=held,
                  partitions_at_end=",".join(map(str, at_end)) or "none", waited_s=round(now - self.started))
        self.next = now + WAITING_LOG_S
        return True
