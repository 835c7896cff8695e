"""`dlq replay`: re-publish dead-letter records in transactions that also move the cursor and the ledger."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stream.clients import MAX_RECORD_BYTES, Connection
from stream.errors import RuntimeFailure
from stream.kafka import Committed, Producer, SendFuture, TopicPartition, client_for
from stream.names import replay_transactional_id
from stream.tools.dlq.cursor import CursorState, cursor_name, new_replay_id, resume_state
from stream.tools.dlq.ledger import ReplayLedger, ensure_ledger_topic, load_ledger
from stream.tools.dlq.lineage import ReplayAction, decide
from stream.tools.dlq.scan import DeadLetterScanner, ScanPlan
from stream.tools.dlq.selection import Selection
from stream.tools.synth import RateLimiter

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
    scanner: DeadLetterScanner, plan: ScanPlan, state: CursorState
) -> dict[TopicPartition, Committed]:
    meta = state.encode()
    return {
        TopicPartition(plan.topic, r.partition): Committed(scanner.positions.get(r.partition, r.start), meta)
        for r in plan.ranges
    }


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
        limiter = RateLimiter(opts.rate)
        last_commit = time.monotonic()
        limit = opts.selection.limit
        for record in scanner.records(plan):
            if opts.selection.matches(record):
                action = decide(
                    record,
                    to=opts.to,
                    max_replays=opts.max_replays,
                    replay_id=replay_id,
                    replayed_by=ledger.replayed_by(record),
                )
                report.add(action, opts.listed)
                if txn is not None and action.topic is not None:
                    limiter.wait()
                    _send(txn, ledger, action, replay_id, cursor)
                if limit is not None and report.replayed + report.refused >= limit:
                    break
            # Move the cursor now and then even when nothing matches, so a long scan is not repeated.
            if txn is not None and (
                txn.due(opts) or time.monotonic() - last_commit >= 10 * opts.batch_seconds
            ):
                txn.commit(_offsets(scanner, plan, running))
                report.transactions += 1
                last_commit = time.monotonic()
        if txn is not None:
            txn.commit(_offsets(scanner, plan, CursorState(replay_id, "done", running.selection)))
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
