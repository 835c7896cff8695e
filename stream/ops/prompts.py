"""Where every prompt source stands, from the admission log (docs/loop.md): `rollout-stream prompts`.

The log is folded to its end from its newest checkpoint, with the same fold the rollout processes run, so
what is shown is what they decide on.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table

from rollout_stream.core.prompt_keys import parse_attempt_key
from rollout_stream.core.prompt_records import attempt_history
from rollout_stream.core.prompts import EpochStatus, PromptLog, PromptRecord, PromptState
from rollout_stream.layout import Flow
from rollout_stream.prompts.fence import fold_admission_log

__all__ = ["PromptsReport", "SourceReport", "fold_admission_log", "iso_utc", "parse_prompt_id", "prompt_json",
           "prompts_report", "render_prompt", "render_prompts"]

RATE_WINDOW_MS = 300_000  # trained prompts over the last 5 minutes of log time make the rate


@dataclass(frozen=True, slots=True)
class SourceReport:
    name: str
    prompts: int
    seed: int
    epochs_declared: int | None
    max_attempts: int
    refused_declarations: int
    epochs: list[EpochStatus]
    trained_per_s: float | None  # over the last 5 minutes of log time (None: nothing trained then)
    eta_s: float | None  # until every epoch declared (or the open one, when endless) is settled
    refills: int  # zero-variance prompts filtered, another prompt taken in their place
    batches: int  # committed trainer batches that trained a group of the source
    batch_refills: dict[int, int]  # refills -> how many of those batches had that many
    exhausted_unrecorded: list[str]  # exhausted prompts whose dead-letter record is not written yet


@dataclass(frozen=True, slots=True)
class PromptsReport:
    topic: str
    records: int
    sources: list[SourceReport]
    # exhausted prompts that trained after all (a group sent before the exhaustion; docs/loop.md), and second
    # trainings of a trained prompt (the reader's fence keeps it at 0), over every source of the log
    late_trained: int = 0
    duplicates: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def prompts_report(topic: str, fold: PromptLog) -> PromptsReport:
    sources = []
    for name, src in sorted(fold.sources.items()):
        epochs = fold.status(name)
        trained_recently = sum(
            1 for ep in src.epochs for rec in ep.prompts.values() if rec.state is PromptState.TRAINED
            and (ended := rec.attempts[-1].ended_ms) is not None and fold.clock_ms - ended <= RATE_WINDOW_MS)
        rate = trained_recently / (RATE_WINDOW_MS / 1000) if trained_recently else None
        open_epochs = epochs if src.dataset.epochs is None else epochs + [
            EpochStatus(e, src.dataset.prompts, src.dataset.prompts, 0, 0, {}, 0, 0, 0)
            for e in range(len(epochs), src.dataset.epochs)]
        left = sum(s.waiting + s.in_flight for s in open_epochs)
        sources.append(SourceReport(name, src.dataset.prompts, src.dataset.seed, src.dataset.epochs,
                                    src.dataset.max_attempts, src.refused, epochs,
                                    None if rate is None else round(rate, 3),
                                    None if rate is None else round(left / rate, 1),
                                    src.refills, sum(src.batch_refills.values()),
                                    dict(sorted(src.batch_refills.items())),
                                    [f"{name}@{x.epoch}/{x.prompt}" for x in src.unrecorded]))
    return PromptsReport(topic, fold.next_offset, sources, fold.late_trained, fold.duplicates)


# how an attempt ended without a result (rollout_stream.core.prompt_records.AttemptEnd), as the report says it
REISSUE_WHY = {"lease": "lease ended", "failed": "failed in its process", "incomplete": "group timed out",
               "skipped": "skipped by the trainer", "unconsumed": "never consumed"}


def _bar(done: int, total: int, width: int = 10) -> str:
    filled = 0 if total == 0 else round(width * done / total)
    return "█" * filled + "░" * (width - filled) + f" {0 if total == 0 else 100 * done // total:3d}%"


def render_prompts(report: PromptsReport) -> RenderableType:
    if not report.sources:
        return Flow(f"{escape(report.topic)}: no prompt source has declared a dataset ({report.records} "
                    f"records folded)", style="dim")
    parts: list[RenderableType] = []
    for s in report.sources:
        rate = "-" if s.trained_per_s is None else f"{s.trained_per_s:g} trained/s"
        eta = "" if s.eta_s is None else f", ETA {s.eta_s:.0f}s"
        epochs = "endless" if s.epochs_declared is None else f"{s.epochs_declared} epoch(s)"
        parts.append(Flow(f"source {escape(s.name)}: {s.prompts} prompts, {epochs}, seed {s.seed}, at most "
                          f"{s.max_attempts} attempts; {rate}{eta}"
                          + (f"; {s.refused_declarations} declaration(s) over other data refused"
                             if s.refused_declarations else "")))
        table = Table(box=None, pad_edge=False)
        for column in ("epoch", "waiting", "in flight", "trained", "dead-lettered", "filtered", "re-issued",
                       "exhausted", "settled"):
            table.add_column(column, justify="left" if column in ("dead-lettered", "settled") else "right",
                             no_wrap=True)
        for e in s.epochs:
            dead = ", ".join(f"{escape(r)} {n}" for r, n in sorted(e.dead_lettered.items())) or "0"
            settled = e.trained + sum(e.dead_lettered.values()) + e.filtered + e.exhausted
            table.add_row(str(e.epoch), str(e.waiting), str(e.in_flight), str(e.trained), dead,
                          str(e.filtered), str(e.reissued), str(e.exhausted), _bar(settled, e.prompts))
        parts.append(table)
        for e in s.epochs:
            if e.reissued_by:
                parts.append(Flow(f"epoch {e.epoch} re-issued after: " + ", ".join(
                    f"{REISSUE_WHY.get(why, why)} {n}" for why, n in e.reissued_by.items())))
            if e.partial:
                parts.append(Flow(f"epoch {e.epoch}: {e.partial} trained in part (staleness by rollout or "
                                  f"token left out {e.excluded_rollouts} rollout(s), {e.excluded_tokens} "
                                  f"loss token(s))"))
        if s.exhausted_unrecorded:
            parts.append(Flow(f"exhausted, dead-letter record not written yet (a live process of the source "
                              f"writes it): {escape(', '.join(s.exhausted_unrecorded[:10]))}"
                              + (f" and {len(s.exhausted_unrecorded) - 10} more"
                                 if len(s.exhausted_unrecorded) > 10 else "")))
        if s.refills:
            per_batch = ", ".join(f"{n}: {b}" for n, b in s.batch_refills.items())
            parts.append(Flow(f"refills: {s.refills} zero-variance prompt(s) replaced; batches by refills "
                              f"({s.batches} committed) {per_batch or '-'}"))
    if report.late_trained or report.duplicates:
        parts.append(Flow(f"trained after exhaustion: {report.late_trained}; trained twice: "
                          f"{report.duplicates}", style="yellow"))
    return Group(*parts)


def parse_prompt_id(text: str) -> tuple[str, int, int] | None:
    """`SOURCE@EPOCH/ROW`, or an attempt's group key `SOURCE@EPOCH.ATTEMPT/ROW`."""
    parsed = parse_attempt_key(text)
    if parsed is not None:
        return parsed.source, parsed.epoch, parsed.prompt
    head, _, row = text.rpartition("/")
    source, _, epoch = head.rpartition("@")
    if not (source and epoch.isdigit() and row.isdigit()):
        return None
    return source, int(epoch), int(row)


