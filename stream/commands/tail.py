"""`rollout-stream tail`: follow the train-data topic one prompt group at a time, as a person reads it."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from rollout_stream.codec import TrainSample
from rollout_stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions, connection_from_options
from rollout_stream.commands.local import running_local_broker
from rollout_stream.commands.options import DEFAULT_TOPICS, Bootstrap, OutputTopic, grouped_options
from rollout_stream.config import check_seconds
from rollout_stream.core.assembly import loss_tokens
from rollout_stream.core.rewards import declared_rollout_key
from rollout_stream.layout import Fit, Flow, output_console
from rollout_stream.topics import partition_count, require_topics

if TYPE_CHECKING:
    from rollout_stream.reader import GroupInfo

__all__ = ["following", "group_block", "register"]


def _rollouts(samples: Sequence[TrainSample]) -> list[list[TrainSample]]:
    """Samples by rollout, rollouts in order of first appearance (siblings together)."""
    by_key: dict[object, list[TrainSample]] = {}
    out: list[list[TrainSample]] = []
    for i, s in enumerate(samples):
        key = declared_rollout_key(s.sample)
        tagged = ("row", i) if key is None else (type(key), key)
        if tagged not in by_key:
            by_key[tagged] = []
            out.append(by_key[tagged])
        by_key[tagged].append(s)
    return out


def _reward(value: float) -> str:
    return f"{value:+.4f}"


_HEADERS = ("rollout", "raw → processed", "sample", "tokens", "response", "loss tokens", "versions", "status")


def _cells(samples: Sequence[TrainSample]) -> list[list[str]]:
    """A row per sample, rollouts in order of first appearance, siblings by index; the rollout and its
    reward only on its first row."""
    rows = []
    for rollout in _rollouts(samples):
        first = rollout[0]
        for j, s in enumerate(sorted(rollout, key=lambda t: t.sample.sibling_index)):
            sample = s.sample
            rows.append([
                str(declared_rollout_key(first.sample)) if j == 0 else "",
                f"{s.raw_reward:g} → {_reward(s.reward)}" if j == 0 else "",
                f"{'└ ' if len(rollout) > 1 else ''}{sample.sibling_index}/{sample.sibling_count}",
                str(len(sample.tokens) if sample.tokens is not None else 0),
                str(sample.response_length),
                str(loss_tokens(sample)),
                ",".join(sample.weight_versions) or "-",
                sample.status + (" (removed)" if sample.remove_sample else ""),
            ])
    return rows


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], keep: Sequence[int]) -> Table:
    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    for i in keep:
        table.add_column(headers[i], justify="right" if i in (1, 3, 4, 5) else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(escape(row[i]) for i in keep))
    return table


def _narrow(rows: Sequence[Sequence[str]]) -> Group:
    """Shorter headers, and versions and status as a legend when every sample has the same."""
    headers = ("rollout", "raw → processed", "sample", "tokens", "resp", "loss", "versions", "status")
    keep = [0, 1, 2, 3, 4, 5]
    same = []
    for i, name in ((6, "weight versions"), (7, "status")):
        values = {row[i] for row in rows}
        if len(values) == 1:
            same.append(f"{name} {values.pop()}")
        else:
            keep.append(i)
    legend = "resp: response tokens, loss: tokens in the loss mask" + (
        f"; every sample has {' and '.join(same)}" if same else "")
    return Group(_table(headers, rows, keep), Flow(legend, indent=2, style="dim"))


def _stacked(rows: Sequence[Sequence[str]]) -> Group:
    lines: list[RenderableType] = []
    for rollout, reward, sample, tokens, response, loss, versions, status in rows:
        if rollout:
            lines.append(Flow(f"rollout {rollout}: {reward}", indent=4))
        lines.append(Flow(f"{sample}  {tokens} tokens, response {response}, loss {loss}, "
                          f"versions {versions}, {status}", first=2, indent=6))
    return Group(*lines)


class _GroupBlock:
    """A panel per group; its title goes inside where the border has no room for all of it (rich cuts it)."""

    def __init__(self, info: GroupInfo, body: RenderableType, expand: bool) -> None:
        self.info, self.body, self.expand = info, body, expand

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        info = self.info
        title = f"group {info.key}"
        where = f"partition {info.partition}, offsets {info.first_offset}–{info.last_offset}"
        room = options.max_width - 6  # corners, a rule character and a space on each side
        title_inside, where_inside = cell_len(title) > room, cell_len(where) > room
        inside = [Flow(Text(title, style="bold"), indent=2)] if title_inside else []
        inside += [Flow(where, indent=2)] if where_inside else []
        yield Panel(Group(*inside, self.body), title=None if title_inside else f"[bold]{escape(title)}[/]",
                    subtitle=None if where_inside else escape(where), title_align="left",
                    subtitle_align="right", expand=self.expand)


def group_block(info: GroupInfo, samples: Sequence[TrainSample], *, expand: bool = True) -> RenderableType:
    """One prompt group: a row per rollout (raw reward → processed reward), its sibling samples under it;
    fewer columns with a legend, or a paragraph per rollout, where the table does not fit."""
    rows = _cells(samples)
    oldest = info.oldest_weight_version
    stats = Text.assemble(
        (f"{info.rollouts} rollouts, {info.samples} samples", "bold"),
        f"   mean {info.mean:.4f}  std {info.std:.4f}",
        ("   zero variance" if info.zero_variance else "", "yellow"),
        f"   oldest weight version {oldest if oldest is not None else '-'}",
    )
    body = Group(Flow(stats, indent=2), Fit(_table(_HEADERS, rows, range(8)), _narrow(rows), _stacked(rows)))
    return _GroupBlock(info, body, expand)


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

    Reads with read_committed and never commits (no consumer group is created). Says on stderr what it
    follows as soon as it starts; Ctrl-C stops it with exit 130.
    """
    from rollout_stream.reader import (
        TrainDataReader,  # imports torch: only when tail runs, not for every command
    )

    check_seconds("--partition-idle-ms", partition_idle_ms, zero=True, unit="ms", unit_s=0.001)
    console = output_console()
    conn = connection_from_options(bootstrap_servers, security, local=running_local_broker)
    require_topics(conn, {output_topic: "--output-topic"})  # MissingTopic: exit 2
    # at once: an empty topic shows nothing until its first group, which looks like a hang
    print(following(output_topic, partition_count(conn, output_topic), from_beginning, groups),
          file=sys.stderr, flush=True)
    shown = 0
    interrupted = False
    reader = TrainDataReader(conn, output_topic, f"rollout-stream-tail-{uuid.uuid4().hex[:8]}",
                             groups_per_batch=1, start="earliest" if from_beginning else "latest",
                             partition_idle_ms=partition_idle_ms, publish_progress=False)
    try:
        for batch in reader:
            if batch.groups:
                console.print(group_block(batch.groups[0], batch.samples, expand=console.is_terminal))
                shown += 1
            if batch.skipped_invalid:
                console.print(f"[yellow]skipped {batch.skipped_invalid} group(s) that cannot be collated[/]")
            if groups is not None and shown >= groups:
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        reader.close()
        st = reader.stats
        extra = [f"{n} {what}" for n, what in ((st.duplicate_records, "duplicate records"),
                                               (st.duplicate_groups, "duplicate groups"),
                                               (st.decode_errors, "undecodable records")) if n]
        console.file.flush()
        dropped = f"; dropped {', '.join(extra)}" if extra else ""
        Console(stderr=True).print(f"{shown} group(s) shown{dropped}")
    if interrupted:  # 128 + SIGINT, as shells and supervisors expect of a command stopped by Ctrl-C
        raise typer.Exit(130)


def following(topic: str, partitions: int | None, from_beginning: bool, groups: int | None) -> str:
    """The line `tail` says first: what it follows, from where, until when."""
    where = f" ({partitions} partition{'s' if partitions > 1 else ''})" if partitions else ""
    start = "from the beginning" if from_beginning else "from its end (new groups only)"
    until = f"; stops after {groups} group(s)" if groups is not None else "; Ctrl-C stops"
    return f"following {topic}{where} {start}{until}; waiting for groups…"


def register(app: typer.Typer) -> None:
    app.command("tail")(tail)
