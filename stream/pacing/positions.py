"""Where producers and trainer groups are, from their progress records: what `rollout-stream lag` shows
and the worker's metrics endpoint exposes (one derivation for both)."""

from __future__ import annotations

from dataclasses import dataclass

from rollout_stream.codec.progress import ProducerProgress, TrainerProgress

__all__ = ["ProducerRow", "TrainerRow", "age_s", "producer_row", "trainer_row"]


@dataclass(frozen=True)
class ProducerRow:
    producer_id: str
    trainer_group: str
    newest_weight_version: int | None
    admitted: int
    outstanding: int
    waiting: bool
    wait_s: float
    age_s: float
    stale: bool


@dataclass(frozen=True)
class TrainerRow:
    group_id: str
    weight_version: int | None
    batch: int | None
    consumed_groups: int
    trained_groups: int
    skipped_stale_groups: int
    policy_lag: int | None  # its weight version − the oldest newest version of the producers pacing to it
    groups_waiting: int  # outstanding groups of the live producers pacing to it
    records_behind: int | None  # train-data records after rank 0's commit
    tokens_per_s: float
    lag_counts: dict[int, int]
    age_s: float
    stale: bool
    # fetch="own" trainers: train-data records after those the last group heads point at (never read by them)
    uncovered_records: int | None = None
    # staleness by rollout or token: rollouts and loss tokens left out of groups that trained
    stale_rollouts: int = 0
    stale_tokens: int = 0


def age_s(updated_ms: int, now_ms: int) -> float:
    return round(max(0.0, (now_ms - updated_ms) / 1000), 1)


def producer_row(p: ProducerProgress, now: int, stale_ms: float) -> ProducerRow:
    return ProducerRow(p.producer_id, p.trainer_group, p.newest_weight_version, p.admitted, p.outstanding,
                       p.waiting, p.wait_s, age_s(p.updated_ms, now), now - p.updated_ms > stale_ms)


def trainer_row(t: TrainerProgress, producers: list[ProducerRow], records_behind: int | None, now: int,
                 stale_ms: float) -> TrainerRow:
    live = [p for p in producers if not p.stale and p.trainer_group == t.group_id]
    versions = [p.newest_weight_version for p in live if p.newest_weight_version is not None]
    policy_lag = (t.weight_version - min(versions)
                  if t.weight_version is not None and versions else None)
    return TrainerRow(
        t.group_id, t.weight_version, t.batch, t.consumed_groups, t.trained_groups, t.skipped_stale_groups,
        policy_lag, sum(p.outstanding for p in live), records_behind, t.tokens_per_s, dict(t.lag_counts),
        age_s(t.updated_ms, now), now - t.updated_ms > stale_ms, stale_rollouts=t.stale_rollouts,
        stale_tokens=t.stale_tokens)


