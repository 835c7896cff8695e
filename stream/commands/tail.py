"""`rollout-stream tail`: follow the train-data topic one prompt group at a time, as a person reads it."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from codec import TrainSample
from core.validate import rollout_key
from stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions, connection_from_options
from stream.commands.options import DEFAULT_TOPICS, Bootstrap, OutputTopic, fail, grouped_options
from stream.topics import MissingTopic, require_topics

if TYPE_CHECKING:
    from stream.reader import GroupInfo

__all__ = ["register", "group_block"]


def _rollouts(samples: Sequence[TrainSample]) -> list[list[TrainSample]]:
    """Samples by rollout, rollouts in order of first appearance (siblings together)."""
    by_key: dict[object, list[TrainSample]] = {}
    out: list[list[TrainSample]] = []
    for i, s in enumerate(samples):
        key = rollout_key(s.sample)
        tagged = ("row", i) if key is None else (type(key), key)
        if tagged not in by_key:
            by_key[tagged] = []
            out.append(by_key[tagged])
        by_key[tagged].append(s)
    return out


def _reward(value: float) -> str:
    return f"{value:+.4f}"


def group_block(info: GroupInfo, samples: Sequence[TrainSample]) -> Panel:
    """One prompt group: a row per rollout (raw reward → processed reward), its sibling samples under it."""
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    table.add_column("rollout")
    table.add_column("raw → processed", justify="right")
    table.add_column("sample")
    table.add_column("tokens", justify="right")
    table.add_column("response", justify="right")
    table.add_column("loss tokens", justify="right")
    table.add_column("versions")
    table.add_column("status")
    for rollout in _rollouts(samples):
        first = rollout[0]
        for j, s in enumerate(sorted(rollout, key=lambda t: t.sample.sibling_index)):
            sample = s.sample
            mask = sample.loss_mask
            loss_tokens = 0 if sample.remove_sample else (
                sample.response_length if mask is None else int((mask.numpy() != 0).sum()))
            table.add_row(
                str(rollout_key(first.sample)) if j == 0 else "",
                f"{s.raw_reward:g} → {_reward(s.reward)}" if j == 0 else "",
                f"{'└ ' if len(rollout) > 1 else ''}{sample.sibling_index + 1}/{sample.sibling_count}",
                str(len(sample.tokens) if sample.tokens is not None else 0),
                str(sample.response_length),
                str(loss_tokens),
                ",".join(sample.weight_versions) or "-",
                sample.status + (" (removed)" if sample.remove_sample else ""),
            )
    oldest = info.oldest_weight_version
    stats = Text.assemble(
        (f"{info.rollouts} rollouts, {info.samples} samples", "bold"),
        f"   mean {info.mean:.4f}  std {info.std:.4f}",
        ("   zero variance" if info.zero_variance else "", "yellow"),
        f"   oldest weight version {oldest if oldest is not None else '-'}",
    )
    where = f"partition {info.partition}, offsets {info.first_offset}–{info.last_offset}"
    return Panel(Group(stats, table), title=f"[bold]group {info.key}[/]", subtitle=where, title_align="left",
                 subtitle_align="right")


@grouped_options
def tail(
    bootstrap_servers: Bootstrap = None,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    from_beginning: Annotated[bool, typer.Option(
        "--from-beginning", help="Start at the oldest record (default: only new groups).")] = False,
    groups: Annotated[int | None, typer.Option(
        "--groups", min=1, show_default=False, help="Stop after N groups (default: until Ctrl-C).")] = None,
    partition_idle_ms: Annotated[int, typer.Option(
        help="Wait this long for an empty partition before showing a group out of order.")] = 1000,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Follow train-data: one block per prompt group, each rollout's raw → processed reward, siblings grouped.

    Reads with read_committed and never commits (no consumer group is created).
    """
    from stream.reader import TrainDataReader  # imports torch: only when tail runs, not for every command

    console = Console()
    conn = connection_from_options(bootstrap_servers, security)
    try:
        require_topics(conn, {output_topic: "--output-topic"})
    except MissingTopic as exc:
        fail(str(exc), 2)
    shown = 0
    reader = TrainDataReader(conn, output_topic, f"rollout-stream-tail-{uuid.uuid4().hex[:8]}",
                             groups_per_batch=1, start="earliest" if from_beginning else "latest",
                             partition_idle_ms=partition_idle_ms)
    try:
        for batch in reader:
            if batch.groups:
                console.print(group_block(batch.groups[0], batch.samples))
                shown += 1
            if batch.skipped_invalid:
                console.print(f"[yellow]skipped {batch.skipped_invalid} group(s) that cannot be collated[/]")
            if groups is not None and shown >= groups:
                break
    except KeyboardInterrupt:
        pass
    finally:
        reader.close()
        st = reader.stats
        extra = [f"{n} {what}" for n, what in ((st.duplicate_records, "duplicate records"),
                                               (st.duplicate_groups, "duplicate groups"),
                                               (st.decode_errors, "undecodable records")) if n]
        console.file.flush()
        dropped = f"; dropped {', '.join(extra)}" if extra else ""
        Console(stderr=True).print(f"{shown} group(s) shown{dropped}")


def register(app: typer.Typer) -> None:
    app.command("tail")(tail)
