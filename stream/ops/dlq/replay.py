"""`dlq replay`: re-publish dead-letter records in transactions that also move the cursor and the ledger."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rollout_stream.clients import MAX_RECORD_BYTES, Connection
from rollout_stream.errors import RuntimeFailure
from rollout_stream.kafka import Committed, Producer, SendFuture, TopicPartition, client_for
from rollout_stream.names import replay_transactional_id
from rollout_stream.ops.dlq.cursor import CursorState, cursor_name, new_replay_id, resume_state
from rollout_stream.ops.dlq.ledger import ReplayLedger, ensure_ledger_topic, load_ledger
from rollout_stream.ops.dlq.lineage import ReplayAction, decide_value
from rollout_stream.ops.dlq.scan import DeadLetterScanner, PartitionRange, ScanPlan
from rollout_stream.ops.dlq.selection import Selection
from rollout_stream.ops.dlq.values import DEFAULT_WINDOW, DeadLetterValue, ValueGrouper, value_key
from rollout_stream.ops.synth import RateLimiter

__all__ = ["ReplayFailed", "ReplayOptions", "ReplayReport", "run_replay"]


class ReplayFailed(RuntimeFailure, RuntimeError):
    """A replayed record was not acknowledged; its transaction was aborted and the cursor did not move."""


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    dead_letter_topic: str
    selection: Selection
    to: str | None = None
    max_replays: int = 3
    rate: float = 100.0  # records per second; 0: unlimited
    dry_run: bool = False
    # A transaction closes after this many records or seconds, whichever comes first: progress stays
    # durable during long replays, and a rate-limited transaction never nears transaction_timeout_ms.
    batch_records: int = 200
    batch_seconds: float = 1.0
    listed: int = 10_000  # per-record actions kept for the report
    chunk_window: int = DEFAULT_WINDOW  # offsets around a chunk searched for the rest of its value


@dataclass
class ReplayReport:
    cursor: str
    replay_id: str
    resumed: bool
    dry_run: bool
    plan: ScanPlan | None = None
    scanned: int = 0
    matched: int = 0
    replayed: int = 0
    refused: int = 0
    already_replayed: int = 0  # matched, but the ledger says some replay published them already
    chunked_values: int = 0  # of those replayed, values sent as chunk records (counted once above)
    chunk_records: int = 0
    transactions: int = 0
    by_topic: Counter[str] = field(default_factory=Counter)
    actions: list[ReplayAction] = field(default_factory=list)
    actions_truncated: bool = False
    elapsed_s: float = 0.0

    def add(self, action: ReplayAction, keep: int) -> None:
        self.matched += 1
        if action.refused is not None:
            self.refused += 1
        elif action.skipped is not None:
            self.already_replayed += 1
        else:
            self.replayed += 1
            self.by_topic[action.topic or ""] += 1
            if action.chunks:
                self.chunked_values += 1
                self.chunk_records += action.chunks
        if len(self.actions) < keep:
            self.actions.append(action)
        else:
            self.actions_truncated = True


@dataclass
class _Transaction:
    """The producer's open transaction: what it sent, when it began."""

    producer: Producer
    group_metadata: object  # the cursor's consumer group, whose offsets commit with the records
    open: bool = False
    began: float = 0.0
    futures: list[tuple[SendFuture, ReplayAction]] = field(default_factory=list)
    records: int = 0  # replayed records in the open transaction (each also has a ledger entry)

    def begin(self) -> None:
        if not self.open:
            self.producer.begin_transaction()
            self.open, self.began, self.futures, self.records = True, time.monotonic(), [], 0

    def due(self, opts: ReplayOptions) -> bool:
        return self.open and (
            self.records >= opts.batch_records or time.monotonic() - self.began >= opts.batch_seconds
        )

    def commit(self, offsets: dict[TopicPartition, Committed]) -> None:
        """Flush, check every record was acknowledged, then commit records and cursor together."""
        self.begin()
        self.producer.flush()
        for future, action in self.futures:
            if (error := future.exception()) is not None:
                raise ReplayFailed(
                    f"replay of {action.record.topic}:{action.record.coordinates} to {action.topic} failed: "
                    f"{error}"
                )
        self.producer.send_offsets_to_transaction(offsets, self.group_metadata)
        self.producer.commit_transaction()
        self.open = False

    def abort(self) -> None:
        if self.open:
            self.open = False
            self.producer.abort_transaction()


