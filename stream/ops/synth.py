"""Synthetic rollouts with controlled faults, and the outcome each one must have (demo, tests, bench)."""

from __future__ import annotations

import math
import random
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rollout_stream.codec import (
    Array,
    DeadLetterReason,
    DecodeError,
    Sample,
    decode_sample,
    encode_sample,
    group_key,
)
from rollout_stream.core.records import DeadLettered, DuplicateDropped, InputRecord, Published
from rollout_stream.core.validate import SampleLimits
from rollout_stream.core.windows import WindowConfig, WindowStore

__all__ = [
    "DUE_AFTER_GROUP_TIMEOUT",
    "Expected",
    "FaultRates",
    "PlannedRecord",
    "SendProgress",
    "SynthPlan",
    "expect_records",
    "expectation_document",
    "interruption_summary",
    "plan_groups",
    "send_groups",
]

R = DeadLetterReason

DUE_AFTER_GROUP_TIMEOUT = frozenset({R.INCOMPLETE_GROUP})
"""Dead-letter reasons the worker gives only once a group's --group-timeout has passed (counted from its first
record's timestamp). Every other outcome follows as soon as the worker has read the records."""


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
        rates: list[float] = [getattr(self, f) for f in self.__slots__]
        return sum(rates)


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

    def due_after_group_timeout(self) -> dict[str, int]:
        """The dead-letters, by reason, that appear only after the worker's group timeout."""
        return {str(r): n for r, n in sorted(self.dead_letters.items()) if r in DUE_AFTER_GROUP_TIMEOUT and n}


@dataclass(frozen=True, slots=True)
class SynthPlan:
    group_size: int = 4
    max_siblings: int = 1  # rollouts produce 1..max_siblings samples
    tokens: int = 64
    faults: FaultRates = field(default_factory=FaultRates)
    seed: int = 0
    run_id: str | None = None
    write_group_size: bool = True  # False: leave group_size unset (the stage's --group-size applies)