def iso_utc(ms: int | None) -> str | None:
    """Log time (epoch ms) as ISO-8601 UTC to the millisecond: `2026-12-06T10:15:02.117Z`."""
    if ms is None:
        return None
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def prompt_json(source: str, epoch: int, row: int, rec: PromptRecord) -> dict[str, Any]:
    """One prompt's state and attempts (`prompts show --json`): log times as epoch ms and ISO-8601 UTC."""
    attempts = [{**plain, "taken_at": iso_utc(a.taken_ms), "ended_at": iso_utc(a.ended_ms)}
                for a, plain in zip(rec.attempts, attempt_history(rec.attempts), strict=True)]
    return {"source": source, "epoch": epoch, "prompt": row, "state": rec.state.value, "reason": rec.reason,
            "attempts": attempts}


def render_prompt(detail: dict[str, Any]) -> RenderableType:
    head = (f"prompt {escape(detail['source'])}@{detail['epoch']}/{detail['prompt']}: {detail['state']}"
            + (f" ({escape(detail['reason'])})" if detail["reason"] else ""))
    if not detail["attempts"]:
        return Flow(head + "; its epoch is settled, so its attempts are no longer kept")
    table = Table(box=None, pad_edge=False)
    for column in ("attempt", "producer", "taken (UTC)", "ended (UTC)", "sent", "delivered", "ended",
                   "trained in"):
        table.add_column(column, no_wrap=True)
    errors = []
    for a in detail["attempts"]:
        trained = "" if a["batch"] is None else f"{escape(a['trainer'])} batch {a['batch']}"
        if a.get("excluded_rollouts") or a.get("excluded_tokens"):
            errors.append(Flow(f"attempt {a['attempt']} trained in part: staleness left out "
                               f"{a['excluded_rollouts']} rollout(s), {a['excluded_tokens']} loss token(s)"))
        table.add_row(str(a["attempt"]), escape(a["producer"]), a["taken_at"], a["ended_at"] or "",
                      "yes" if a["sent"] else "no",
                      "yes" if a["delivered"] else "no", a["ended"] or "in flight", trained)
        if a.get("error"):
            errors.append(Flow(f"attempt {a['attempt']} error: {escape(a['error'])}"))
    return Group(Flow(head), table, *errors)
