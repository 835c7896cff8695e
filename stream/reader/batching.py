"""The trainer's side of batching: groups held until a batch is complete, judged, planned and logged.

The next `groups_per_batch` groups that are neither stale nor invalid make a batch, judged when the batch is
completed against the weight version set at that moment (`core.assembly.group_verdict`). With staleness by
rollout or by token (`core.staleness`), a group past the bound still trains what of it is fresh: its stale
rollouts leave, or its stale tokens leave the loss. Every rank plans the same batch
(`core.assembly.plan_batch`, over what trains) and keeps its share. For groups of a prompt source, a fence
lets one attempt of each prompt train (docs/loop.md); the others are skipped as superseded.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from rollout_stream.core.assembly import (
    AssembledGroup,
    BatchPlan,
    Verdict,
    batch_length,
    group_verdict,
    lineage,
    plan_batch,
)
from rollout_stream.core.pacing import doomed_through
from rollout_stream.core.prompt_keys import PromptFence
from rollout_stream.core.staleness import (
    STALENESS_MODES,
    StalenessDecision,
    StalenessMode,
    staleness_decision,
    trained,
)
from rollout_stream.logs import log_event
from rollout_stream.reader.sources import Fetched

__all__ = ["WAITING_LOG_S", "HeldGroups", "StaleParts", "WaitingLog"]

log = logging.getLogger("rollout_stream.reader")

# The least time between two `batch.waiting` log lines, which say what a batch that is not complete waits for.
WAITING_LOG_S = 5.0


@dataclass(frozen=True, slots=True)
class StaleParts:
    """What staleness by rollout or by token left out of a batch's groups that train (all ranks'): per group
    key, the rollouts and the tokens that counted in the loss (`by_group`, for the prompt ledger,
    docs/loop.md), and their totals; `floor`, with staleness by token, the weight version below which a
    fetched row's tokens leave the loss (None: no row loses any)."""

    by_group: dict[str, tuple[int, int]] = field(default_factory=dict)
    floor: int | None = None

    @property
    def rollouts(self) -> int:
        return sum(rollouts for rollouts, _ in self.by_group.values())

    @property
    def tokens(self) -> int:
        return sum(tokens for _, tokens in self.by_group.values())