def _sample(
    plan: SynthPlan, rng: random.Random, gi: int, rid: int, sib: int, nsib: int, reward: float
) -> Sample:
    n = plan.tokens
    resp = max(1, n // 2)
    tokens = Array(np.asarray(
        [rng.randrange(32000) for _ in range(min(n, 64))] * (n // min(n, 64) + 1), dtype="<i4"
    )[:n])
    return Sample(
        group_index=gi, index=rid, rollout_id=rid, tokens=tokens, response_length=resp, reward=reward,
        loss_mask=Array(np.ones(resp, dtype="u1")),
        rollout_log_probs=Array(np.full(resp, -0.5 - sib, dtype="<f4")),
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
        changed.tokens = (
            Array(np.asarray(twin.tokens.numpy()[::-1], dtype="<i4")) if twin.tokens is not None else None
        )
        changed.prompt = twin.prompt + " (edited)"
        # Before the group's last member, so the conflict is seen while the group is still open.
        out.insert(i + 1, PlannedRecord(key, encode_sample(changed), gname))
        if n > 1:
            exp.dead_letters[R.CONFLICTING_DUPLICATE] += n + 1
        else:  # a one-sample group is complete with its first record: the edited copy comes too late
            exp.published_samples, exp.published_groups = n, 1
            exp.dead_letters[R.LATE_MEMBER] += 1
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


def plan_groups(
    plan: SynthPlan, groups: int, start_index: int = 0
) -> Iterator[tuple[list[PlannedRecord], Expected]]:
    rng = random.Random(plan.seed)
    for gi in range(start_index, start_index + groups):
        yield plan_group(plan, gi, rng)


def expect_records(plan: SynthPlan, records: list[PlannedRecord]) -> Expected:
    """What the worker makes of these records of one group, sent in this order and nothing after them, once
    its group timeout has passed: the verdict of the window state machine itself
    (rollout_stream.core.windows).

    For a group cut short (Ctrl-C during `synth`), whose outcome `plan_group` does not describe: the members
    sent may form an incomplete group, or a rejected one, or be published if only an extra record is missing.
    """
    config = WindowConfig(limits=SampleLimits(default_group_size=plan.group_size))  # as `--group-size` agrees
    store = WindowStore(config)
    outcomes = []
    for offset, planned in enumerate(records):
        record = InputRecord("synth", 0, offset, 0, planned.key, planned.value)
        try:
            decoded: Sample | DecodeError = decode_sample(planned.value)
        except DecodeError as exc:
            decoded = exc
        outcomes += store.accept(record, decoded, 0)
    outcomes += store.expire(config.group_timeout_ms + 1, {0})
    exp = Expected(records=len(records))
    for outcome in outcomes:
        if isinstance(outcome, Published):
            exp.published_samples += len(outcome.members)
            exp.published_groups += 1
        elif isinstance(outcome, DeadLettered):
            exp.dead_letters[outcome.reason] += len(outcome.records)
        elif isinstance(outcome, DuplicateDropped):
            exp.duplicates += 1
    return exp


@dataclass
class SendProgress:
    """What a send loop has handed to the producer: whole groups, and the records of the group under way."""

    plan: SynthPlan
    whole: Expected = field(default_factory=Expected)  # of the groups sent whole
    groups: int = 0  # sent whole
    current: list[PlannedRecord] = field(default_factory=list)  # sent records of the group under way
    current_size: int = 0  # records of the group under way in all

    def begin(self, records: list[PlannedRecord]) -> None:
        self.current, self.current_size = [], len(records)

    def sent(self, record: PlannedRecord) -> None:
        self.current.append(record)

    def done(self, expected: Expected) -> None:
        self.whole.add(expected)
        self.groups += 1
        self.current, self.current_size = [], 0

    @property
    def records(self) -> int:
        return self.whole.records + len(self.current)

    def expected(self) -> Expected:
        """The expectation for what was sent: the whole groups', and the worker's verdict on a part group."""
        total = Expected()
        total.add(self.whole)
        if self.current:
            total.add(expect_records(self.plan, self.current))
        return total


def expectation_document(progress: SendProgress, groups: int, *, interrupted: bool = False) -> dict[str, Any]:
    """synth's JSON line: what the stage must produce for what was sent, and when (docs/cli.md, "synth")."""
    total = progress.expected()
    doc: dict[str, Any] = {
        "run_id": progress.plan.run_id,
        "groups": progress.groups + (1 if progress.current else 0),
        "records": total.records,
        "expected_published_samples": total.published_samples,
        "expected_published_groups": total.published_groups,
        "expected_dead_letters": {str(k): v for k, v in sorted(total.dead_letters.items())},
        "expected_duplicates": total.duplicates,
        "due_after_group_timeout": total.due_after_group_timeout(),
    }
    if interrupted:
        doc["interrupted"] = True
        doc["groups_planned"] = groups
        doc["partial_group"] = (
            {
                "group": progress.current[0].group,
                "records_sent": len(progress.current),
                "records_planned": progress.current_size,
            }
            if progress.current
            else None
        )
    return doc


class _StopBetweenRecords:
    """SIGINT during a send loop: a record being handed to the producer is handed over whole and counted, then
    the loop stops; while it waits for --rate, at once. A second Ctrl-C stops at once wherever it lands."""

    def __init__(self) -> None:
        self.requested = False
        self.waiting = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.waiting or self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def check(self) -> None:
        if self.requested:
            raise KeyboardInterrupt


def send_groups(
    send: Callable[[bytes, bytes], object],
    plan: SynthPlan,
    groups: int,
    progress: SendProgress,
    *,
    start_index: int = 0,
    limiter: RateLimiter | None = None,
    report: Callable[[int], None] | None = None,
) -> None:
    """Send `groups` prompt groups of `plan` through `send(key, value)`, recording each in `progress`.

    Ctrl-C (SIGINT, in the main thread) ends it with KeyboardInterrupt between two records, so `progress`
    says exactly which records were handed to `send`. `report(n)` is called after every 1000th group.
    """
    stop = _StopBetweenRecords()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    catch = previous is not None and previous is not signal.SIG_IGN  # an ignored SIGINT stays ignored
    if catch:
        signal.signal(signal.SIGINT, stop)
    try:
        for i, (records, expected) in enumerate(plan_groups(plan, groups, start_index)):
            progress.begin(records)
            for rec in records:
                stop.check()
                if limiter is not None:
                    stop.waiting = True
                    limiter.wait()
                    stop.waiting = False
                stop.check()
                send(rec.key, rec.value)
                progress.sent(rec)
            progress.done(expected)
            if report is not None and (i + 1) % 1000 == 0:
                report(i + 1)
    finally:
        if catch:
            signal.signal(signal.SIGINT, previous)


def interruption_summary(progress: SendProgress) -> str:
    """One line for stderr: what an interrupted `synth` sent, and what becomes of a group it cut short."""
    if not progress.records:
        return "synth: interrupted before sending anything; nothing was sent"
    whole = f"{progress.groups} whole group(s)"
    line = f"synth: interrupted after {progress.records} record(s): {whole}"
    if progress.current:
        part = expect_records(progress.plan, progress.current)
        verdict = [f"{n} published" for n in (part.published_samples,) if n]
        later = " after the worker's --group-timeout"
        verdict += [
            f"{n} {reason}{later if reason in DUE_AFTER_GROUP_TIMEOUT else ''}"
            for reason, n in sorted(part.dead_letters.items())
        ]
        verdict += [f"{n} duplicate(s) dropped" for n in (part.duplicates,) if n]
        line += (
            f" and {len(progress.current)} of the {progress.current_size} records of group "
            f"{progress.current[0].group} (expect {', '.join(verdict) or 'nothing'})"
        )
    return line + "; the JSON on stdout is the expectation for what was sent"


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
