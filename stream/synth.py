"""Synthetic rollouts with controlled faults, and the outcome each one must have (demo, tests, bench)."""

from __future__ import annotations

import math
import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from codec import DeadLetterReason, Sample, encode_sample, group_key

__all__ = ["FaultRates", "SynthPlan", "PlannedRecord", "plan_groups", "Expected"]

R = DeadLetterReason


@dataclass(frozen=True, slots=True)
class FaultRates:
    """Probability, per group, of each injected fault (at most one per group)."""

    malformed: float = 0.0  # an extra record of garbage bytes under the group's key → decode_error
    invalid: float = 0.0  # one member with a NaN reward → the group is invalid_sample
    shared_reward: float = 0.0  # siblings of one rollout disagree → shared_reward_violation
    conflicting_duplicate: float = 0.0  # a member sent twice with different tokens → conflicting_duplicate
    incomplete: float = 0.0  # a member never sent → incomplete_group after the timeout
    late: float = 0.0  # an extra rollout after the group was published → late_member
    duplicate: float = 0.0  # a member sent twice, identical → dropped and counted

    @classmethod
    def uniform(cls, rate: float) -> FaultRates:
        return cls(*(rate,) * 7)

    def total(self) -> float:
        return sum(getattr(self, f) for f in self.__slots__)


@dataclass(frozen=True, slots=True)
class PlannedRecord:
    key: bytes
    value: bytes
    group: str


@dataclass
class Expected:
    """What the stage must produce for a plan: published samples, dead-letters by reason, duplicates."""

    published_samples: int = 0
    published_groups: int = 0
    dead_letters: Counter[str] = field(default_factory=Counter)
    duplicates: int = 0
    records: int = 0

    def add(self, other: Expected) -> None:
        self.published_samples += other.published_samples
        self.published_groups += other.published_groups
        self.dead_letters.update(other.dead_letters)
        self.duplicates += other.duplicates
        self.records += other.records


@dataclass(frozen=True, slots=True)
class SynthPlan:
    group_size: int = 4
    max_siblings: int = 1  # rollouts produce 1..max_siblings samples
    tokens: int = 64
    faults: FaultRates = field(default_factory=FaultRates)
    seed: int = 0
    run_id: str | None = None
    write_group_size: bool = True  # False: leave group_size unset (the stage's --group-size applies)


def _sample(plan: SynthPlan, rng: random.Random, gi: int, rid: int, sib: int, nsib: int, reward: float) -> Sample:
    n = plan.tokens
    resp = max(1, n // 2)
    tokens = np.asarray([rng.randrange(32000) for _ in range(min(n, 64))] * (n // min(n, 64) + 1), dtype="<i4")[:n]
    return Sample(
        group_index=gi, index=rid, rollout_id=rid, tokens=tokens, response_length=resp, reward=reward,
        loss_mask=np.ones(resp, dtype="u1"), rollout_log_probs=np.full(resp, -0.5 - sib, dtype="<f4"),
        weight_versions=["1"], group_size=plan.group_size if plan.write_group_size else None,
        sibling_count=nsib, sibling_index=sib, run_id=plan.run_id, prompt=f"prompt {gi}",
    )


def _pick_fault(rng: random.Random, faults: FaultRates) -> str | None:
    x = rng.random()
    for name in FaultRates.__slots__:
        p = getattr(faults, name)
        if x < p:
            return name
        x -= p
    return None


def plan_group(plan: SynthPlan, gi: int, rng: random.Random) -> tuple[list[PlannedRecord], Expected]:
    """The records of one prompt group (with at most one fault) and the outcomes they must have."""
    fault = _pick_fault(rng, plan.faults)
    members: list[Sample] = []
    for r in range(plan.group_size):
        rid = gi * 1000 + r
        nsib = rng.randint(1, max(1, plan.max_siblings))
        if fault == "shared_reward" and r == 0:
            nsib = max(2, nsib)
        reward = float(rng.choice([0.0, 0.25, 0.5, 1.0]))
        for s in range(nsib):
            value = reward + 1.0 if (fault == "shared_reward" and r == 0 and s == nsib - 1) else reward
            members.append(_sample(plan, rng, gi, rid, s, nsib, value))
    rng.shuffle(members)
    key = group_key(members[0])
    gname = key.decode()
    values = [encode_sample(m) for m in members]
    exp = Expected()
    n = len(values)
    out = [PlannedRecord(key, v, gname) for v in values]
    if fault is None:
        exp.published_samples, exp.published_groups = n, 1
    elif fault == "malformed":
        out.insert(rng.randrange(n + 1), PlannedRecord(key, b"\xc1garbage" + rng.randbytes(8), gname))
        exp.published_samples, exp.published_groups = n, 1
        exp.dead_letters[R.DECODE_ERROR] += 1
    elif fault == "invalid":
        i = rng.randrange(n)
        bad = members[i]
        bad.reward = math.nan
        out[i] = PlannedRecord(key, encode_sample(bad), gname)
        exp.dead_letters[R.INVALID_SAMPLE] += n
    elif fault == "shared_reward":
        exp.dead_letters[R.SHARED_REWARD_VIOLATION] += n
    elif fault == "conflicting_duplicate":
        i = rng.randrange(n - 1) if n > 1 else 0
        twin = members[i]
        changed = Sample(**{f: getattr(twin, f) for f in twin.__struct_fields__})
        changed.tokens = np.asarray(twin.tokens.numpy()[::-1], dtype="<i4") if twin.tokens is not None else None
        changed.prompt = twin.prompt + " (edited)"
        # Before the group's last member, so the conflict is seen while the group is still open.
        out.insert(i + 1, PlannedRecord(key, encode_sample(changed), gname))
        exp.dead_letters[R.CONFLICTING_DUPLICATE] += n + 1
    elif fault == "incomplete":
        out.pop(rng.randrange(n))
        if out:
            exp.dead_letters[R.INCOMPLETE_GROUP] += n - 1
    elif fault == "late":
        extra = _sample(plan, rng, gi, gi * 1000 + plan.group_size, 0, 1, 0.5)
        out.append(PlannedRecord(key, encode_sample(extra), gname))
        exp.published_samples, exp.published_groups = n, 1
        exp.dead_letters[R.LATE_MEMBER] += 1
    elif fault == "duplicate":
        i = rng.randrange(n)
        out.insert(rng.randrange(i + 1, n + 1), out[i])
        exp.published_samples, exp.published_groups = n, 1
        exp.duplicates += 1
    exp.records = len(out)
    return out, exp


def plan_groups(plan: SynthPlan, groups: int, start_index: int = 0) -> Iterator[tuple[list[PlannedRecord], Expected]]:
    rng = random.Random(plan.seed)
    for gi in range(start_index, start_index + groups):
        yield plan_group(plan, gi, rng)


def default_run_id() -> str:
    return "synth-" + uuid.uuid4().hex[:8]


class RateLimiter:
    """At most `rate` events per second on average (0: unlimited)."""

    def __init__(self, rate: float) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.next_at = time.monotonic()

    def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        if self.next_at > now:
            time.sleep(self.next_at - now)
        self.next_at = max(self.next_at, now) + self.interval