class HeldGroups:
    """Groups fetched and not yet in a batch, in global order (`items`), and the batch they make.

    `groups_per_batch`, `rank`, `world_size`, `balance_tokens`: how batches are made and sharded
    (`plan_batch`); `max_weight_staleness`: the staleness bound (None: none); `staleness`: its grain, "group",
    "rollout" or "token" (`rollout_stream.core.staleness`); `fence`: the rule that lets one attempt of a
    prompt train (None: every group may).
    """

    def __init__(self, *, groups_per_batch: int, rank: int, world_size: int, balance_tokens: bool,
                 max_weight_staleness: int | None, fence: PromptFence | None,
                 staleness: StalenessMode = "group") -> None:
        if staleness not in STALENESS_MODES:
            raise ValueError(f"staleness must be one of {', '.join(STALENESS_MODES)}, got {staleness!r}")
        self.groups_per_batch, self.rank, self.world_size = groups_per_batch, rank, world_size
        self.balance_tokens, self.fence = balance_tokens, fence
        self.max_weight_staleness, self.staleness = max_weight_staleness, staleness
        self.items: list[Fetched] = []
        self._superseded: dict[str, str] = {}  # held groups the fence refused: key -> why
        self._parts: dict[str, StalenessDecision] = {}  # held groups past the bound that train in part
        self._unjudged: dict[str, str] = {}  # held groups staleness could not judge: key -> why
        self._last_parts = StaleParts()  # of the last batch taken, for its log line

    def verdict(self, group: AssembledGroup, weight_version: int | None) -> Verdict | None:
        verdict = group_verdict(group, weight_version, self.max_weight_staleness)
        self._parts.pop(group.key, None)
        self._unjudged.pop(group.key, None)
        if verdict == "stale" and self.staleness != "group":
            # its oldest version is past the bound: what of it is fresh may still train
            try:
                decision = staleness_decision(group.samples, self.staleness, weight_version,
                                              self.max_weight_staleness)
            except ValueError as exc:  # versions beyond int64 by token: skipped, never a trainer crash
                self._unjudged[group.key], verdict = str(exc), "invalid"
            else:
                if not decision.skipped:
                    self._parts[group.key], verdict = decision, None
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

    def take(self, verdicts: list[Verdict | None], weight_version: int | None
             ) -> tuple[BatchPlan, list[Fetched], int, StaleParts]:
        """The batch the held groups complete: its plan (over what of its groups trains), the items it
        consumes (trained and skipped), how many of them the fence skipped, and what staleness left out of the
        groups that train (judged at `weight_version`, the one `verdicts` were). Skipped groups are logged,
        and give their prompt's claim back."""
        taken = batch_length(verdicts, self.groups_per_batch) or 0
        queued = [f.group for f in self.items[:taken]]
        by_group: dict[str, tuple[int, int]] = {}
        for n, (group, verdict) in enumerate(zip(queued, verdicts, strict=False)):
            decision = self._parts.pop(group.key, None) if verdict is None else None
            if decision is not None:
                queued[n] = replace(group, samples=tuple(trained(group.samples, decision)))
                if decision.excluded_rollouts or decision.excluded_tokens:
                    by_group[group.key] = (decision.excluded_rollouts, decision.excluded_tokens)
        plan = plan_batch(queued, verdicts, groups_per_batch=self.groups_per_batch,
                          rank=self.rank, world_size=self.world_size, balance_tokens=self.balance_tokens)
        floor, bound = None, self.max_weight_staleness
        if self.staleness == "token" and weight_version is not None and bound is not None:
            floor = weight_version - bound
        parts = self._last_parts = StaleParts(by_group, floor)
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
                      problem=group.problem or group.version_problem or self._unjudged.get(group.key))
        for item in items:
            self._superseded.pop(item.group.key, None)
            self._parts.pop(item.group.key, None)
            self._unjudged.pop(item.group.key, None)
        return plan, items, superseded, parts

    def likely_plan(self, upcoming: list[Fetched]) -> BatchPlan | None:
        """The plan of the batch the next `groups_per_batch` of `upcoming` (the held items, then those queued)
        make if each trains whole: what this rank fetches ahead. None: not enough of them yet."""
        if len(upcoming) < self.groups_per_batch:
            return None
        groups = [f.group for f in upcoming[:self.groups_per_batch]]
        return plan_batch(groups, [None] * len(groups), groups_per_batch=self.groups_per_batch,
                          rank=self.rank, world_size=self.world_size, balance_tokens=self.balance_tokens)

    def log_stale(self, index: int, items: list[Fetched], verdicts: list[Verdict | None],
                  weight_version: int | None) -> None:
        """One line a batch: which groups its version bound left out, and how old they were; and one for the
        rollouts and tokens it left out of groups that train (staleness by rollout or token)."""
        parts = self._last_parts
        if parts.rollouts or parts.tokens:
            log_event(log, "batch.stale_parts", batch=index, staleness=self.staleness,
                      rollouts=parts.rollouts, tokens=parts.tokens, weight_version=weight_version,
                      max_weight_staleness=self.max_weight_staleness)
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

    def due(self, now: float, *, batch: int, good: int, needed: int, held: int, at_end: tuple[int, ...],
            uncovered: str = "") -> bool:
        """Log the line if it is due (True: the wait goes on), else False (the caller's timeout passed).
        `uncovered`: train-data records no group head covers, per partition (`fetch="own"`), if any."""
        if now < self.next:
            return False
        extra: dict[str, Any] = {"uncovered_train_data": uncovered} if uncovered else {}
        log_event(log, "batch.waiting", topic=self.topic, batch=batch, groups=f"{good}/{needed}", held=held,
                  partitions_at_end=",".join(map(str, at_end)) or "none", waited_s=round(now - self.started),
                  **extra)
        self.next = now + WAITING_LOG_S
        return True
