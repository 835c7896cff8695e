"""`rollout-stream dlq …`: inspect the dead-letter topic and replay what was refused (docs/dlq.md)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import typer
from rich.console import RenderableType

from rollout_stream.clients import MAX_RECORD_BYTES, Connection
from rollout_stream.codec import DeadLetterReason
from rollout_stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions, connection_from_options
from rollout_stream.commands.local import running_local_broker
from rollout_stream.commands.options import (
    DEFAULT_TOPICS,
    Bootstrap,
    CommandGroup,
    DeadLetterTopic,
    fail,
    grouped_options,
    option_group,
)
from rollout_stream.config import INT32_MAX, check_count, check_rate
from rollout_stream.errors import described
from rollout_stream.kafka import KafkaFailure, TopicPartition, client_for
from rollout_stream.layout import Flow, output_console
from rollout_stream.ops.dlq.cursor import cursor_name, resume_state
from rollout_stream.ops.dlq.inspect import (
    compare_rewards,
    decode_value,
    fetch_record,
    members_of,
    nearby_values,
    value_of,
)
from rollout_stream.ops.dlq.record import DeadLetterRecord, readable_header
from rollout_stream.ops.dlq.render import (
    json_line,
    list_view,
    replay_document,
    replay_view,
    show_document,
    show_view,
    stats_view,
)
from rollout_stream.ops.dlq.replay import ReplayOptions, run_replay
from rollout_stream.ops.dlq.scan import DeadLetterScanner
from rollout_stream.ops.dlq.selection import Selection, parse_coordinates
from rollout_stream.ops.dlq.stats import DeadLetterStats
from rollout_stream.ops.dlq.values import DeadLetterValue, ValueGrouper
from rollout_stream.topics import require_topics

dlq_app = typer.Typer(
    cls=CommandGroup,
    help="Inspect the dead-letter topic (stats, list, show); replay refused records once the cause is fixed.",
    no_args_is_help=True,
)

_REASONS = ", ".join(r.value for r in DeadLetterReason)


@option_group
@dataclass(frozen=True)
class DeadLetterFilters:
    """Which dead-letter records a command looks at (stats, list, replay); unset: all of them."""

    reason: Annotated[
        list[str] | None,
        typer.Option("--reason", help=f"Only this reason (repeatable): {_REASONS}.", show_default=False),
    ] = None
    group: Annotated[
        list[str] | None,
        typer.Option(
            "--group",
            help="Only this group key, e.g. run-7/42 (repeatable; glob patterns like 'run-7/*' allowed).",
            show_default=False,
        ),
    ] = None
    since: Annotated[
        str | None,
        typer.Option(
            help="Only records dead-lettered at or after this time: ISO 8601 "
            "(2024-05-01T12:00:00Z; UTC when no zone) or a duration ago (15m, 2h, 7d).",
            show_default=False,
        ),
    ] = None
    until: Annotated[
        str | None,
        typer.Option(
            help="Only records dead-lettered at or before this time (same forms as --since).",
            show_default=False,
        ),
    ] = None


ALL_RECORDS = DeadLetterFilters()
Json = Annotated[
    bool, typer.Option("--json", help="Machine-readable output (JSON; `list` prints JSON lines).")
]
ShowProgress = Annotated[
    bool | None,
    typer.Option(
        "--progress/--no-progress",
        help="Progress bar on stderr (default: on a terminal, for scans of 10,000+ records).",
        show_default=False,
    ),
]


def _selection(filters: DeadLetterFilters, limit: int | None = None) -> Selection:
    """The records the filters select (SelectionError names the filter to correct: exit 2)."""
    return Selection.build(
        reasons=filters.reason or (),
        groups=filters.group or (),
        since=filters.since,
        until=filters.until,
        limit=limit,
        now_ms=int(time.time() * 1000),
    )


def _connect(bootstrap_servers: str | None, security: SecurityOptions) -> Connection:
    return connection_from_options(bootstrap_servers, security, client_id="rollout-stream-dlq",
                                   local=running_local_broker)


def _print(doc: dict[str, Any], json_out: bool, view: Callable[[dict[str, Any]], RenderableType]) -> None:
    """A command's result: one JSON line, or its rich view."""
    if json_out:
        print(json_line(doc))
    else:
        output_console().print(view(doc))


