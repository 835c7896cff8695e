"""Prompt-group windows: a pure state machine fed (record, sample, now) → outcomes (docs/spec.md §4.3, §4.4).

This module is the one place that decides a dead-letter reason.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout_stream.codec import DeadLetterReason, DecodeError, Sample, decode_sample, group_key_of
from rollout_stream.codec.chunks import ChunkHeaderError, chunk_header_of, decode_chunk_header
from rollout_stream.codec.head import RolloutFields, decode_head, ext_all_finite, item_count
from rollout_stream.codec.headers import REPLAY_ID as REPLAY_ID_HEADER
from rollout_stream.core.chunks import ChunkAssembler, ChunkKey, Copy, Refused
from rollout_stream.core.config import RewardConfig
from rollout_stream.core.digest import record_digest, record_digests
from rollout_stream.core.offsets import OffsetLedger
from rollout_stream.core.plain_scan import PlainScan, scanner
from rollout_stream.core.records import (
    DeadLettered,
    DuplicateDropped,
    InputRecord,
    Member,
    Outcome,
    Published,
)
from rollout_stream.core.rewards import SharedRewardViolation, normalize_group
from rollout_stream.core.structs import ClosedGroup, HeldSample, PlainHead
from rollout_stream.core.validate import SampleLimits, plainly_valid, validate_sample

__all__ = ["WindowConfig", "GroupWindow", "ClosedGroup", "HeldSample", "Rollout", "WindowStore", "WindowKey",
           "replay_id", "REPLAY_ID_HEADER", "DEFAULT_GROUP_TIMEOUT_MS", "DEFAULT_CLOSED_RETENTION_MS",
           "DEFAULT_MAX_CLOSED_GROUPS", "DEFAULT_MAX_GROUP_BYTES", "decode_error_message", "input_record"]

R = DeadLetterReason

WindowKey = tuple[int, str, str]
"""(input partition, group key, replay id): a replayed group is windowed apart from its original."""



def decode_error_message(value: bytes | None, error: DecodeError) -> str:
    """What a decode_error's message tells an operator: that the value was empty, or was not a rollout sample
    at all (a producer writing something else to the topic), before msgspec's own words; a sample with one
    bad field keeps msgspec's text, which names the field (`Expected `int`, got `str` - at `$.group_index``).
    """
    if value is not None and len(value) == 0:
        return "empty value (0 bytes)"
    if error.not_a_record:
        return f"not a MessagePack rollout sample: {error.message}"
    return error.message


def replay_id(record: InputRecord) -> str:
    if not record.headers:
        return ""
    for key, value in record.headers:
        if key == REPLAY_ID_HEADER:
            return value.decode("utf-8", "backslashreplace")
    return ""


# The window's defaults, defined once: the worker's settings (stream/config.py) and flags take them from here.
DEFAULT_GROUP_TIMEOUT_MS = 300_000  # a group open this long after its first member's timestamp is incomplete
# how long resolved groups are remembered (the worker: >= 2 x timeout)
DEFAULT_CLOSED_RETENTION_MS = 3_600_000
DEFAULT_MAX_CLOSED_GROUPS = 200_000
DEFAULT_MAX_GROUP_BYTES = 1 << 30  # a group holding more is dead-lettered as group_too_large


@dataclass(frozen=True, slots=True)
class WindowConfig:
    reward: RewardConfig = field(default_factory=RewardConfig)
    limits: SampleLimits = field(default_factory=SampleLimits)
    group_timeout_ms: int = DEFAULT_GROUP_TIMEOUT_MS
    closed_retention_ms: int = DEFAULT_CLOSED_RETENTION_MS
    max_closed_groups: int = DEFAULT_MAX_CLOSED_GROUPS
    max_group_bytes: int = DEFAULT_MAX_GROUP_BYTES


Rollout = Member | list[Member | None]
"""A rollout in a window: its one sample, or its `sibling_count` siblings by sibling index (None until
that sibling arrives). Most rollouts are one sample, and a list per sample would cost 64 bytes each."""


def _complete(rollout: Rollout) -> bool:
    return type(rollout) is Member or None not in rollout  # type: ignore[operator]


@dataclass(slots=True)
class GroupWindow:
    """An open prompt group: its rollouts in first-arrival order."""

    key: str
    partition: int
    group_size: int
    deadline_ms: int
    rollouts: dict[object, Rollout] = field(default_factory=dict)
    complete_rollouts: int = 0
    nbytes: int = 0

    def members(self) -> list[Member]:
        """Publication order: rollouts by first arrival, siblings by sibling_index."""
        out: list[Member] = []
        for rollout in self.rollouts.values():
            if type(rollout) is Member:
                out.append(rollout)
            else:
                out.extend(m for m in rollout if m is not None)  # type: ignore[union-attr]
        return out

    def records(self) -> list[InputRecord]:
        return [m.record for m in self.members()]

    def digests(self) -> tuple[bytes, ...]:
        """Computed when the group closes: while it is open, a copy is told by comparing bytes."""
        return distinct(record_digest(m.record.value) for m in self.members())


def record_bytes(record: InputRecord) -> int:
    """What a record adds to its window's size."""
    return len(record.value or b"") + len(record.key or b"")


