"""`rollout-stream lag`: where each party of the pipeline is, from the progress topic and the offsets.

Producers (newest weight version, groups admitted and outstanding, waiting or not), the stage (input lag of
its consumer group, open groups as its workers last said), each trainer group (batch, groups consumed,
weight version, policy lag behind the producers, train-data records it has not committed, groups waiting
for it), and the admission log as its fold says (requests waiting, groups holding room, leases). A party
whose last record is older than `stale_after_s` is shown as stale (docs/pacing.md).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table

from rollout_stream.clients import Connection
from rollout_stream.codec.progress import ProducerProgress, StageProgress, TrainerProgress
from rollout_stream.kafka import TopicPartition, client_for
from rollout_stream.layout import Fit, Flow
from rollout_stream.names import admission_topic, heads_topic, progress_topic, rank_group_id
from rollout_stream.ops.heads_cover import uncovered_records
from rollout_stream.ops.records_behind import records_behind
from rollout_stream.pacing import AdmissionFollower, ProgressBoard
from rollout_stream.pacing.positions import ProducerRow, TrainerRow, age_s, producer_row, trainer_row
from rollout_stream.topics import missing_topics

__all__ = ["AdmissionRow", "LagReport", "ProducerRow", "StageRow", "TrainerRow", "lag_report", "render_lag"]


@dataclass(frozen=True)
class StageRow:
    group_id: str
    input_topic: str
    input_lag_records: int | None  # records after the worker group's commits (None: no commit yet)
    open_groups: int | None  # what its workers last published (None: none did)
    workers: int | None  # workers that published progress (None: none did; only --metrics-port ones do)
    age_s: float | None
    stale: bool


@dataclass(frozen=True)
class AdmissionRow:
    """The admission log folded to its end: what paced producers wait on."""

    topic: str
    records: int  # folded
    pending_requests: int
    oldest_pending_s: float | None  # by the log's clock
    outstanding_groups: dict[str, int]  # per trainer group: admitted, not yet consumed or resolved
    unsent_groups: int
    sessions: dict[str, str]  # producer -> ok | suspected (no renewal for 3 s of log time)
    trainer_mark_age_s: dict[str, float]  # per trainer group, by the log's clock
    expired_groups: int  # sent groups given up on after 15 minutes


@dataclass(frozen=True)
class LagReport:
    progress_topic: str
    stale_after_s: float
    producers: list[ProducerRow] = field(default_factory=list)
    stages: list[StageRow] = field(default_factory=list)
    trainers: list[TrainerRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    admission: AdmissionRow | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _admission(conn: Connection, topic: str, wait_s: float, notes: list[str]) -> AdmissionRow | None:
    """Fold the admission log to its end (at most `wait_s`)."""
    if missing_topics(conn, [topic]):
        return None
    client = client_for(conn)
    consumer = client.assigned_consumer(client_id=conn.client_id, max_record_bytes=1 << 20)
    try:
        end = consumer.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)]
    finally:
        consumer.close()
    follower = AdmissionFollower(conn, topic, client)
    try:
        if end > 0 and not follower.wait_folded(end - 1, wait_s):
            notes.append(f"{topic} was not folded to its end within {wait_s:g}s")
        snap = follower.snapshot()
        expired = follower.read(lambda fold: fold.expired)
    finally:
        follower.close()
    return AdmissionRow(
        topic, snap.folded_through + 1, snap.pending,
        None if snap.oldest_pending_ms is None else round(snap.oldest_pending_ms / 1000, 1),
        snap.outstanding, snap.unsent, snap.sessions,
        {t: round(ms / 1000, 1) for t, ms in snap.trainer_mark_age_ms.items()}, expired)


def lag_report(conn: Connection, *, output_topic: str, input_topic: str, stage_group_id: str,
               stale_after_s: float = 60.0, wait_s: float = 10.0) -> LagReport:
    """Read the progress topic to its end (at most `wait_s`) and the offsets, and say where everyone is."""
    topic = progress_topic(output_topic)
    notes: list[str] = []
    producers: list[ProducerProgress] = []
    stages: list[StageProgress] = []
    trainers: list[TrainerProgress] = []
    if missing_topics(conn, [topic]):
        notes.append(f"{topic} does not exist: no trainer, paced producer or worker with --metrics-port has "
                     "written progress on this train-data topic yet")
    else:
        board = ProgressBoard(conn, topic)
        try:
            if not board.wait_caught_up(wait_s):
                notes.append(f"{topic} was not read to its end within {wait_s:g}s")
            producers, stages, trainers = board.producers(), board.stages(), board.trainers()
        finally:
            board.close()
    now = int(time.time() * 1000)
    stale_ms = stale_after_s * 1000
    producer_rows = [producer_row(p, now, stale_ms) for p in producers]
    behind = records_behind(conn, output_topic, {t.group_id: rank_group_id(t.group_id, 0) for t in trainers})
    # Ranks of TrainDataReader(fetch="own") commit on the group heads, one record per group; what the heads
    # leave out of train-data they never read, however level with the heads they are
    own = [g for g, n in behind.items() if n is None]
    uncovered: int | None = None
    if own and not missing_topics(conn, [heads := heads_topic(output_topic)]):
        for g, n in records_behind(conn, heads, {g: rank_group_id(g, 0) for g in own}).items():
            if n is not None:
                behind[g] = n
                notes.append(f"trainer {g} reads {heads} (fetch='own'): its 'behind' counts groups")
        uncovered = uncovered_records(conn, output_topic)
        if uncovered:
            notes.append(f"{output_topic} holds {uncovered} record(s) after those its last group heads point "
                         f"at (published without --write-heads?): trainers that read {heads} never read them")
    stage_lag = records_behind(conn, input_topic, {stage_group_id: stage_group_id})[stage_group_id]
    mine = [s for s in stages if s.group_id == stage_group_id and s.input_topic == input_topic]
    fresh_stages = [s for s in mine if now - s.updated_ms <= stale_ms]
    newest = max((s.updated_ms for s in mine), default=None)
    stage_rows = [StageRow(
        stage_group_id, input_topic, stage_lag,
        sum(s.open_groups for s in fresh_stages) if fresh_stages else None, len(fresh_stages) or None,
        None if newest is None else age_s(newest, now), bool(mine) and not fresh_stages)]
    trainer_rows = [trainer_row(t, producer_rows, behind.get(t.group_id), now, stale_ms) for t in trainers]
    trainer_rows = [replace(row, uncovered_records=uncovered) if row.group_id in own and uncovered else row
                    for row in trainer_rows]
    if not trainers and not notes:
        notes.append("no trainer has published progress (a TrainDataReader publishes it from rank 0)")
    admission = _admission(conn, admission_topic(output_topic), wait_s, notes)
    return LagReport(topic, stale_after_s, producer_rows, stage_rows, trainer_rows, notes, admission)


# ---- rendering -------------------------------------------------------------------------------------
# Only workers started with --metrics-port publish progress: none seen is not none running.
UNKNOWN_WORKERS = "start run with --metrics-port to report"
_HEADERS = ("party", "name", "version", "position", "behind", "updated", "state")


def _dash(value: object) -> str:
    return "-" if value is None else str(value)


def _rows(report: LagReport) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for p in report.producers:
        state = "stale" if p.stale else ("waiting" if p.waiting else "ok")
        rows.append(("producer", p.producer_id, _dash(p.newest_weight_version),
                     f"{p.admitted} admitted, {p.outstanding} outstanding", f"waited {p.wait_s:.1f}s",
                     f"{p.age_s:g}s ago", state))
    for s in report.stages:
        workers = (f"{_dash(s.open_groups)} open groups ({s.workers} worker(s))" if s.workers else
                   f"workers: unknown ({UNKNOWN_WORKERS})")
        rows.append(("stage", s.group_id, "-", workers,
                     f"{_dash(s.input_lag_records)} input records",
                     "-" if s.age_s is None else f"{s.age_s:g}s ago", "stale" if s.stale else "ok"))
    for t in report.trainers:
        rows.append(("trainer", t.group_id, _dash(t.weight_version),
                     f"batch {_dash(t.batch)}, {t.consumed_groups} groups ({t.skipped_stale_groups} stale)"
                     + (f", {t.stale_rollouts} stale rollouts ({t.stale_tokens} tokens) left out"
                        if t.stale_rollouts or t.stale_tokens else ""),
                     f"policy lag {_dash(t.policy_lag)}, {t.groups_waiting} groups waiting, "
                     f"{_dash(t.records_behind)} records"
                     + (f", {t.uncovered_records} no head covers" if t.uncovered_records else ""),
                     f"{t.age_s:g}s ago", "stale" if t.stale else "ok"))
    return rows


def _table(rows: list[tuple[str, ...]]) -> Table:
    table = Table(header_style="bold")  # its border ends every line: no trailing spaces in a pipe
    for h in _HEADERS:
        table.add_column(h, no_wrap=True)
    for row in rows:
        table.add_row(*(escape(c) for c in row))
    return table


def _stacked(rows: list[tuple[str, ...]]) -> Group:
    lines: list[RenderableType] = []
    for party, name, version, position, behind, updated, state in rows:
        lines.append(Flow(f"{party} {name}: {state}, weight version {version}, updated {updated}", indent=4))
        lines.append(Flow(f"{position}; {behind}", first=2, indent=4))
    return Group(*lines)


def _admission_line(a: AdmissionRow) -> str:
    held = ", ".join(f"{n} for {escape(t)}" for t, n in sorted(a.outstanding_groups.items())) or "none"
    suspected = sum(state == "suspected" for state in a.sessions.values())
    marks = ", ".join(f"{escape(t)} {age:g}s ago"
                      for t, age in sorted(a.trainer_mark_age_s.items())) or "none"
    oldest = "" if a.oldest_pending_s is None else f" (oldest {a.oldest_pending_s:g}s)"
    return (f"admission log {escape(a.topic)}: {a.pending_requests} request(s) waiting{oldest}; groups "
            f"holding room: {held} ({a.unsent_groups} not sent yet); producers: "
            f"{len(a.sessions) - suspected} renewing, {suspected} suspected; trainer marks: {marks}"
            + (f"; {a.expired_groups} sent group(s) given up on" if a.expired_groups else ""))


def render_lag(report: LagReport) -> RenderableType:
    """One table (a block per party where it does not fit), then the notes."""
    rows = _rows(report)
    parts: list[RenderableType] = [Fit(_table(rows), _stacked(rows))] if rows else []
    if report.admission is not None:
        parts.append(Flow(_admission_line(report.admission), indent=2))
    parts += [Flow(note, style="dim") for note in report.notes]
    return Group(*parts)