@contextmanager
def _scanner(conn: Connection, topic: str, progress: bool | None) -> Iterator[DeadLetterScanner]:
    """A scanner on a fresh read_committed consumer (TopicMissing, ScanStalled, RecordNotFound: exit 1)."""
    consumer = None
    try:
        with described(KafkaFailure, f"Kafka error on {conn.bootstrap_servers}"):
            consumer = client_for(conn).assigned_consumer(client_id=conn.client_id,
                                                          max_record_bytes=MAX_RECORD_BYTES)
            yield DeadLetterScanner(consumer, topic, progress=progress)
    finally:
        if consumer is not None:
            consumer.close()


def _values(records: Iterable[DeadLetterRecord], selection: Selection) -> Iterator[DeadLetterValue]:
    """The selected values of a scan: a chunked value is selected whole when any of its chunks is."""
    grouper = ValueGrouper()
    for record in records:
        yield from (v for v in grouper.add(record) if selection.matches_value(v))
    yield from (v for v in grouper.flush() if selection.matches_value(v))


@dlq_app.command("stats")
@grouped_options
def stats(
    bootstrap_servers: Bootstrap = None,
    dead_letter_topic: DeadLetterTopic = DEFAULT_TOPICS.dead_letter,
    filters: DeadLetterFilters = ALL_RECORDS,
    top: Annotated[int, typer.Option(min=0, help="How many of the groups with most records to show.")] = 10,
    json_out: Json = False,
    progress: ShowProgress = None,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Counts by reason, top groups, oldest and newest dead-letter, per-partition offset ranges."""
    selection = _selection(filters)
    conn = _connect(bootstrap_servers, security)
    with _scanner(conn, dead_letter_topic, progress) as scanner:
        plan = scanner.plan(since_ms=selection.since_ms)
        aggregate = DeadLetterStats(top_capacity=max(10_000, 100 * top))
        for value in _values(scanner.records(plan), selection):
            aggregate.add_value(value)
        doc = aggregate.to_dict(plan, scanned=scanner.scanned, top=top)
    _print(doc, json_out, stats_view)


@dlq_app.command("list")
@grouped_options
def list_(
    bootstrap_servers: Bootstrap = None,
    dead_letter_topic: DeadLetterTopic = DEFAULT_TOPICS.dead_letter,
    filters: DeadLetterFilters = ALL_RECORDS,
    limit: Annotated[
        int, typer.Option(min=0, help="At most this many records (0: all; --json streams them).")
    ] = 50,
    json_out: Json = False,
    progress: ShowProgress = None,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """One row per record, by partition then offset: coordinates, time, reason, group, rollout, message.

    The chunk records of a chunked value are one row, at its first chunk's coordinates."""
    selection = _selection(filters, limit)
    conn = _connect(bootstrap_servers, security)
    console = output_console()
    rows: list[dict[str, Any]] = []
    shown = 0
    with _scanner(conn, dead_letter_topic, progress) as scanner:
        plan = scanner.plan(since_ms=selection.since_ms)
        for value in _values(scanner.records(plan), selection):
            shown += 1
            if json_out:
                sys.stdout.write(json_line(value.summary()) + "\n")
            else:
                rows.append(value.summary())
                if len(rows) >= 1000:  # a table needs its rows up front: print a long listing in chunks
                    console.print(list_view(rows, console.width))
                    rows = []
            if selection.limit is not None and shown >= selection.limit:
                break
    if not json_out:
        if rows or not shown:
            console.print(list_view(rows, console.width))
        console.print(Flow(list_footer(shown, dead_letter_topic, selection), indent=4))


def list_footer(shown: int, topic: str, selection: Selection) -> str:
    """What `dlq list` showed. Stopped at --limit, it says these are the first records only: how many more
    there are is not known without reading them all (`dlq stats` does)."""
    if selection.limit is not None and shown >= selection.limit:
        return (f"the first {shown} record(s) of {topic}, {selection.describe()}: --limit {selection.limit} "
                "reached (--limit 0 lists them all, `rollout-stream dlq stats` counts them)")
    return f"{shown} record(s) of {topic}, {selection.describe()}"


@dlq_app.command("show")
@grouped_options
def show(
    coordinates: Annotated[
        str,
        typer.Argument(
            help="PARTITION:OFFSET of the record in the dead-letter topic (the first column of `dlq list`).",
            show_default=False,
        ),
    ],
    bootstrap_servers: Bootstrap = None,
    dead_letter_topic: DeadLetterTopic = DEFAULT_TOPICS.dead_letter,
    context: Annotated[
        int,
        typer.Option(
            min=0,
            help="Offsets searched on each side for the rest of the record's "
            "group (a group is dead-lettered in one go).",
        ),
    ] = 1000,
    reward_key: Annotated[
        str | None,
        typer.Option(
            envvar="ROLLOUT_STREAM_REWARD_KEY",
            help="Compare reward[KEY] when rewards are mappings (as the worker's --reward-key).",
            show_default=False,
        ),
    ] = None,
    json_out: Json = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """All headers, the decoded sample (or a hex preview), and the group's sibling rewards side by side."""
    check_count("--context", context, 0, INT32_MAX)  # offsets on each side: their sum stays an offset
    partition, offset = parse_coordinates(coordinates)
    conn = _connect(bootstrap_servers, security)
    with _scanner(conn, dead_letter_topic, False) as scanner:
        record = fetch_record(scanner, partition, offset)
        grouped = record.reason != DeadLetterReason.DECODE_ERROR and record.group is not None
        nearby = nearby_values(scanner, record, context) if grouped or record.chunk is not None else []
    value = value_of(record, nearby)
    record = value.first  # a chunk's coordinates show its whole value, named by its first chunk
    # Raw chunk bytes are not a sample: only a value whose chunks make it up is decoded.
    decoded = decode_value(value.value) if value.whole else None
    members = members_of(nearby, record) if grouped else []
    rewards = (
        compare_rewards(members, reward_key)
        if record.reason == DeadLetterReason.SHARED_REWARD_VIOLATION
        else None
    )
    _print(show_document(record, decoded, members, rewards, value), json_out, _show_view_readable)


def _show_view_readable(doc: dict[str, Any]) -> RenderableType:
    """show_view with header values for a person (epoch milliseconds also as a time); JSON keeps them raw."""
    return show_view({**doc, "headers": [[k, readable_header(k, v)] for k, v in doc["headers"]]})


@dlq_app.command("replay")
@grouped_options
def replay_(
    bootstrap_servers: Bootstrap = None,
    dead_letter_topic: DeadLetterTopic = DEFAULT_TOPICS.dead_letter,
    filters: DeadLetterFilters = ALL_RECORDS,
    limit: Annotated[
        int,
        typer.Option(
            min=0,
            help="At most this many records this run (0: all); the next identical run continues after them.",
        ),
    ] = 0,
    to: Annotated[
        str | None,
        typer.Option(
            help="Publish to this topic instead of each record's original topic.", show_default=False
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be replayed; write nothing.")
    ] = False,
    rate: Annotated[float, typer.Option(min=0.0, help="Records per second at most (0: unlimited).")] = 100.0,
    max_replays: Annotated[
        int,
        typer.Option(min=1, help="Refuse records already replayed this many times (their x-replay-count)."),
    ] = 3,
    rows: Annotated[
        int, typer.Option(min=0, help="Records listed in the table (the summary counts all).")
    ] = 50,
    json_out: Json = False,
    progress: ShowProgress = None,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Re-publish selected records (original key and value bytes, lineage headers) to their original topic.

    Idempotent: a cursor per selection (consumer group rollout-stream-replay-<hash>) and a ledger topic
    (<dead-letter topic>.replays) move in the same transaction as the records replayed, so no dead-letter
    record is published twice, by a second identical run or an overlapping selection. See docs/dlq.md.
    """
    check_rate("--rate", rate)
    selection = _selection(filters, limit or None)
    if to is not None and to == dead_letter_topic:
        fail("--to must not be the dead-letter topic itself")
    conn = _connect(bootstrap_servers, security)
    # before the ledger topic (<dead-letter topic>.replays) is created for it
    require_topics(conn, {dead_letter_topic: "--dead-letter-topic", **({to: "--to"} if to else {})})
    options = ReplayOptions(
        dead_letter_topic, selection, to=to, max_replays=max_replays, rate=rate, dry_run=dry_run
    )
    try:  # TopicMissing, ScanStalled, ReplayFailed: exit 1
        with described(KafkaFailure, f"Kafka error on {conn.bootstrap_servers}",
                       advice="the open transaction was aborted and the cursor did not move past unpublished "
                       "records"):
            report = run_replay(conn, options, progress=progress)
    except KeyboardInterrupt:
        _replay_interrupted(conn, options, json_out)
    _print(replay_document(report), json_out, lambda doc: replay_view(doc, rows))


def _replay_interrupted(conn: Connection, options: ReplayOptions, json_out: bool) -> NoReturn:
    """Ctrl-C during a replay: where its cursor stands (read back from the broker once the open transaction
    was aborted) and that the next identical run resumes there; exit 130."""
    cursor = cursor_name(options.selection, options.dead_letter_topic, options.to)
    doc: dict[str, Any] = {"interrupted": True, "dry_run": options.dry_run, "cursor": cursor}
    if options.dry_run:
        line = "dlq replay: interrupted; dry run: nothing was written"
    else:
        try:
            positions = _cursor_positions(conn, options.dead_letter_topic, cursor)
        except (KafkaFailure, KeyboardInterrupt) as exc:
            positions = None
            unread = f"could not be read back ({type(exc).__name__})"
        state = resume_state(positions or {})
        found = sorted((positions or {}).items())
        at = {p: om.offset for p, om in found if om is not None and om.offset >= 0}
        doc.update(positions=at, replay_id=state.replay_id if state else None)
        if positions is None:
            where = f"cursor {cursor} {unread}"
        elif at:
            stands = ", ".join(f"partition {p} offset {o}" for p, o in at.items())
            where = f"cursor {cursor} stands at {stands} (the records before it were replayed, once)"
        else:
            where = f"cursor {cursor} has not moved: nothing was replayed"
        run = f" under replay id {state.replay_id}" if state else ""
        line = (
            "dlq replay: interrupted; the open transaction was aborted (its records are not published); "
            f"{where}; the same command resumes from there{run}"
        )
    print(line, file=sys.stderr)
    if json_out:
        print(json_line(doc), flush=True)
    raise typer.Exit(130)


def _cursor_positions(conn: Connection, topic: str, cursor: str) -> dict[int, Any]:
    """The committed offsets (with metadata) of a replay cursor, by partition of the dead-letter topic."""
    consumer = client_for(conn).assigned_consumer(client_id=conn.client_id, max_record_bytes=MAX_RECORD_BYTES,
                                                  commit_group=cursor)
    try:
        return {
            p: consumer.committed(TopicPartition(topic, p))
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        }
    finally:
        consumer.close()


def register(app: typer.Typer) -> None:
    app.add_typer(dlq_app, name="dlq")
