"""A rank's own rows, fetched by offset (`fetch="own"`): `PayloadFetcher`, on a thread of its own.

Once a batch is planned from outline groups (rollout_stream.reader.heads), the rank fetches the train records
of its rows only: each head says at which offsets of its partition a sample's record (or its chunk records)
is, and each fetched sample is checked against its outline's lineage. The rows of other ranks are never
fetched: each record is read by offset, nothing after it fetched (rollout_stream.reader.by_offset).

The fetching runs on the fetcher's thread, one request at a time, so the rows of the next batch can be
fetched while the trainer trains this one (`ahead`): one batch ahead at most, what that guess got wrong
fetched when the batch is asked for (`samples`).

When every record of a batch is small (under SMALL_RECORD_BYTES, none chunked), its rows are read forward
instead: one consumer reads its partitions on from where each stopped, other ranks' records included, with
the usual fetch sizes, the partitions in the same requests. A request per record costs a round trip, which
for small records takes longer than their bytes; a rank then receives the partitions' records from its first
row on, as `fetch="all"` does, once. While no batch is asked for, it reads on ahead, as `fetch="all"` does, up
to _AHEAD_BYTES in all, and the trainer's thread takes the rows it finds read ahead itself, under a lock: a
request to the fetcher's thread and the wait for its answer cost two thread wake-ups a batch, which on a
machine busier than its cores (ranks beside their broker) took longer than the batch's rows.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout_stream.codec import DecodeError, TrainSample, decode_train_sample
from rollout_stream.codec.chunks import ChunkHeaderError, chunk_header_of, decode_chunk_header
from rollout_stream.codec.group_heads import GroupHead
from rollout_stream.core.assembly import AssembledGroup, Lineage, lineage
from rollout_stream.core.chunks import Added, ChunkAssembler, Refused, Whole
from rollout_stream.core.structs import InputRecord
from rollout_stream.kafka import AssignedConsumer, Client, Polled, TopicPartition
from rollout_stream.reader.by_offset import ByOffsetReader, Value
from rollout_stream.reader.errors import PayloadError
from rollout_stream.reader.fetch_sizes import READER_FETCH_BYTES

__all__ = ["PAYLOAD_TIMEOUT_S", "SMALL_RECORD_BYTES", "PayloadFetcher", "small_records"]

# How long a rank waits for a record its head points at: the head is committed with (exactly-once) or after
# (at-least-once) the records, so they are readable; only a broker away keeps them.
PAYLOAD_TIMEOUT_S = 120.0

# Below this average record size a rank reads its partitions forward rather than record by record.
SMALL_RECORD_BYTES = 64 << 10
# Read forward at most this many records past the last one read to reach the next one wanted; further, seek.
_FORWARD_GAP = 4096
# Between requests the partitions are read on ahead until they hold this much in all.
_AHEAD_BYTES = 32 << 20
# A partition read forward whose wanted rows are all read stops fetching once it holds this much read past
# them (until a request wants it): what a rank keeps stays bounded, at this much a partition and a fetch,
# when one partition runs far ahead of the others. No less than _AHEAD_BYTES: a pause drops what librdkafka
# fetched, which it fetches again.
_KEPT_BYTES = _AHEAD_BYTES
_Wanted = dict[int, set[int]]  # partition -> offsets
_Groups = Sequence[tuple[AssembledGroup, GroupHead]]


def _forward_tuning(client: str) -> dict[str, Any]:
    """The consumer reading forward: on librdkafka 1 MiB a partition a fetch and at most 8 MiB queued; on
    kafka-python the whole-topic reader's fetch (its parsing costs per fetch: at 32 KB records, 4 ranks
    on 2 vCPUs, 1 MiB fetches gave 0.80-0.93 times `fetch="all"`'s batches a second, 16 MiB 0.91-0.97),
    after the first 8 MiB fetched 1 MiB at a time (a 16 MiB fetch is parsed whole before its first record
    comes: the first batch came 0.3-0.9 s later)."""
    if client == "confluent":
        return {"max_partition_fetch_bytes": 1 << 20, "queued.max.messages.kbytes": 8 << 10}
    if client == "kafka-python":
        return {"max_partition_fetch_bytes": READER_FETCH_BYTES, "start_fetch": (1 << 20, 8 << 20)}
    return {}


@dataclass
class _Request:
    """Offsets for the fetcher's thread to read: `got` and `error` once `done` is set; `cancelled`: stop."""

    wanted: _Wanted
    timeout_s: float
    forward: bool = False  # small records: read each partition forward (`PayloadFetcher._read_forward`)
    record_bytes: int = 0  # the largest record (or chunk record) of the batch, as its heads say
    got: dict[tuple[int, int], Value] = field(default_factory=dict)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: bool = False