def chunks_memory_key(ckey: ChunkKey) -> WindowKey:
    """Where the closed-group memory keeps a decided chunked value (apart from every group key: those are
    `run_id/index`, and no run id starts with a NUL)."""
    return (ckey[0], "\x00chunks/" + ckey[1].hex(), ckey[2])


def chunk_digest(record: InputRecord) -> bytes:
    """A chunk's identity: its bytes and its header (two chunks of one value may hold the same bytes)."""
    return record_digest((chunk_header_of(record.headers) or b"") + (record.value or b""))


def input_record(rec: Any) -> InputRecord:
    """A consumed record (the Kafka seam's `Record`) as the window store takes it."""
    headers = rec.headers
    return InputRecord(rec.topic, rec.partition, rec.offset, rec.timestamp, rec.key, rec.value,
                       tuple(headers) if headers else ())


def distinct(digests: Iterable[bytes]) -> tuple[bytes, ...]:
    """Each digest once, in first-seen order."""
    return tuple(dict.fromkeys(digests))


def _held(sample: RolloutFields | PlainHead) -> HeldSample:
    # index only matters without a rollout_id (docs/spec.md §2.4); not keeping it saves an int per sample
    index = sample.index if sample.rollout_id is None else None
    return HeldSample(sample.reward, sample.rollout_id, index, sample.sibling_index)