def _send(txn: _Transaction, ledger: ReplayLedger, action: ReplayAction, replay_id: str, cursor: str) -> None:
    """The replayed record and its ledger entry, in the open transaction."""
    assert action.topic is not None
    record = action.record
    txn.begin()
    future = txn.producer.send(action.topic, record.value, record.key, headers=list(action.headers))
    txn.futures.append((future, action))
    txn.records += 1
    key, value = ledger.entry(record, replay_id, action.topic, cursor)
    txn.futures.append((txn.producer.send(ledger.topic, value, key), action))
    ledger.add(record.partition, record.offset, replay_id)


def _offsets(
    scanner: DeadLetterScanner, plan: ScanPlan, state: CursorState, floors: dict[int, int]
) -> dict[TopicPartition, Committed]:
    """The cursor: where each partition's scan got, but never past a value not replayed yet (`floors`), so
    a value's chunks are all read again by the run that resumes."""
    meta = state.encode()
    return {
        TopicPartition(plan.topic, r.partition): Committed(
            min(scanner.positions.get(r.partition, r.start), floors.get(r.partition, r.end)), meta
        )
        for r in plan.ranges
    }


@dataclass
class _Values:
    """The values of a replay scan not yet decided: held by the grouper, left over past --limit, or waiting
    for the look-back that finds chunks written before where the scan started."""

    grouper: ValueGrouper
    left: list[DeadLetterValue] = field(default_factory=list)
    deferred: list[DeadLetterValue] = field(default_factory=list)

    def floors(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for v in (*self.left, *self.deferred):
            out[v.first.partition] = min(out.get(v.first.partition, v.first.offset), v.first.offset)
        held = self.grouper.floor()
        if held is not None and self.grouper.partition is not None:
            p = self.grouper.partition
            out[p] = min(out.get(p, held), held)
        return out


def _starts_before(value: DeadLetterValue, r: PartitionRange, window: int) -> bool:
    """An incomplete value near where the scan started: its missing chunks may lie before."""
    return bool(value.missing()) and r.start > r.low and value.first.offset - r.start < window


def _look_back(scanner: DeadLetterScanner, value: DeadLetterValue, r: PartitionRange, window: int) -> None:
    """Add the value's chunk records from the `window` offsets before its first one (the scanner's
    positions and count are left as the main scan left them)."""
    positions, scanned = dict(scanner.positions), scanner.scanned
    first = value.first.offset
    key = value_key(value.first)
    plan = ScanPlan(scanner.topic, (PartitionRange(r.partition, r.low, max(r.low, first - window), first),))
    for record in scanner.records(plan):
        if value_key(record) == key:
            value.add(record)
    scanner.positions, scanner.scanned = positions, scanned


@dataclass
class _Step:
    """Decides and sends one value after another; `done` once --limit is reached."""

    opts: ReplayOptions
    report: ReplayReport
    ledger: ReplayLedger
    txn: _Transaction | None
    limiter: RateLimiter
    replay_id: str
    cursor: str
    done: bool = False

    def all(self, batch: list[DeadLetterValue], values: _Values, plan: ScanPlan | None) -> None:
        """`plan` None: the look-back is done, nothing is deferred again."""
        for value in batch:
            if self.done:
                values.left.append(value)
            elif self.opts.selection.matches_value(value):
                r = plan.range_of(value.first.partition) if plan is not None else None
                if r is not None and _starts_before(value, r, self.opts.chunk_window):
                    values.deferred.append(value)
                else:
                    self.one(value)

    def one(self, value: DeadLetterValue) -> None:
        opts = self.opts
        replayed_by = next(filter(None, map(self.ledger.replayed_by, value.records)), None)
        actions = decide_value(value, to=opts.to, max_replays=opts.max_replays, replay_id=self.replay_id,
                               replayed_by=replayed_by)
        self.report.add(actions[0], opts.listed)
        if self.txn is not None and actions[0].topic is not None:
            for action in actions:  # in one transaction: the due check runs between values only
                self.limiter.wait()
                _send(self.txn, self.ledger, action, self.replay_id, self.cursor)
        limit = opts.selection.limit
        self.done = limit is not None and self.report.replayed + self.report.refused >= limit


def run_replay(
    conn: Connection, opts: ReplayOptions, *, progress: bool | None = None, console: Any = None
) -> ReplayReport:
    """Replay the selected records that this selection's cursor has not passed yet; see docs/dlq.md."""
    started = time.monotonic()
    cursor = cursor_name(opts.selection, opts.dead_letter_topic, opts.to)
    client = client_for(conn)
    consumer = client.assigned_consumer(client_id=conn.client_id, max_record_bytes=MAX_RECORD_BYTES,
                                        commit_group=cursor)
    producer = None
    txn: _Transaction | None = None
    try:
        if not opts.dry_run:
            ensure_ledger_topic(conn, opts.dead_letter_topic)
            # Fences any other replay of this dead-letter topic still alive and aborts its open transaction,
            # so the committed offsets and the ledger read below are final.
            producer = client.producer(client_id=conn.client_id, max_record_bytes=MAX_RECORD_BYTES,
                                       transactional_id=replay_transactional_id(opts.dead_letter_topic))
            producer.init_transactions()
            txn = _Transaction(producer, consumer.group_metadata())
        ledger = load_ledger(consumer, opts.dead_letter_topic)
        kwargs: dict[str, Any] = {"progress": progress}
        if console is not None:
            kwargs["console"] = console
        scanner = DeadLetterScanner(consumer, opts.dead_letter_topic, **kwargs)
        parts = scanner.partitions()
        committed = {
            p: consumer.committed(TopicPartition(opts.dead_letter_topic, p)) for p in parts
        }
        previous = resume_state(committed)
        replay_id = previous.replay_id if previous is not None else new_replay_id()
        report = ReplayReport(cursor, replay_id, previous is not None, opts.dry_run)
        running = CursorState(replay_id, "running", opts.selection.describe())
        starts = {p: om.offset for p, om in committed.items() if om is not None and om.offset >= 0}
        plan = report.plan = scanner.plan(partitions=parts, starts=starts, since_ms=opts.selection.since_ms)
        step = _Step(opts, report, ledger, txn, RateLimiter(opts.rate), replay_id, cursor)
        values = _Values(ValueGrouper(opts.chunk_window))
        last_commit = time.monotonic()
        for record in scanner.records(plan):
            step.all(values.grouper.add(record), values, plan)
            if step.done:
                break
            # Move the cursor now and then even when nothing matches, so a long scan is not repeated.
            if txn is not None and (
                txn.due(opts) or time.monotonic() - last_commit >= 10 * opts.batch_seconds
            ):
                txn.commit(_offsets(scanner, plan, running, values.floors()))
                report.transactions += 1
                last_commit = time.monotonic()
        step.all(values.grouper.flush(), values, plan)
        if not step.done:
            for value in values.deferred:
                _look_back(scanner, value, plan.range_of(value.first.partition), opts.chunk_window)
            deferred, values.deferred = values.deferred, []
            step.all(deferred, values, None)
        if txn is not None:
            state = CursorState(replay_id, "done", running.selection)
            txn.commit(_offsets(scanner, plan, state, values.floors()))
            report.transactions += 1
        report.scanned = scanner.scanned
        report.elapsed_s = time.monotonic() - started
        return report
    except BaseException as exc:
        if txn is not None:
            try:
                txn.abort()
            except Exception as abort_exc:  # the first error is the one to report; the next run fences anyway
                exc.add_note(
                    f"aborting the replay transaction failed too: {type(abort_exc).__name__}: {abort_exc}"
                )
        raise
    finally:
        consumer.close()
        if producer is not None:
            producer.close(timeout=10)