@dataclass
class _Forward:
    """A partition read forward: the next offset the consumer returns of it, and the records it returned past
    the last one a request wanted, by offset (`kept_bytes` their values' bytes)."""

    position: int
    # in the order read, dropped from the front: a dict's front after many pops is a run of deleted slots that
    # every look at its first key walks (27 µs a drop at 11,000 kept records)
    kept: OrderedDict[int, Value] = field(default_factory=OrderedDict)
    kept_bytes: int = 0

    def reaches(self, offset: int) -> bool:
        """Whether `offset` is kept or ahead within _FORWARD_GAP records (else the consumer seeks)."""
        first = next(iter(self.kept), self.position)  # kept in the order read: ascending
        return first <= offset <= self.position + _FORWARD_GAP

    def keep(self, offset: int, value: Value) -> None:
        self.kept[offset] = value
        self.kept_bytes += len(value[0])

    def drop_through(self, offset: int) -> None:
        """Forget what is kept up to `offset`."""
        while self.kept and next(iter(self.kept)) <= offset:
            self.kept_bytes -= len(self.kept.popitem(last=False)[1][0])


def small_records(groups: _Groups) -> bool:
    """Whether every record of a batch's groups is small and whole (their heads say their sizes): its rows are
    read forward, a rank receives the others' records too."""
    samples = [s for _, head in groups for s in head.samples]
    return bool(samples) and all(len(s.offsets) == 1 and s.nbytes < SMALL_RECORD_BYTES for s in samples)


_AHEAD = _Request({}, 0.0, forward=True)  # reading ahead: every record is kept
_NUDGE = _Request({}, 0.0)  # rows were taken from what was read ahead: read on, if the bound stopped it