class WindowStore:
    """Open windows and closed-group memory for the partitions this worker owns."""

    def __init__(self, config: WindowConfig) -> None:
        self.config = config
        self.open: dict[WindowKey, GroupWindow] = {}
        self.closed: OrderedDict[WindowKey, ClosedGroup] = OrderedDict()
        self.open_bytes = 0
        # Closed-group memory changes since the last drain (None: forgotten) — the durable changelog's input.
        self.changes: dict[WindowKey, ClosedGroup | None] = {}
        # decode_head + plainly_valid in C where built (core/plain_scan.py); a reward key: the Python path
        self._scan: PlainScan | None = scanner() if config.reward.reward_key is None else None
        limits = config.limits
        self._limits = (limits.default_group_size, limits.max_group_size, limits.max_sibling_count)
        # Chunks of values larger than a record; their bytes count in `open_bytes` until the value is whole.
        self.chunks = ChunkAssembler(config.group_timeout_ms, config.max_group_bytes)

    # ---- queries -------------------------------------------------------------------------------

    def open_count(self) -> int:
        return len(self.open)

    # ---- transitions ---------------------------------------------------------------------------
    def take(self, record: InputRecord, now_ms: int) -> list[Outcome]:
        """`accept` of a consumed record, decoded here: as a head when it is plainly valid (the common case:
        no array is built), else whole, which says what is wrong with it."""
        value = record.value
        if value is None:
            return self.accept(record, DecodeError("record has no value (tombstone)"), now_ms)
        if record.headers:
            chunk_header = chunk_header_of(record.headers)
            if chunk_header is not None:
                return self._take_chunk(record, chunk_header, now_ms)
        scan = self._scan
        if scan is not None:
            default_size, max_size, max_siblings = self._limits
            plain = scan(value, record.key, default_size, max_size, max_siblings)
            if plain is not None:
                return self._place(record, plain, plain.group_key, now_ms)
        head = decode_head(value)
        if head is not None:
            cfg = self.config
            gkey = plainly_valid(head, record.key, cfg.reward.reward_key, cfg.limits, item_count,
                                 ext_all_finite)
            if gkey is not None:
                return self._place(record, head, gkey, now_ms)
        try:
            decoded: Sample | DecodeError = decode_sample(value)
        except DecodeError as exc:
            decoded = exc
        return self.accept(record, decoded, now_ms)

    def take_batch(self, records: Sequence[Any], start: int, now_ms: int,
                   ledger: OffsetLedger) -> tuple[int, list[Outcome]]:
        """`take` of consumed records (the Kafka seam's, of one partition) from `start` on, each held in
        `ledger` first, until one decides something: the index after it and its outcomes, or the end and
        none. Here and not in the worker's loop: most records only join their window, and the caller's loop
        runs once per decision, not once per record."""
        i, end = start, len(records)
        while i < end:
            record = input_record(records[i])
            i += 1
            ledger.hold(record.partition, record.offset)
            outcomes = self.take(record, now_ms)
            if outcomes:
                return i, outcomes
        return i, []

    def accept(self, record: InputRecord, decoded: Sample | DecodeError, now_ms: int) -> list[Outcome]:
        """Take one consumed record; return what became of it (and of any group it completed or broke)."""
        if isinstance(decoded, DecodeError):
            key = record.key.decode("utf-8", "backslashreplace") if record.key is not None else None
            return [DeadLettered(R.DECODE_ERROR, decode_error_message(record.value, decoded), key, (record,),
                                 now_ms)]
        sample = decoded
        cfg = self.config
        gkey: str | None = plainly_valid(sample, record.key, cfg.reward.reward_key, cfg.limits)
        if gkey is None:  # something to say, or valid in a less common way: the readable full check
            problem = validate_sample(sample, key=record.key, reward_key=cfg.reward.reward_key,
                                      limits=cfg.limits)
            gkey = group_key_of(sample.run_id, sample.group_index) if sample.group_index is not None else None
            if problem is not None:
                return self._reject_record(record, gkey, problem, now_ms)
        assert gkey is not None
        return self._place(record, sample, gkey, now_ms)

    def _place(
        self, record: InputRecord, sample: RolloutFields | PlainHead, gkey: str, now_ms: int
    ) -> list[Outcome]:
        """A valid sample into its group's window (or against the group's closed memory)."""
        cfg = self.config
        wkey = (record.partition, gkey, replay_id(record) if record.headers else "")
        closed = self.closed.get(wkey)
        if closed is not None:
            return [self._after_close(record, gkey, closed, now_ms)]

        window = self.open.get(wkey)
        if window is not None and record.timestamp_ms > window.deadline_ms:
            # Written after the group's deadline: the group was incomplete whatever the wall clock says.
            outcomes: list[Outcome] = [self._close_incomplete(wkey, window, now_ms)]
            outcomes.append(self._after_close(record, gkey, self.closed[wkey], now_ms))
            return outcomes
        group_size = sample.group_size if sample.group_size is not None else cfg.limits.default_group_size
        assert group_size is not None  # effective_group_size, inlined: validation refused None
        if window is None:
            window = GroupWindow(
                gkey, record.partition, group_size, record.timestamp_ms + cfg.group_timeout_ms
            )
            self.open[wkey] = window
        return self._add(wkey, window, record, sample, group_size, now_ms)

    def expire(self, now_ms: int, partitions: set[int]) -> list[Outcome]:
        """Dead-letter groups past their deadline in partitions whose backlog has been read."""
        due = [k for k, w in self.open.items() if k[0] in partitions and w.deadline_ms < now_ms]
        outcomes: list[Outcome] = [self._close_incomplete(k, self.open[k], now_ms) for k in due]
        if self.chunks.open:
            before = self.chunks.open_bytes
            for ckey, refused in self.chunks.expire(now_ms, partitions):
                outcomes.append(self._chunks_refused(ckey, refused, now_ms))
            self.open_bytes += self.chunks.open_bytes - before
        self._forget_old(now_ms)
        return outcomes

    def drain_changes(self) -> dict[WindowKey, ClosedGroup | None]:
        """Closed-group memory changes since the last call (written to the changelog with each commit)."""
        changes, self.changes = self.changes, {}
        return changes

    def discard_changes(self, partition: int) -> None:
        """Forget a partition's journaled changes (a restore re-created them; the changelog has them)."""
        for k in [k for k in self.changes if k[0] == partition]:
            del self.changes[k]

    def restore_closed(self, wkey: WindowKey, closed: ClosedGroup) -> None:
        """Reload closed-group memory from the changelog (no change is journaled)."""
        self.closed[wkey] = closed
        self.closed.move_to_end(wkey)

    def drop_partition(self, partition: int) -> None:
        """Forget a revoked partition's state; its uncommitted records are re-read by the new owner."""
        for k in [k for k in self.open if k[0] == partition]:
            self.open_bytes -= self.open.pop(k).nbytes
        before = self.chunks.open_bytes
        self.chunks.drop_partition(partition)
        self.open_bytes += self.chunks.open_bytes - before
        for k in [k for k in self.closed if k[0] == partition]:
            del self.closed[k]
        self.discard_changes(partition)

    # ---- internals -----------------------------------------------------------------------------
    def _take_chunk(self, record: InputRecord, raw_header: bytes, now_ms: int) -> list[Outcome]:
        """A chunk of a larger value: held until the value is whole, which is then taken as one record. What
        was decided of a value (whole, or refused) is remembered with the closed groups (and so in the
        changelog) under `chunks_memory_key`, so that a restore's re-read and late chunks meet the same
        decision."""
        key = record.key.decode("utf-8", "backslashreplace") if record.key is not None else None
        try:
            header = decode_chunk_header(raw_header)
        except ChunkHeaderError as exc:
            return [DeadLettered(R.DECODE_ERROR, str(exc), key, (record,), now_ms)]
        ckey: ChunkKey = (record.partition, header.digest, replay_id(record))
        closed = self.closed.get(chunks_memory_key(ckey))
        if closed is not None:
            return [self._chunk_after_close(record, key, closed, now_ms)]
        assembler = self.chunks
        outcomes: list[Outcome] = []
        before = assembler.open_bytes
        if assembler.deadline_passed(ckey, record.timestamp_ms):
            outcomes.append(self._chunks_refused(ckey, assembler.close_incomplete(ckey), now_ms))
            closed = self.closed[chunks_memory_key(ckey)]
            outcomes.append(self._chunk_after_close(record, key, closed, now_ms))
            self.open_bytes += assembler.open_bytes - before
            return outcomes
        added = assembler.add(ckey, record, header)
        self.open_bytes += assembler.open_bytes - before
        if added is None:
            return outcomes
        if type(added) is Copy:
            return [DuplicateDropped(key or "", record)]
        if type(added) is Refused:
            return [self._chunks_refused(ckey, added, now_ms)]
        assert not isinstance(added, Copy | Refused)
        # Remembered like a closed group (in the changelog): later copies of its chunks are dropped, and a
        # restore that re-reads only some of them knows the value was decided (core/structs.py first_offset).
        whole = added.record
        self._remember(chunks_memory_key(ckey), ClosedGroup(
            None, "", now_ms, now_ms, distinct(map(chunk_digest, added.parts)), first_offset=whole.offset))
        return self.take(whole, now_ms)

    def _chunks_refused(self, ckey: ChunkKey, refused: Refused, now_ms: int) -> Outcome:
        parts = refused.parts
        self._remember(chunks_memory_key(ckey), ClosedGroup(
            refused.reason, refused.message, now_ms, now_ms, distinct(map(chunk_digest, parts))))
        first = parts[0]
        key = first.key.decode("utf-8", "backslashreplace") if first.key is not None else None
        return DeadLettered(refused.reason, refused.message, key, parts, now_ms)

    def _chunk_after_close(self, record: InputRecord, key: str | None, closed: ClosedGroup,
                           now_ms: int) -> Outcome:
        if chunk_digest(record) in closed.digests:
            return DuplicateDropped(key or "", record)
        if closed.reason is None:  # one stray chunk: the value it claims to belong to stays as it was
            return DeadLettered(R.CHUNK_CONFLICT, f"a chunk of value {key or ''} differs from the chunk its "
                                "value was joined with", key, (record,), now_ms)
        return DeadLettered(closed.reason, f"value already dead-lettered: {closed.message}", key, (record,),
                            now_ms, straggler=True)

    def _add(
        self,
        wkey: WindowKey,
        window: GroupWindow,
        record: InputRecord,
        sample: RolloutFields | PlainHead,
        group_size: int,
        now_ms: int,
    ) -> list[Outcome]:
        rollout_id = sample.rollout_id
        rkey: int | str | tuple[str, int, int] | None = rollout_id if rollout_id is not None else sample.index
        if rkey is None:  # declared_rollout_key, inlined
            # A row without rollout_id or index is a rollout of its own: only its bytes can tell a copy.
            if any(m.record.value == record.value for m in window.members()):
                return [DuplicateDropped(window.key, record)]
            rkey = ("row", record.partition, record.offset)
        rollout = window.rollouts.get(rkey)
        if rollout is None:
            return self._add_rollout(wkey, window, record, sample, rkey, group_size, now_ms)
        return self._add_member(wkey, window, record, sample, rkey, rollout, group_size, now_ms)

    def _add_member(
        self, wkey: WindowKey, window: GroupWindow, record: InputRecord, sample: RolloutFields | PlainHead,
        rkey: int | str | tuple[str, int, int], rollout: Rollout | None, group_size: int, now_ms: int,
    ) -> list[Outcome]:
        """`_add` of any member, the whole rule (`_add_rollout` is its first-sample case, checked against it
        by tests/core/test_fast_paths.py)."""
        siblings: list[Member | None] | None = None
        if rollout is not None:
            siblings = [rollout] if type(rollout) is Member else rollout  # type: ignore[assignment]
        occupant = None
        if siblings is not None and sample.sibling_index < len(siblings):
            occupant = siblings[sample.sibling_index]
            if occupant is not None and occupant.record.value == record.value:
                return [DuplicateDropped(window.key, record)]
        if group_size != window.group_size:
            return self._reject_group(
                wkey, window, record, R.INVALID_SAMPLE,
                f"members disagree on group_size: {window.group_size} and {group_size}", now_ms,
            )
        if siblings is not None and len(siblings) != sample.sibling_count:
            return self._reject_group(
                wkey, window, record, R.INVALID_SAMPLE,
                f"siblings of rollout {rkey!r} disagree on sibling_count: {len(siblings)} and "
                f"{sample.sibling_count}",
                now_ms,
            )
        if occupant is not None:
            held = occupant.record
            return self._reject_group(
                wkey, window, record, R.CONFLICTING_DUPLICATE,
                f"rollout {rkey!r} sibling {sample.sibling_index} arrived twice with different content "
                f"(offsets {held.offset} and {record.offset})",
                now_ms,
            )
        size = record_bytes(record)
        if window.nbytes + size > self.config.max_group_bytes:
            return self._reject_group(
                wkey, window, record, R.GROUP_TOO_LARGE,
                f"group would hold {window.nbytes + size} bytes, more than the worker's cap of "
                f"{self.config.max_group_bytes} bytes for one group", now_ms,
            )
        if siblings is None:
            if len(window.rollouts) >= window.group_size:
                return self._reject_group(
                    wkey, window, record, R.INVALID_SAMPLE,
                    f"group has more rollouts than its group_size {window.group_size} "
                    f"(extra rollout {rkey!r})",
                    now_ms,
                )
        member = Member(record, _held(sample), rkey)
        if sample.sibling_count == 1:
            window.rollouts[rkey] = rollout = member
        else:
            if rollout is None:
                rollout = window.rollouts[rkey] = [None] * sample.sibling_count
            rollout[sample.sibling_index] = member  # type: ignore[index]
        window.nbytes += size
        self.open_bytes += size
        if _complete(rollout):
            window.complete_rollouts += 1
            if window.complete_rollouts == window.group_size:
                return [self._finish(wkey, window, now_ms)]
        return []

    def _add_rollout(
        self, wkey: WindowKey, window: GroupWindow, record: InputRecord, sample: RolloutFields | PlainHead,
        rkey: int | str | tuple[str, int, int], group_size: int, now_ms: int,
    ) -> list[Outcome]:
        """`_add` of a rollout's first sample (the common case): `_add`'s checks that can fail without
        siblings, in its order, with fewer loads."""
        if group_size != window.group_size:
            return self._reject_group(
                wkey, window, record, R.INVALID_SAMPLE,
                f"members disagree on group_size: {window.group_size} and {group_size}", now_ms,
            )
        size = record_bytes(record)
        if window.nbytes + size > self.config.max_group_bytes:
            return self._reject_group(
                wkey, window, record, R.GROUP_TOO_LARGE,
                f"group would hold {window.nbytes + size} bytes, more than the worker's cap of "
                f"{self.config.max_group_bytes} bytes for one group", now_ms,
            )
        rollouts = window.rollouts
        if len(rollouts) >= window.group_size:
            return self._reject_group(
                wkey, window, record, R.INVALID_SAMPLE,
                f"group has more rollouts than its group_size {window.group_size} (extra rollout {rkey!r})",
                now_ms,
            )
        member = Member(record, _held(sample), rkey)
        window.nbytes += size
        self.open_bytes += size
        count = sample.sibling_count
        if count != 1:
            siblings: list[Member | None] = [None] * count
            siblings[sample.sibling_index] = member
            rollouts[rkey] = siblings
            return []
        rollouts[rkey] = member
        window.complete_rollouts += 1
        if window.complete_rollouts == window.group_size:
            return [self._finish(wkey, window, now_ms)]
        return []

    def _finish(self, wkey: WindowKey, window: GroupWindow, now_ms: int) -> Outcome:
        members = window.members()
        result = normalize_group([m.sample for m in members], self.config.reward)
        digests = distinct(record_digests([m.record.value or b"" for m in members]))  # window.digests(), once
        if isinstance(result, SharedRewardViolation):
            records = tuple(m.record for m in members)
            self._close(wkey, window, R.SHARED_REWARD_VIOLATION, result.message, now_ms, digests=digests)
            return DeadLettered(R.SHARED_REWARD_VIOLATION, result.message, window.key, records, now_ms)
        self._close(wkey, window, None, "", now_ms, digests=digests)
        return Published(window.key, window.partition, tuple(members), result)

    def _reject_group(
        self, wkey: WindowKey, window: GroupWindow, record: InputRecord,
        reason: DeadLetterReason, message: str, now_ms: int,
    ) -> list[Outcome]:
        records = (*window.records(), record)
        self._close(wkey, window, reason, message, now_ms, extra_digest=record_digest(record.value))
        return [DeadLettered(reason, message, window.key, records, now_ms)]

    def _reject_record(
        self, record: InputRecord, gkey: str | None, problem: str, now_ms: int
    ) -> list[Outcome]:
        if gkey is None:
            key = record.key.decode("utf-8", "backslashreplace") if record.key is not None else None
            return [DeadLettered(R.INVALID_SAMPLE, problem, key, (record,), now_ms)]
        wkey = (record.partition, gkey, replay_id(record))
        window = self.open.get(wkey)
        if window is not None:
            return self._reject_group(wkey, window, record, R.INVALID_SAMPLE, problem, now_ms)
        closed = self.closed.get(wkey)
        if closed is not None:
            if closed.reason is not None and closed.reason is not R.INCOMPLETE_GROUP \
                    and record.timestamp_ms <= closed.deadline_ms:
                return [DeadLettered(closed.reason, f"group already dead-lettered: {closed.message}", gkey,
                                     (record,), now_ms, straggler=True)]
            return [DeadLettered(R.INVALID_SAMPLE, problem, gkey, (record,), now_ms)]
        # The group's first record is already invalid: reject the group so its later members carry this
        # reason.
        deadline = record.timestamp_ms + self.config.group_timeout_ms
        self._remember(wkey, ClosedGroup(
            R.INVALID_SAMPLE, problem, deadline, now_ms, (record_digest(record.value),)
        ))
        return [DeadLettered(R.INVALID_SAMPLE, problem, gkey, (record,), now_ms)]

    def _after_close(
        self, record: InputRecord, gkey: str, closed: ClosedGroup, now_ms: int
    ) -> Outcome:
        if closed.digest_of(record) in closed.digests:
            return DuplicateDropped(gkey, record)
        if closed.reason is None:
            return DeadLettered(R.LATE_MEMBER, f"group {gkey} was already published", gkey, (record,), now_ms)
        if closed.reason is R.INCOMPLETE_GROUP or record.timestamp_ms > closed.deadline_ms:
            return DeadLettered(
                R.LATE_MEMBER, f"group {gkey} was already dead-lettered as {closed.reason.value}", gkey,
                (record,), now_ms,
            )
        # One reason per rejected group: later members carry the group's reason until its deadline.
        return DeadLettered(closed.reason, f"group already dead-lettered: {closed.message}", gkey, (record,),
                            now_ms, straggler=True)

    def _close_incomplete(self, wkey: WindowKey, window: GroupWindow, now_ms: int) -> Outcome:
        records = tuple(window.records())
        rollouts = sum(1 for rollout in window.rollouts.values() if _complete(rollout))
        message = (
            f"group {window.key} timed out after {self.config.group_timeout_ms / 1000:g}s with "
            f"{rollouts} of {window.group_size} rollouts complete ({len(records)} samples received)"
        )
        self._close(wkey, window, R.INCOMPLETE_GROUP, message, now_ms)
        return DeadLettered(R.INCOMPLETE_GROUP, message, window.key, records, now_ms)

    def _close(
        self, wkey: WindowKey, window: GroupWindow, reason: DeadLetterReason | None, message: str,
        now_ms: int, extra_digest: bytes | None = None, digests: tuple[bytes, ...] | None = None,
    ) -> None:
        del self.open[wkey]
        self.open_bytes -= window.nbytes
        if digests is None:
            digests = window.digests()
        if extra_digest is not None:
            digests = distinct((*digests, extra_digest))
        self._remember(wkey, ClosedGroup(reason, message, window.deadline_ms, now_ms, digests))

    def _remember(self, wkey: WindowKey, closed: ClosedGroup) -> None:
        self.closed[wkey] = closed
        self.closed.move_to_end(wkey)
        self.changes[wkey] = closed
        while len(self.closed) > self.config.max_closed_groups:
            old, _ = self.closed.popitem(last=False)
            self.changes[old] = None

    def _forget_old(self, now_ms: int) -> None:
        horizon = now_ms - self.config.closed_retention_ms
        while self.closed:
            k, c = next(iter(self.closed.items()))
            if c.closed_at_ms >= horizon:
                break
            del self.closed[k]
            self.changes[k] = None
