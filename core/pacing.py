"""Pacing rollouts to the trainer: the admission rule, pure (docs/pacing.md, docs/spec.md §4.8).

A rollout worker about to start a prompt group at weight version `w` asks whether it may. Two bounds:

* **policy lag** `k`: the group must not be more than `k` versions behind the trainer *when the trainer
  consumes it*. The reader judges a batch against the version set when the batch completes. The trainer
  says which version judged its last batch (`batch_version`) and which it has now; the next batch is
  judged at most at `base = max(now, batch_version + versions_per_batch)` (before any batch: `now`),
  where `versions_per_batch` bounds how far one training step moves the version. With `u` groups ahead of
  the new one (admitted and not yet consumed: being generated, in the stage, or waiting in train-data)
  and `groups_per_batch` groups per step, the new group is in the batch `u // groups_per_batch` steps
  after the next one, judged at most at `base + (u // groups_per_batch) * versions_per_batch`. Admit iff
  that minus `w` is at most `k`. The reader skips a group when `w < version - max_weight_staleness`, so
  with `k <= max_weight_staleness` no admitted group is skipped, as long as the groups ahead of it are
  consumed before it (groups are consumed in the order they are completed; one that takes much longer to
  generate than those admitted after it can still arrive too late).
* **unconsumed groups** `n`: admit iff `u < n`, so at most `n` groups are outstanding once it is admitted.

Under a policy-lag bound nothing is admitted before the trainer has said where it is. A trainer that has
not set a weight version yet (most set it after their first step) is assumed to start at the version the
producer asks for (`next_batch_version(..., start=w)`).

Which groups count as consumed is decided by `is_consumed`: the trainer publishes, per partition of the
rollouts topic, the highest source offset of any record of a group it has taken into a batch (trained or
skipped); a producer's group whose records are all acknowledged, the last at `last_offset` in partition
`p`, is consumed (or resolved without reaching the trainer: dead-lettered, dropped) once that watermark
reaches `last_offset`. The stage resolves the groups of one input partition in the order their last
records arrived, and the reader keeps that order, so a later group consumed implies this one resolved.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

__all__ = ["Admission", "PacingLimits", "Refusal", "admission", "doomed_through", "is_consumed",
           "next_batch_version", "predicted_lag"]


class Refusal(Enum):
    """Why a group may not start now."""

    POLICY_LAG = "policy_lag"
    UNCONSUMED = "unconsumed"
    NO_TRAINER = "no_trainer"  # a policy-lag bound, and the trainer has said nothing yet


@dataclass(frozen=True, slots=True)
class PacingLimits:
    """`max_policy_lag` k and `max_unconsumed_groups` n (None: that bound is off)."""

    max_policy_lag: int | None = None
    max_unconsumed_groups: int | None = None
    versions_per_batch: int = 1

    def __post_init__(self) -> None:
        if self.max_policy_lag is not None and self.max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0, got {self.max_policy_lag}")
        if self.max_unconsumed_groups is not None and self.max_unconsumed_groups < 1:
            raise ValueError(f"max_unconsumed_groups must be >= 1, got {self.max_unconsumed_groups}")
        if self.versions_per_batch < 0:
            raise ValueError(f"versions_per_batch must be >= 0, got {self.versions_per_batch}")

    @property
    def active(self) -> bool:
        return self.max_policy_lag is not None or self.max_unconsumed_groups is not None


@dataclass(frozen=True, slots=True)
class Admission:
    """The decision for one group: `admitted`, else the first bound it breaks (`refused`)."""

    refused: Refusal | None
    unconsumed: int  # groups ahead of the new one
    predicted_lag: int | None  # None: the trainer has no weight version yet
    request: int | None = None  # the admitting request's offset in the admission log (the group's id)

    @property
    def admitted(self) -> bool:
        return self.refused is None

    def explain(self, limits: PacingLimits) -> str:
        if self.refused is Refusal.POLICY_LAG:
            return (f"policy lag at consumption would be {self.predicted_lag} > max_policy_lag "
                    f"{limits.max_policy_lag} ({self.unconsumed} group(s) ahead)")
        if self.refused is Refusal.NO_TRAINER:
            return "the trainer has published no progress yet, so the policy lag cannot be bounded"
        if self.refused is Refusal.UNCONSUMED:
            return (f"{self.unconsumed} group(s) not yet consumed >= max_unconsumed_groups "
                    f"{limits.max_unconsumed_groups}")
        return "admitted"


def next_batch_version(weight_version: int | None, batch_version: int | None, versions_per_batch: int = 1,
                       *, any_batch: bool = False, start: int | None = None) -> int | None:
    """The highest version the trainer's next batch can be judged at.

    A trainer without a weight version yet (most set it after their first step) is assumed to start at
    `start` (the producer's version): its next batch is judged at `start`, or one step later once it has
    taken a batch (`any_batch`). None when there is no version and no `start`.
    """
    if weight_version is None:
        if start is None:
            return None
        return start + (versions_per_batch if any_batch else 0)
    if batch_version is None:
        return weight_version
    return max(weight_version, batch_version + versions_per_batch)


def predicted_lag(weight_version: int, next_version: int | None, unconsumed: int, groups_per_batch: int,
                  versions_per_batch: int = 1) -> int | None:
    """At most how far behind the trainer a group started now at `weight_version` is when it is judged."""
    if next_version is None:
        return None
    if groups_per_batch < 1:
        raise ValueError(f"groups_per_batch must be >= 1, got {groups_per_batch}")
    if unconsumed < 0:
        raise ValueError(f"unconsumed must be >= 0, got {unconsumed}")
    return next_version + (unconsumed // groups_per_batch) * versions_per_batch - weight_version


def admission(weight_version: int, *, next_version: int | None, groups_per_batch: int, unconsumed: int,
              limits: PacingLimits, trainer_known: bool = True) -> Admission:
    """May a group start at `weight_version` now? (the module docstring states the rule)

    `trainer_known`: whether the trainer has said where it is. Under a policy-lag bound nothing starts
    before it has: the groups ahead could not be counted against its batches. `next_version` None: no
    lag can be predicted, only `n` applies.
    """
    lag = predicted_lag(weight_version, next_version, unconsumed, groups_per_batch, limits.versions_per_batch)
    if limits.max_policy_lag is not None and not trainer_known:
        return Admission(Refusal.NO_TRAINER, unconsumed, lag)
    if limits.max_unconsumed_groups is not None and unconsumed >= limits.max_unconsumed_groups:
        return Admission(Refusal.UNCONSUMED, unconsumed, lag)
    if limits.max_policy_lag is not None and lag is not None and lag > limits.max_policy_lag:
        return Admission(Refusal.POLICY_LAG, unconsumed, lag)
    return Admission(None, unconsumed, lag)


Source = tuple[str, int, int]  # a record's source topic, partition and offset (its lineage)


def doomed_through(queued: Sequence[tuple[Iterable[Source], bool]]) -> dict[str, dict[int, int]]:
    """Per source topic and partition, the highest source offset of the leading run of queued groups that
    will be skipped, in queue order.

    `queued`: the reader's buffered groups in sequence order, each as its records' (source topic, partition,
    offset) and whether it is judged stale or invalid already (a verdict that cannot change: versions only
    move on). Such groups will never train, so a producer may stop counting them before the batch that
    skips them completes; without this, groups that will be skipped could hold back the fresh ones that
    batch waits for. A partition's run ends at its first group that may still train.
    """
    through: dict[str, dict[int, int]] = {}
    blocked: set[tuple[str, int]] = set()
    for sources, doomed in queued:
        for topic, partition, offset in sources:
            if (topic, partition) in blocked:
                continue
            if not doomed:
                blocked.add((topic, partition))
                continue
            parts = through.setdefault(topic, {})
            if offset > parts.get(partition, -1):
                parts[partition] = offset
    return through


def is_consumed(partition: int | None, last_offset: int | None, consumed_through: Mapping[int, int]) -> bool:
    """A group whose records went to `partition`, the last at `last_offset` (None: not all acknowledged
    yet), given the trainer's highest consumed source offset per partition."""
    if partition is None or last_offset is None:
        return False
    seen = consumed_through.get(partition)
    return seen is not None and seen >= last_offset