class PayloadFetcher:
    """A rank's rows of a batch: its train records read by offset (`ByOffsetReader`), or forward when small,
    joined and checked against their heads.

    `client`: the seam's client the consumers are made with; `client_id`: their id prefix; `topic`: the
    train-data topic; `max_record_bytes`: the largest record it accepts. `fetched_bytes` counts the record
    bytes received, wanted or not. The consumers are used by the fetcher's thread only.
    """

    def __init__(self, client: Client, client_id: str, topic: str, max_record_bytes: int) -> None:
        self.topic = topic
        self.client, self.client_id, self.max_record_bytes = client, client_id, max_record_bytes
        self._by_offset = ByOffsetReader(client, client_id, topic, max_record_bytes)
        self._forward_bytes = 0
        self._forward_consumer: AssignedConsumer | None = None  # reads small records forward
        self._forward: dict[int, _Forward] = {}  # partition -> where it is read forward
        self._forward_paused: set[int] = set()
        # The forward state is shared: the fetcher's thread reads into it, the trainer's takes rows from it.
        self._forward_lock = threading.Lock()
        self._ahead_stopped = False  # reading ahead stopped at its bound: the thread waits
        self._requests: queue.Queue[_Request | None] = queue.Queue()
        self._ahead: _Request | None = None
        self._thread = threading.Thread(target=self._serve, name=f"{client_id}-payloads", daemon=True)
        self._thread.start()

    def ahead(self, rows: Sequence[TrainSample], groups: _Groups) -> None:
        """Start fetching the records behind `rows` (of `groups`), the rows this rank will likely ask for
        next, unless a fetch ahead is still under way. Small records need none: they are read on ahead."""
        if small_records(groups) or (self._ahead is not None and not self._ahead.done.is_set()):
            return
        places = self._places(rows, groups)
        self._ahead = self._submit(self._wanted(places), PAYLOAD_TIMEOUT_S, groups, forward=False)

    def samples(self, rows: Sequence[TrainSample], groups: _Groups,
                timeout_s: float = PAYLOAD_TIMEOUT_S) -> list[TrainSample]:
        """The train samples behind the outline samples `rows` (rows of `groups`, each with its head), in
        order, each checked against its outline's lineage."""
        places = self._places(rows, groups)
        wanted = self._wanted(places)
        values = self._from_ahead(wanted)
        if small := small_records(groups):
            values.update(self._take_read_ahead(wanted))
        missing = {p: {o for o in offsets if (p, o) not in values} for p, offsets in wanted.items()}
        missing = {p: offsets for p, offsets in missing.items() if offsets}
        if missing:
            request = self._submit(missing, timeout_s, groups, forward=small)
            request.done.wait()
            if request.error is not None:
                raise request.error
            values.update(request.got)
        out = []
        for o, (partition, offsets) in zip(rows, places, strict=True):
            sample = self._whole(partition, offsets, values)
            if (sample.group_key, lineage(sample)) != (o.group_key, lineage(o)):
                raise PayloadError(
                    f"{self.topic} partition {partition} offsets {offsets} hold sample {sample.group_key} "
                    f"{sample.source_topic}:{sample.source_partition}@{sample.source_offset}, its head says "
                    f"{o.group_key} {o.source_topic}:{o.source_partition}@{o.source_offset}")
            out.append(sample)
        return out

    @staticmethod
    def _places(rows: Sequence[TrainSample], groups: _Groups) -> list[tuple[int, list[int]]]:
        """Where each row's record (or chunk records) is: (partition, offsets)."""
        where: dict[tuple[str, Lineage], tuple[int, list[int]]] = {}  # outline -> (partition, offsets)
        for group, head in groups:
            for outline, s in zip(group.samples, head.samples, strict=True):
                where[(outline.group_key, lineage(outline))] = (head.partition, s.offsets)
        return [where[(o.group_key, lineage(o))] for o in rows]

    @staticmethod
    def _wanted(places: Sequence[tuple[int, list[int]]]) -> _Wanted:
        wanted: _Wanted = {}
        for partition, offsets in places:
            wanted.setdefault(partition, set()).update(offsets)
        return wanted

    def _from_ahead(self, wanted: _Wanted) -> dict[tuple[int, int], Value]:
        """What the fetch ahead got of `wanted` (waited for if it got some); the rest of it is dropped."""
        request, self._ahead = self._ahead, None
        if request is None:
            return {}
        if not any(wanted.get(p, set()) & offsets for p, offsets in request.wanted.items()):
            request.cancelled = True  # a wrong guess: stop it, and wait for it to stop
        request.done.wait()
        if request.error is not None:  # asked again below: a real failure is raised then
            return {}
        return {key: value for key, value in request.got.items() if key[1] in wanted.get(key[0], ())}

    def _take_read_ahead(self, wanted: _Wanted) -> dict[tuple[int, int], Value]:
        """The rows of `wanted` that reading ahead holds, taken (a partition's only if it holds them all); the
        fetcher's thread reads on if the bound had stopped it."""
        got: dict[tuple[int, int], Value] = {}
        with self._forward_lock:
            for partition, offsets in wanted.items():
                state = self._forward.get(partition)
                if state is not None and all(o in state.kept for o in offsets):
                    self._take_kept(partition, offsets, got)
            nudge, self._ahead_stopped = self._ahead_stopped and bool(got), self._ahead_stopped and not got
        if nudge:
            self._requests.put(_NUDGE)
        return got

    def _submit(self, wanted: _Wanted, timeout_s: float, groups: _Groups, *, forward: bool) -> _Request:
        if not self._thread.is_alive():
            raise PayloadError(f"{self.topic}: the payload fetcher is closed")
        sizes = [s.nbytes // len(s.offsets) for _, head in groups for s in head.samples if s.offsets]
        request = _Request(wanted, timeout_s, forward, max(sizes, default=0))
        self._requests.put(request)
        return request

    def _serve(self) -> None:
        try:
            while (request := self._next_request()) is not None:
                if request is _NUDGE:
                    continue
                try:
                    self._fetch(request)
                except BaseException as exc:  # raised in the trainer's thread by samples()
                    request.error = exc
                finally:
                    request.done.set()
        finally:
            self._by_offset.close()
            self._reset_forward()
            while True:  # a request left behind is answered, never waited on forever
                try:
                    left = self._requests.get_nowait()
                except queue.Empty:
                    break
                if left is not None:
                    left.error = PayloadError(f"{self.topic}: the payload fetcher stopped")
                    left.done.set()

    def _next_request(self) -> _Request | None:
        """The next request; while none is asked, small records are read on ahead (as `fetch="all"` reads),
        _AHEAD_BYTES in all. The client stops fetching when it is not polled (a pause would drop what it
        fetched: librdkafka then fetched 7 to 45 times the topic)."""
        wait = 0.0  # none while records come; at the partitions' ends, a short wait between polls
        while (consumer := self._reading_ahead()) is not None:
            try:
                return self._requests.get(timeout=wait) if wait else self._requests.get_nowait()
            except queue.Empty:
                pass
            try:
                wait = 0.0 if self._forward_poll(consumer, _AHEAD, {}, wait_s=0.0) else 0.02
            except Exception:  # nobody asked for these records: the next request reads afresh, and fails
                self._reset_forward()  # there if the failure lasts
        return self._requests.get()

    def _reading_ahead(self) -> AssignedConsumer | None:
        """The forward consumer, if it is to read on ahead: small records are read forward, some partition
        fetches, and what is kept is under _AHEAD_BYTES (else `_ahead_stopped`, until rows are taken).
        A paused partition whose rows were taken down to half of _KEPT_BYTES fetches again."""
        with self._forward_lock:
            if self._forward_consumer is None:
                return None
            if low := [p for p in self._forward_paused if self._forward[p].kept_bytes <= _KEPT_BYTES // 2]:
                self._forward_consumer.resume([self._tp(p) for p in low])
                self._forward_paused.difference_update(low)
            on = len(self._forward_paused) < len(self._forward) and \
                sum(state.kept_bytes for state in self._forward.values()) < _AHEAD_BYTES
            self._ahead_stopped = not on
            return self._forward_consumer if on else None

    def _reset_forward(self) -> None:
        """Forget the forward reading, its consumer closed: the next request starts it afresh."""
        with self._forward_lock:
            consumer, self._forward_consumer = self._forward_consumer, None
            self._forward.clear()
            self._forward_paused.clear()
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # closing a failed consumer: nothing more to learn from it
                pass

    def _whole(self, partition: int, offsets: list[int], values: dict[tuple[int, int], Value]
               ) -> TrainSample:
        parts = [values[(partition, o)] for o in offsets]
        value = parts[0][0] if len(parts) == 1 and parts[0][1] is None else self._joined(
            partition, offsets, parts)
        try:
            return decode_train_sample(value)
        except DecodeError as exc:
            raise PayloadError(
                f"{self.topic} partition {partition} offsets {offsets}: {exc.message}") from exc

    def _joined(self, partition: int, offsets: list[int], parts: list[Value]) -> bytes:
        """One value from its chunk records, joined and checked (digest, size) by the core's assembler."""
        where = f"{self.topic} partition {partition} offsets {offsets}"
        assembler = ChunkAssembler(timeout_ms=0, max_value_bytes=sys.maxsize)
        added: list[Added] = []
        for offset, (value, raw) in zip(offsets, parts, strict=True):
            if raw is None:
                raise PayloadError(f"{where}: not one value's chunks (offset {offset} is not a chunk)")
            try:
                header = decode_chunk_header(raw)
            except ChunkHeaderError as exc:
                raise PayloadError(f"{where}: {exc}") from exc
            record = InputRecord(self.topic, partition, offset, 0, None, value)
            added.append(assembler.add((partition, header.digest, ""), record, header))
        last = added[-1]
        if isinstance(last, Refused):
            raise PayloadError(f"{where}: {last.message}")
        if not isinstance(last, Whole) or any(a is not None for a in added[:-1]) or assembler.open:
            raise PayloadError(f"{where}: not one value's chunks")
        assert last.record.value is not None
        return last.record.value

    @property
    def fetched_bytes(self) -> int:
        """The record bytes received, wanted or not."""
        return self._by_offset.fetched_bytes + self._forward_bytes

    def _fetch(self, request: _Request) -> None:
        if not request.forward:
            deadline = time.monotonic() + request.timeout_s
            self._by_offset.read(request.wanted, request.got, lambda partition, pending: self._going_on(
                request, partition, pending, deadline), request.record_bytes)
            return
        self._read_forward(request)

    def _going_on(self, request: _Request, partition: int, pending: list[int], deadline: float) -> bool:
        """Whether to poll again for `pending`: False once `request` is cancelled; PayloadError past
        `deadline`."""
        if request.cancelled:
            return False
        if time.monotonic() > deadline:
            raise PayloadError(f"{self.topic} partition {partition}: offsets {pending[:5]}… not read within "
                               f"{request.timeout_s:g}s")
        return True

    def _read_forward(self, request: _Request) -> None:
        """The records `request` wants, each partition read on from where it stopped (or from the first
        wanted, when that is behind it or far ahead), all in one consumer's fetches: every record on the way
        is received once; those after the last one wanted are kept for the next request. Returns early once
        cancelled."""
        deadline = time.monotonic() + request.timeout_s
        try:
            with self._forward_lock:
                consumer = self._place_forward(request.wanted)
                pending = {p: self._take_kept(p, offsets, request.got)
                           for p, offsets in sorted(request.wanted.items())}
        except BaseException:  # its state would say placed what the consumer is not
            self._reset_forward()
            raise
        while any(pending.values()):
            for partition, rest in pending.items():
                if rest and not self._going_on(request, partition, rest, deadline):
                    return
            self._forward_poll(consumer, request, pending)

    def _place_forward(self, wanted: _Wanted) -> AssignedConsumer:
        """The forward consumer, every wanted partition fetching from where it was read to, or from its first
        wanted offset when that is not within reach; what was paused fetches again."""
        consumer = self._forward_consumer
        if consumer is None:
            consumer = self._forward_consumer = self.client.assigned_consumer(
                client_id=f"{self.client_id}-forward", max_record_bytes=self.max_record_bytes,
                **_forward_tuning(self.client.name))
        new = [p for p in wanted if p not in self._forward]
        moved = []
        for partition, offsets in wanted.items():
            state = self._forward.get(partition)
            if state is None or not state.reaches(min(offsets)):
                self._forward[partition] = _Forward(min(offsets))
                moved.append(partition)
        # Paused partitions this request does not want stay paused: each request would add a fetch to what
        # they keep.
        wake = self._forward_paused & wanted.keys()
        if new:  # each partition at its place, all fetching
            consumer.assign_from({self._tp(p): state.position for p, state in self._forward.items()})
            if rest := self._forward_paused - wake:
                consumer.pause([self._tp(p) for p in rest])
        elif wake:
            consumer.resume([self._tp(p) for p in wake])
        self._forward_paused -= wake
        if new:
            return consumer
        for partition in moved:
            consumer.seek(self._tp(partition), self._forward[partition].position)
        return consumer

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)

    def _take_kept(self, partition: int, offsets: set[int], got: dict[tuple[int, int], Value]) -> list[int]:
        """What the partition kept of `offsets`, into `got`: the offsets still to read."""
        state = self._forward[partition]
        for offset in offsets:
            if (value := state.kept.get(offset)) is not None:
                got[(partition, offset)] = value
        state.drop_through(max(offsets))
        return sorted(o for o in offsets if (partition, o) not in got)

    def _forward_poll(self, consumer: AssignedConsumer, request: _Request, pending: dict[int, list[int]],
                      wait_s: float = 0.05) -> int:
        """One poll of the forward consumer: `pending` narrowed to what is still to read; a partition with
        nothing left to read that keeps _KEPT_BYTES stops fetching. The number of records received."""
        polled = consumer.poll(wait_s)
        with self._forward_lock:
            return self._forward_took(consumer, polled, request, pending)

    def _forward_took(self, consumer: AssignedConsumer, polled: Polled, request: _Request,
                      pending: dict[int, list[int]]) -> int:
        got, received = request.got, 0
        for tp, records in polled.items():
            state = self._forward.get(tp.partition)
            if state is None:
                continue
            offsets = request.wanted.get(tp.partition, set())
            rest = pending.get(tp.partition)
            last = rest[-1] if rest else -1  # kept: what comes after the last row still to read
            received += len(records)
            for rec in records:
                self._forward_bytes += len(rec.value or b"")
                state.position = rec.offset + 1
                if rec.value is None:
                    continue
                value = (rec.value, chunk_header_of(rec.headers))
                if rec.offset in offsets:
                    got[(tp.partition, rec.offset)] = value
                elif rec.offset > last:
                    state.keep(rec.offset, value)
        for partition, rest in pending.items():
            pending[partition] = [o for o in rest if (partition, o) not in got]
        full = [p for p, state in self._forward.items()
                if not pending.get(p) and state.kept_bytes >= _KEPT_BYTES and p not in self._forward_paused]
        if full:
            consumer.pause([self._tp(p) for p in full])
            self._forward_paused.update(full)
        return received

    def close(self) -> None:
        """Stop the fetcher's thread (it closes the consumer), after the request under way."""
        if self._ahead is not None:
            self._ahead.cancelled = True
        self._requests.put(None)
        self._thread.join(timeout=30)
