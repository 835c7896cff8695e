"""The seam on confluent-kafka (librdkafka): the default client, for its speed and static membership.

What librdkafka does differently, handled here and nowhere else:

* rebalance callbacks run inside `consume()` on the calling thread (what the seam promises), with the eager
  `range` assignor so `on_assigned` gets the member's whole assignment, as kafka-python's does;
* a message is an object of methods (`topic()`, `offset()`, ...): records are handed out as light tuples with
  the seam's attribute names;
* its default partitioner hashes keys with CRC32: producers use `murmur2_random`, Java's rule, so a group
  lands in the same partition whichever client produced it;
* delivery reports arrive through `poll()`/`flush()` callbacks: each send gets a future they complete;
* open broker connections are only known from its statistics (one JSON document a second).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, Consumer, KafkaError, KafkaException
from confluent_kafka import Producer as _RdProducer
from confluent_kafka import TopicPartition as RdTP
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from stream.kafka.bounded import Hung, call_within
from stream.kafka.errors import (
    AuthorizationFailed,
    BrokerUnavailable,
    CommitFailed,
    KafkaFailure,
    ProducerFenced,
    TopicExists,
    UnknownTopic,
)
from stream.kafka.partitioner import partition_for_key
from stream.kafka.seam import (
    AclSpec,
    Committed,
    Header,
    Offsets,
    Polled,
    RebalanceListener,
    TopicInfo,
    TopicPartition,
    TopicSpec,
    Written,
    heartbeat_interval_ms,
)

__all__ = ["ConfluentClient", "settings_for", "translate"]

log = logging.getLogger("rollout_stream.kafka")


class _OncePerInterval(logging.Filter):
    """librdkafka repeats a failing connect every backoff (tens a second while a broker is down): one line of
    each kind per `interval_s`; the worker's broker watch says when the broker is gone and back."""

    def __init__(self, interval_s: float = 10.0) -> None:
        super().__init__()
        self.interval_s, self.last = interval_s, {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = record.getMessage().split(" ", 1)[0]
        now = time.monotonic()
        if now - self.last.get(key, -self.interval_s) < self.interval_s:
            return False
        self.last[key] = now
        return True


librdkafka_log = logging.getLogger("rollout_stream.kafka.librdkafka")
librdkafka_log.addFilter(_OncePerInterval())

FETCH_PARTITION_BYTES = 4 * 1024 * 1024
FETCH_MAX_BYTES = 16 * 1024 * 1024
TIMEOUT_S = 30.0  # metadata and offset queries
TXN_TIMEOUT_S = 10.0  # a transactional call normally takes milliseconds: past this it has hung
SELF_FENCED_WITHIN_S = 10.0  # a static member fenced this soon after losing its partitions fenced itself
PARTITIONS_TTL_S = 30.0  # how long a topic's partition list is kept (the Java client refreshes every 5 min)

_AUTH = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "transactional_id",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "cluster",
}
_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
_COMMIT = {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID,
           KafkaError.FENCED_INSTANCE_ID, KafkaError._ASSIGNMENT_LOST}
_UNAVAILABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._TIMED_OUT,
                KafkaError.REQUEST_TIMED_OUT, KafkaError._RESOLVE, KafkaError.NOT_COORDINATOR,
                KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS}
_UNKNOWN_TOPIC = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}


_LEADER_MOVING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                   KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._TRANSPORT}
_COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                       KafkaError.COORDINATOR_LOAD_IN_PROGRESS, KafkaError._TIMED_OUT}


def translate(exc: BaseException | KafkaError) -> BaseException:
    """librdkafka's error (a KafkaException, or a KafkaError) as the seam's; anything else unchanged."""
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if not isinstance(error, KafkaError):
        return exc  # type: ignore[return-value]
    code, kind, text = error.code(), error.name(), error.str()
    out: KafkaFailure
    if code in _AUTH:
        out = AuthorizationFailed(text, resource=_AUTH[code], kind=kind)  # type: ignore[arg-type]
    elif code in _FENCED:
        out = ProducerFenced(text, kind=kind)
    elif code in _COMMIT:
        out = CommitFailed(text, kind=kind)
    elif code == KafkaError.TOPIC_ALREADY_EXISTS:
        out = TopicExists(text, kind=kind)
    elif code in _UNKNOWN_TOPIC:
        out = UnknownTopic(text, kind=kind)
    elif code in _UNAVAILABLE:
        out = BrokerUnavailable(text, kind=kind)
    else:
        out = KafkaFailure(text, kind=kind, retriable=error.retriable())
    if isinstance(exc, BaseException):
        out.__cause__ = exc
    return out


class _Translated:
    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, KafkaException):
            raise translate(exc) from exc
        return False


_translated = _Translated()


def _rd(tp: TopicPartition, offset: int | None = None, metadata: str | None = None) -> RdTP:
    if offset is None:
        return RdTP(tp.topic, tp.partition)
    return RdTP(tp.topic, tp.partition, offset) if metadata is None else RdTP(tp.topic, tp.partition, offset,
                                                                            metadata=metadata)


def _rd_offsets(offsets: Offsets) -> list[RdTP]:
    out = []
    for tp, pos in offsets.items():
        if isinstance(pos, int):
            out.append(_rd(tp, pos))
        else:
            out.append(_rd(tp, pos.offset, pos.metadata or None))
    return out


class Rec(NamedTuple):
    """A consumed record with the seam's attribute names (librdkafka's Message has methods)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header] | None


# ---- settings ----------------------------------------------------------------------------------------------
class _SessionWatch:
    """librdkafka's logger for a group consumer: logs as `librdkafka_log` does, and notes when librdkafka
    says the consumer's own session timed out (SESSTMOUT), which it can say in the same poll that hands over
    the fatal fencing of librdkafka#3437, before the lost partitions' callback."""

    def __init__(self) -> None:
        self.timed_out_at: float | None = None

    def log(self, level: int, msg: str, *args: Any) -> None:
        if args and args[0] == "SESSTMOUT":
            self.timed_out_at = time.monotonic()
        librdkafka_log.log(level, msg, *args)


def settings_for(conn: Any, client_id: str | None = None) -> dict[str, Any]:
    """librdkafka properties for a `stream.clients.Connection` (address, client id, TLS/SASL)."""
    sec = conn.security
    out: dict[str, Any] = {
        "bootstrap.servers": conn.bootstrap_servers,
        "client.id": client_id or conn.client_id,
        "security.protocol": sec.protocol.lower(),
        "logger": librdkafka_log,
    }
    if sec.uses_tls:
        if sec.ssl_cafile:
            out["ssl.ca.location"] = str(sec.ssl_cafile)
        if sec.ssl_certfile:
            out["ssl.certificate.location"] = str(sec.ssl_certfile)
        if sec.ssl_keyfile:
            out["ssl.key.location"] = str(sec.ssl_keyfile)
        if sec.ssl_key_password:
            out["ssl.key.password"] = sec.ssl_key_password.get_secret_value()
        out["ssl.endpoint.identification.algorithm"] = "https" if sec.ssl_check_hostname else "none"
    if sec.uses_sasl:
        out["sasl.mechanism"] = sec.sasl_mechanism
        if sec.sasl_mechanism == "OAUTHBEARER":
            path = sec.sasl_oauth_token_file

            def token(_config: str) -> tuple[str, float]:
                # Read at every (re)authentication, so a sidecar can refresh the file.
                return path.read_text().strip(), time.time() + 300

            out["oauth_cb"] = token
        else:
            out["sasl.username"] = sec.sasl_username
            out["sasl.password"] = sec.sasl_password.get_secret_value()
    return out


# ---- consumers ---------------------------------------------------------------------------------------------
class _Consumer:
    def __init__(self, consumer: Consumer) -> None:
        self._c = consumer
        self._paused: set[tuple[str, int]] = set()
        self._next: dict[
            tuple[str, int], int
        ] = {}  # per partition: the offset after the last record handed out
        self.redelivered = 0  # records librdkafka fetched again below that offset, dropped
        self._sought: set[tuple[str, int]] = set()  # sought, and no record handed out since
        self.connections: int | None = None

    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        # consume(n, timeout) returns only when n records arrived or the timeout passed: at half load every
        # record waited out the whole timeout (p50 110 ms at a 0.1 s poll, p99 over 1 s in the bench). poll()
        # returns with the first record; what is already fetched follows without waiting.
        limit = max_records or 500
        try:
            first = self._c.poll(timeout_s)
            messages = [] if first is None else [first]
            if first is not None and limit > 1:
                messages += self._c.consume(limit - 1, 0)
        except KafkaException as exc:
            if exc.args and self._recovered(exc.args[0]):
                return {}
            raise translate(exc) from exc
        out: dict[TopicPartition, list[Rec]] = {}
        for m in messages:
            error = m.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF or self._irrelevant(error):
                    continue
                if self._recovered(error):
                    return {}
                raise translate(KafkaException(error))
            tp = TopicPartition(m.topic(), m.partition())
            batch = out.get(tp)
            if batch is None:
                batch = out[tp] = []
            batch.append(
                Rec(tp.topic, tp.partition, m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers())
            )
        for tp, batch in list(out.items()):
            after = self._next.get(tp)
            if after is not None and batch[0].offset < after:
                # Handed out already: librdkafka re-fetches from an older position after some pause/resume
                # sequences (seen on the reader's backlog). The seam hands out each offset once per position.
                batch = [r for r in batch if r.offset >= after]
                self.redelivered += len(out[tp]) - len(batch)
                if not batch:
                    del out[tp]
                    continue
                out[tp] = batch
            self._next[tp] = batch[-1].offset + 1
            self._sought.discard(tp)
        return out

    def _irrelevant(self, error: KafkaError) -> bool:
        return False

    def _recovered(self, error: KafkaError) -> bool:
        """Whether a failure was dealt with here (the consumer replaced), so the poll just returns nothing."""
        return False

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        tps = list(partitions)
        if tps:
            with _translated:
                self._c.pause([_rd(tp) for tp in tps])
            self._paused |= {(tp.topic, tp.partition) for tp in tps}

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        tps = list(partitions)
        if tps:
            with _translated:
                self._c.resume([_rd(tp) for tp in tps])
                # librdkafka purged what it had fetched for a paused partition and may fetch from an older
                # position on resume: go on after the last record handed out, so none comes twice.
                for tp in tps:
                    if (tp.topic, tp.partition) in self._next:
                        self.seek(tp, self._next[(tp.topic, tp.partition)])
            self._paused -= {(tp.topic, tp.partition) for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._next[(tp.topic, tp.partition)] = offset
        self._sought.add((tp.topic, tp.partition))
        deadline = time.monotonic() + 10
        while True:
            try:
                self._c.seek(_rd(tp, offset))
                return
            except KafkaException as exc:  # "Erroneous state" until the partition's fetcher has started;
                # "Outdated" when an assignment made in the rebalance callback is still being applied
                if exc.args[0].code() not in (KafkaError._STATE, KafkaError._OUTDATED) or \
                        time.monotonic() > deadline:
                    raise translate(exc) from exc
                time.sleep(0.01)

    def position(self, tp: TopicPartition) -> int:
        pos = self.fetch_position(tp)
        if pos >= 0:
            return pos
        committed = self.committed(tp)
        if committed is not None:
            return committed.offset
        return self.beginning_offsets([tp])[tp]

    def fetch_position(self, tp: TopicPartition) -> int:
        # librdkafka's position is invalid after a seek until a record comes (e.g. a seek to the end): the
        # seam's own mark of what it handed out counts too.
        key = (tp.topic, tp.partition)
        handed_out = self._next.get(key, -1)
        if key in self._sought:  # librdkafka applies a seek asynchronously: its position may be the old one
            return handed_out
        try:
            found = self._c.position([_rd(tp)])
        except KafkaException:
            return handed_out
        offset = found[0].offset if found else OFFSET_INVALID
        return max(offset, handed_out) if offset >= 0 else handed_out

    def highwater(self, tp: TopicPartition) -> int | None:
        try:
            _low, high = self._c.get_watermark_offsets(_rd(tp), cached=True)
        except KafkaException:
            return None
        return high if high >= 0 else None

    def backlog(self) -> int:
        behind = 0
        for rtp in self._c.assignment():
            if (rtp.topic, rtp.partition) in self._paused:
                continue
            tp = TopicPartition(rtp.topic, rtp.partition)
            high, pos = self.highwater(tp), self.fetch_position(tp)
            if high is not None and pos >= 0:
                behind += max(0, high - pos)
        return behind

    def _watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        # After a broker dies librdkafka asks the old leader until its metadata catches up (a worker on the
        # 3-node cluster stopped on NOT_LEADER_FOR_PARTITION when its partitions moved): asked again.
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                low, high = self._c.get_watermark_offsets(_rd(tp), timeout=TIMEOUT_S, cached=False)
                return low, high
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                code = error.code() if isinstance(error, KafkaError) else None
                if code not in _LEADER_MOVING or time.monotonic() > deadline:
                    raise translate(exc) from exc
                time.sleep(0.2)

    def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {TopicPartition(*tp): self._watermarks(TopicPartition(*tp))[0] for tp in tps}

    def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {TopicPartition(*tp): self._watermarks(TopicPartition(*tp))[1] for tp in tps}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        with _translated:
            found = self._c.offsets_for_times(
                [_rd(tp, ts) for tp, ts in timestamps.items()], timeout=TIMEOUT_S
            )
        return {TopicPartition(f.topic, f.partition): (f.offset if f.offset >= 0 else None) for f in found}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        with _translated:
            meta = self._c.list_topics(topic, timeout=TIMEOUT_S)
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return None
        return set(found.partitions)

    def committed(self, tp: TopicPartition) -> Committed | None:
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                found = self._c.committed([_rd(tp)], timeout=TIMEOUT_S)
                break
            except KafkaException as exc:
                # The group's coordinator moves when its broker dies (NOT_COORDINATOR, then load in
                # progress): ask again until it answers, as the Java client does.
                if exc.args[0].code() not in _COORDINATOR_MOVING or time.monotonic() > deadline:
                    raise translate(exc) from exc
                time.sleep(0.2)
        if not found or found[0].offset < 0:
            return None
        return Committed(found[0].offset, found[0].metadata or "")

    def commit(self, offsets: Offsets) -> None:
        if not offsets:
            return
        with _translated:
            self._c.commit(offsets=_rd_offsets(offsets), asynchronous=False)

    def group_metadata(self) -> Any:
        return self._c.consumer_group_metadata()

    def close(self) -> None:
        self._c.close()


class _GroupConsumer(_Consumer):
    def __init__(self, consumer: Consumer, settings: dict[str, Any], watch: _SessionWatch | None = None
                 ) -> None:
        super().__init__(consumer)
        self._settings = settings  # to replace a consumer librdkafka fenced by mistake
        self._watch = watch
        self._subscription: tuple[str, RebalanceListener] | None = None
        self._lost_at: float | None = None  # when the group last took this member's partitions away
        self._kept: dict[tuple[str, int], int] = {}  # revoked partitions' positions, till the next assignment
        self._consumers = 0  # librdkafka consumers subscribed so far (one, unless one was replaced)

    def subscribe(self, topic: str, listener: RebalanceListener) -> None:
        self._subscription = (topic, listener)
        self._consumers += 1
        mine = self._consumers  # a replaced consumer's callbacks (served as it closes) are not passed on

        def assigned(c: Any, tps: list[RdTP]) -> None:
            if mine != self._consumers:
                return
            listener.on_assigned({tp.partition for tp in tps})
            # An eager rebalance revokes every partition, and librdkafka fetches the ones it gets back from
            # their committed offset: the worker, which keeps their state, read records twice (stragglers and
            # decode errors dead-lettered twice on the 3-node cluster). Kept partitions go on after the last
            # record handed out, as kafka-python 3 keeps their positions.
            resume = []
            for tp in tps:
                key = (tp.topic, tp.partition)
                if key in self._kept:
                    resume.append(RdTP(tp.topic, tp.partition, self._kept[key]))
                    self._next[key] = self._kept[key]
                else:
                    resume.append(tp)
            self._kept.clear()
            with _translated:
                c.assign(resume)

        def revoked(_c: Any, tps: list[RdTP]) -> None:
            if mine != self._consumers:
                return
            listener.on_revoked({tp.partition for tp in tps})
            self._kept.update({(tp.topic, tp.partition): self._next[(tp.topic, tp.partition)]
                               for tp in tps if (tp.topic, tp.partition) in self._next})
            self._forget(tps)

        def lost(_c: Any, tps: list[RdTP]) -> None:
            if mine != self._consumers:
                return
            listener.on_lost({tp.partition for tp in tps})
            self._lost_at = time.monotonic()
            for tp in tps:
                self._kept.pop((tp.topic, tp.partition), None)  # its state is gone: restored if it comes back
            self._forget(tps)

        with _translated:
            self._c.subscribe([topic], on_assign=assigned, on_revoke=revoked, on_lost=lost)

    def _recovered(self, error: KafkaError) -> bool:
        # librdkafka#3437: after its own session times out (a coordinator's broker died), a static member may
        # be fenced "by another consumer with the same group.instance.id" that is its own rejoin, a fatal
        # error. Right after such a loss the consumer is replaced once and rejoins with the same id; a member
        # fenced without a loss just before (another live worker took the id) still fails.
        watched = self._watch.timed_out_at if self._watch else None
        lost = [t for t in (self._lost_at, watched) if t is not None]
        # consume() hands the fatal error over as an event whose code is _FATAL and whose fatal flag is unset
        fatal = error.fatal() or error.code() in (KafkaError._FATAL, KafkaError.FENCED_INSTANCE_ID)
        if not (fatal and self._subscription is not None and lost
                and time.monotonic() - max(lost) < SELF_FENCED_WITHIN_S):
            return False
        log.warning("the group fenced this consumer right after its session timed out (librdkafka#3437): "
                    "rejoining with a new consumer and the same instance id")
        self._lost_at = None
        if self._watch is not None:
            self._watch.timed_out_at = None
        # The listener hears of the loss first: librdkafka may not have served the lost callback yet.
        lost_now = {tp.partition for tp in self._c.assignment()}
        if lost_now and self._subscription is not None:
            self._subscription[1].on_lost(lost_now)
        self._consumers += 1  # the old consumer's callbacks go nowhere from now on
        try:
            self._c.close()
        except (KafkaException, RuntimeError):  # fatal already: what it says on closing is moot
            pass
        with _translated:
            self._c = Consumer(self._settings)
        self._paused.clear()
        self._next.clear()
        self._sought.clear()
        self._kept.clear()
        topic, listener = self._subscription
        self.subscribe(topic, listener)
        return True

    def _forget(self, tps: list[RdTP]) -> None:
        for tp in tps:
            self._paused.discard((tp.topic, tp.partition))
            self._next.pop((tp.topic, tp.partition), None)
            self._sought.discard((tp.topic, tp.partition))

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(tp.topic, tp.partition) for tp in self._c.assignment()}

    def connection_count(self) -> int | None:
        return self.connections


class _AssignedConsumer(_Consumer):
    def __init__(self, consumer: Consumer, commit_group: str | None) -> None:
        super().__init__(consumer)
        self._commit_group = commit_group
        self._start: dict[tuple[str, int], int] = {}  # where a logical seek resolved to

    def assign(self, tps: Sequence[TopicPartition]) -> None:
        self._paused.clear()
        self._next.clear()
        self._sought.clear()
        self._start.clear()
        # Without a group of its own there is nothing committed to start from: asking would need the right to
        # describe the placeholder group (a least-privilege reader has none), so start at the beginning.
        start = None if self._commit_group else OFFSET_BEGINNING
        with _translated:
            self._c.assign([_rd(tp, start) for tp in tps])

    def _irrelevant(self, error: KafkaError) -> bool:
        # librdkafka wants a group id even here and looks for its coordinator: a least-privilege reader
        # may not describe that placeholder group, and never uses it.
        return self._commit_group is None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED

    def position(self, tp: TopicPartition) -> int:
        pos = self.fetch_position(tp)
        if pos >= 0:
            return pos
        if (tp.topic, tp.partition) in self._start:
            return self._start[(tp.topic, tp.partition)]
        # Without a group of its own, committed offsets need a group the caller may not be allowed to read.
        return super().position(tp) if self._commit_group else self.beginning_offsets([tp])[tp]

    def seek_to_beginning(self, tps: Sequence[TopicPartition]) -> None:
        self._reassign(tps, OFFSET_BEGINNING)

    def seek_to_end(self, tps: Sequence[TopicPartition]) -> None:
        self._reassign(tps, OFFSET_END)

    def _reassign(self, tps: Sequence[TopicPartition], logical: int) -> None:
        # A logical offset is resolved at (re)assignment; seek() to one needs a started fetcher.
        current = {(tp.topic, tp.partition): tp for tp in self._c.assignment()}
        resolved = (self.beginning_offsets if logical == OFFSET_BEGINNING else self.end_offsets)(list(tps))
        for tp in tps:
            current[(tp.topic, tp.partition)] = _rd(tp, logical)
            self._next.pop((tp.topic, tp.partition), None)
            self._sought.discard((tp.topic, tp.partition))
            self._start[(tp.topic, tp.partition)] = resolved[tp]
        with _translated:
            self._c.assign(list(current.values()))


# ---- producer ----------------------------------------------------------------------------------------------
class _Future:
    __slots__ = ("_done", "_error", "_message", "_producer")

    def __init__(self, producer: _Producer) -> None:
        self._done, self._error, self._message, self._producer = False, None, None, producer

    def _report(self, error: KafkaError | None, message: Any) -> None:
        # Called for every record (on poll/flush): the Written is made only when asked for.
        self._done = True
        if error is not None:
            self._error = translate(KafkaException(error))
            if self._producer._failed is None and self._producer._settings is None:
                # not transactional: a transaction reports its refusals itself, and an abort purges records
                self._producer._failed = self._error
        else:
            self._message = message

    def done(self) -> bool:
        return self._done

    def exception(self) -> BaseException | None:
        return self._error if self._done else None

    def get(self, timeout: float | None = None) -> Written:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._done:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise BrokerUnavailable("not acknowledged in time", kind="KafkaTimeoutError")
            self._producer._p.poll(min(0.1, left) if left is not None else 0.1)
        if self._error is not None:
            raise self._error
        m = self._message
        return Written(m.topic(), m.partition(), m.offset())


class _Producer:
    def __init__(self, producer: _RdProducer, settings: dict[str, Any] | None = None) -> None:
        self._p = producer
        self._settings = settings  # to build a fresh one when a transactional call hangs
        self._replaced = False
        self._failed: BaseException | None = None  # the first delivery failure since the last flush
        self._sends = 0
        self._partitions: dict[str, tuple[float, list[int]]] = {}  # topic: (when asked, partitions)

    def _transactional(self, what: str, call: Any) -> None:
        """A transactional call, bounded in time. librdkafka can wait forever for a group or transaction
        coordinator that went away with a broker restart, whatever timeout it is given (librdkafka#5456,
        #5511): past TIMEOUT_S the wedged producer is abandoned for a fresh one with the same transactional id
        (its init_transactions() fences the old one and aborts its open transaction) and the call fails as
        an aborted transaction would, so the caller restores and goes on."""
        producer = self._p
        try:
            # librdkafka's own timeout is TXN_TIMEOUT_S: it may not keep it
            call_within(TXN_TIMEOUT_S + 5, lambda: call(producer), f"rdkafka-{what}")
            return
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            # A fatal error other than fencing leaves the producer unusable, yet nobody else owns its id: seen
            # as INVALID_TXN_STATE on ending a transaction while the coordinator's broker died.
            if not (isinstance(error, KafkaError) and error.fatal() and error.code() not in _FENCED
                    and self._settings is not None):
                raise translate(exc) from exc
            log.warning("%s: %s: replacing the transactional producer", what, error.str())
            self._replace()
            raise KafkaFailure(f"{what}: {error.str()}; the transaction was aborted and the producer "
                               "replaced", kind="TransactionFatal", retriable=True) from exc
        except Hung:
            pass
        log.warning("%s did not return in %.0f s (librdkafka#5456): replacing the transactional producer",
                    what, TXN_TIMEOUT_S + 5)
        if self._settings is None:
            raise BrokerUnavailable(f"{what} hung", kind="TransactionHung")
        self._replace()
        raise KafkaFailure(f"{what} hung; the transaction was aborted and the producer replaced",
                           kind="TransactionHung", retriable=True)

    def _replace(self) -> None:
        """A fresh producer with the same transactional id: its init_transactions() fences the old one and
        aborts the old one's open transaction."""
        assert self._settings is not None
        fresh = _RdProducer(self._settings)
        with _translated:
            fresh.init_transactions(TIMEOUT_S * 2)
        self._p = fresh
        self._replaced = True  # no transaction of its own open yet: nothing to abort

    def send(self, topic: str, value: bytes | None, key: bytes | None = None, *, partition: int | None = None,
             headers: Sequence[Header] | None = None, timestamp_ms: int | None = None) -> _Future:
        future = _Future(self)
        kwargs: dict[str, Any] = {"on_delivery": future._report}
        if partition is not None:
            kwargs["partition"] = partition
        if headers:
            kwargs["headers"] = list(headers)
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        while True:
            try:
                self._p.produce(topic, value, key, **kwargs)
                break
            except BufferError:  # the local queue is full: serve delivery reports until there is room
                self._p.poll(0.05)
            except KafkaException as exc:
                raise translate(exc) from exc
        self._sends += 1
        if self._sends % 1000 == 0:
            self._p.poll(0)  # delivery reports, without waiting
        return future

    def partitions_for(self, topic: str) -> list[int] | None:
        # A metadata request per call cost the stage half its time (one per group): known partitions are kept
        # for a while, as the Java client and kafka-python keep their metadata.
        known = self._partitions.get(topic)
        now = time.monotonic()
        if known is not None and now - known[0] < PARTITIONS_TTL_S:
            return known[1]
        try:
            meta = self._p.list_topics(topic, timeout=TIMEOUT_S)
        except KafkaException:
            return None
        found = meta.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            return None
        partitions = sorted(found.partitions)
        self._partitions[topic] = (now, partitions)
        return partitions

    def partition_for(self, topic: str, key: bytes) -> int | None:
        partitions = self.partitions_for(topic)
        return partitions[partition_for_key(key, len(partitions))] if partitions else None

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every record sent; raise the first one the broker refused since the last flush. librdkafka
        reports refusals (no Write ACL) only in delivery reports: synth exited 0 having delivered nothing."""
        with _translated:
            self._p.flush(-1 if timeout is None else timeout)
        failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def close(self, timeout: float | None = None) -> None:
        try:
            self._p.flush(-1 if timeout is None else timeout)
        except KafkaException as exc:  # e.g. a transaction left fatal by an interrupt: what failed was said
            log.warning("closing the producer: %s", exc.args[0].str() if exc.args else exc)
        failed, self._failed = self._failed, None
        if failed is not None:  # records the broker refused are not dropped silently on closing either
            raise failed

    def init_transactions(self) -> None:
        with _translated:
            self._p.init_transactions(TIMEOUT_S * 2)

    def begin_transaction(self) -> None:
        with _translated:
            self._p.begin_transaction()
        self._replaced = False

    def send_offsets_to_transaction(self, offsets: Offsets, group_metadata: Any) -> None:
        positions = _rd_offsets(offsets)
        self._transactional("send_offsets_to_transaction",
                            lambda p: p.send_offsets_to_transaction(positions, group_metadata, TXN_TIMEOUT_S))

    def commit_transaction(self) -> None:
        self._resumed("commit_transaction", lambda p: p.commit_transaction(TXN_TIMEOUT_S))

    def abort_transaction(self) -> None:
        if self._replaced:  # its predecessor's transaction was aborted by the replacement
            self._replaced = False
            return
        self._resumed("abort_transaction", lambda p: p.abort_transaction(TXN_TIMEOUT_S))

    def _resumed(self, what: str, call: Any) -> None:
        """librdkafka's contract for commit and abort: a retriable error (e.g. _TIMED_OUT while a coordinator
        moves) means "call again to resume"; aborting instead fails with _CONFLICT (the commit is still in
        progress). Seen on the 3-node cluster when the coordinator's broker was killed. (Ctrl-C cannot
        interleave an abort here: call_within lets the interrupted call finish first.)"""
        deadline = time.monotonic() + 3 * TXN_TIMEOUT_S
        while True:
            try:
                self._transactional(what, call)
                return
            except KafkaFailure as exc:
                error = exc.__cause__.args[0] if isinstance(exc.__cause__, KafkaException) else None
                if not (isinstance(error, KafkaError) and error.retriable()) or time.monotonic() > deadline:
                    raise
                log.warning("%s: %s; calling it again to resume (librdkafka's contract)", what, error.str())


# ---- admin -------------------------------------------------------------------------------------------------
_RESOURCE_TYPES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                   "transactional-id": ResourceType.TRANSACTIONAL_ID, "cluster": ResourceType.BROKER}
_OPERATIONS = {"Read": AclOperation.READ, "Write": AclOperation.WRITE, "Describe": AclOperation.DESCRIBE,
               "Create": AclOperation.CREATE, "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE}


def _ops(found: Any) -> frozenset[str] | None:
    if found is None:
        return None
    return frozenset(op.name for op in found)


class _Admin:
    def __init__(self, admin: AdminClient) -> None:
        self._a = admin

    def _result(self, future: Any) -> Any:
        with _translated:
            return future.result(TIMEOUT_S)

    def list_topics(self) -> set[str]:
        with _translated:
            return set(self._a.list_topics(timeout=TIMEOUT_S).topics)

    def describe_topics(
        self, names: Sequence[str], *, authorized_operations: bool = False
    ) -> list[TopicInfo]:
        from confluent_kafka import TopicCollection

        futures = self._a.describe_topics(TopicCollection(list(names)),
                                          include_authorized_operations=authorized_operations,
                                          request_timeout=TIMEOUT_S)
        out = []
        for name in names:
            try:
                desc = futures[name].result(TIMEOUT_S)
            except KafkaException as exc:
                out.append(TopicInfo(name, None, translate(exc)))  # type: ignore[arg-type]
                continue
            out.append(TopicInfo(name, len(desc.partitions), None,
                                 _ops(desc.authorized_operations) if authorized_operations else None,
                                 min((len(p.replicas) for p in desc.partitions), default=None),
                                 sum(1 for p in desc.partitions if p.leader is None or p.leader.id < 0)))
        return out

    def create_topics(
        self, specs: Sequence[TopicSpec], *, timeout_s: float = 30.0
    ) -> dict[str, Exception | None]:
        if not specs:
            return {}
        futures = self._a.create_topics(
            [NewTopic(s.name, s.partitions, s.replication_factor, config=dict(s.configs)) for s in specs],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        out: dict[str, Exception | None] = {}
        for name, future in futures.items():
            try:
                future.result(timeout_s)
                out[name] = None
            except KafkaException as exc:
                out[name] = translate(exc)  # type: ignore[assignment]
        for name in out:
            if out[name] is None:
                self._wait_for_leaders(name, timeout_s)
        return out

    def _wait_for_leaders(self, name: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            topic = self._a.list_topics(name, timeout=TIMEOUT_S).topics.get(name)
            if topic is not None and topic.error is None and topic.partitions and \
                    all(p.leader >= 0 for p in topic.partitions.values()):
                return
            time.sleep(0.05)

    def delete_topics(self, names: Sequence[str], *, timeout_s: float = 30.0) -> None:
        if not names:
            return
        for future in self._a.delete_topics(list(names), operation_timeout=timeout_s).values():
            try:
                future.result(timeout_s)
            except KafkaException:
                pass  # as kafka-python's raise_errors=False: best effort

    def topic_configs(self, name: str) -> dict[str, str]:
        futures = self._a.describe_configs([ConfigResource(ResourceType.TOPIC, name)])
        out: dict[str, str] = {}
        for future in futures.values():
            for key, entry in self._result(future).items():
                out[key] = str(entry.value)
        return out

    def group_offsets(self, groups: Sequence[str], tps: Sequence[TopicPartition]
                      ) -> dict[str, dict[TopicPartition, tuple[int, str]]]:
        from confluent_kafka import ConsumerGroupTopicPartitions

        out: dict[str, dict[TopicPartition, tuple[int, str]]] = {}
        for group in groups:  # the API takes one group per request
            futures = self._a.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, [_rd(tp) for tp in tps])], request_timeout=TIMEOUT_S)
            result = self._result(futures[group])
            out[group] = {TopicPartition(tp.topic, tp.partition): (tp.offset, tp.metadata or "")
                          for tp in result.topic_partitions if tp.offset >= 0}
        return out

    def _cluster(self, authorized_operations: bool = False) -> Any:
        return self._result(self._a.describe_cluster(include_authorized_operations=authorized_operations,
                                                     request_timeout=TIMEOUT_S))

    def broker_count(self) -> int:
        return len(self._cluster().nodes)

    def broker_ready(self, port: int) -> bool:
        return any(node.port == port for node in self._cluster().nodes)

    def create_acls(self, acls: Sequence[AclSpec]) -> list[tuple[AclSpec, Exception]]:
        bindings = [
            AclBinding(
                _RESOURCE_TYPES[a.resource],
                "kafka-cluster" if a.resource == "cluster" else a.name,
                ResourcePatternType.PREFIXED if a.prefixed else ResourcePatternType.LITERAL,
                a.principal,
                a.host,
                _OPERATIONS[a.operation],
                AclPermissionType.ALLOW,
            )
            for a in acls
        ]
        failed = []
        for spec, binding in zip(acls, bindings, strict=True):
            try:
                self._a.create_acls([binding])[binding].result(TIMEOUT_S)
            except KafkaException as exc:
                failed.append((spec, translate(exc)))  # type: ignore[arg-type]
        return failed

    def may_create_topic(self, name: str) -> bool:
        futures = self._a.create_topics(
            [NewTopic(name, 1, -1)], validate_only=True, request_timeout=TIMEOUT_S
        )
        try:
            futures[name].result(TIMEOUT_S)
        except KafkaException as exc:
            return exc.args[0].code() not in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                                              KafkaError.CLUSTER_AUTHORIZATION_FAILED)
        return True

    def group_operations(self, group: str) -> frozenset[str] | None:
        futures = self._a.describe_consumer_groups([group], include_authorized_operations=True,
                                                   request_timeout=TIMEOUT_S)
        try:
            desc = futures[group].result(TIMEOUT_S)
        except KafkaException as exc:
            failure = translate(exc)
            if isinstance(failure, AuthorizationFailed):
                raise failure from exc
            return None
        return _ops(desc.authorized_operations)

    def cluster_operations(self) -> frozenset[str] | None:
        return _ops(self._cluster(authorized_operations=True).authorized_operations)

    def may_describe_transaction(self, transactional_id: str, budget_s: float = 10.0) -> bool | None:
        return None  # confluent-kafka's admin has no DescribeTransactions

    def close(self) -> None:
        """The admin client has no connection to close explicitly."""


# ---- the client --------------------------------------------------------------------------------------------
class ConfluentClient:
    """Builds librdkafka clients for one `stream.clients.Connection`."""

    name = "confluent"

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def _consumer_settings(self, client_id: str | None, max_record_bytes: int, isolation: str,
                           tuning: dict[str, Any]) -> dict[str, Any]:
        return {
            **settings_for(self.conn, client_id),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.partition.eof": False,
            "max.partition.fetch.bytes": min(max_record_bytes, FETCH_PARTITION_BYTES),
            "fetch.max.bytes": FETCH_MAX_BYTES,
            "receive.message.max.bytes": max(max_record_bytes, FETCH_MAX_BYTES) + 1024 * 1024,
            "reconnect.backoff.max.ms": 5000,
            # An offset query waits behind the connection's in-flight fetch, which the broker holds for up to
            # this long when there is nothing new: 500 ms (the default) per query made restores slow.
            "fetch.wait.max.ms": 100,
            **tuning,
        }

    def group_consumer(self, group_id: str, *, client_id: str | None = None, max_record_bytes: int,
                       session_timeout_s: float = 45.0, instance_id: str | None = None,
                       isolation: str = "read_committed", **tuning: Any) -> _GroupConsumer:
        tuning.pop("rejoin_after_s", None)  # kafka-python's dropped joins: librdkafka does not drop them
        consumer_ref: list[_GroupConsumer] = []

        def stats(document: str) -> None:
            brokers = json.loads(document).get("brokers", {})
            consumer_ref[0].connections = sum(1 for b in brokers.values()
                                              if b.get("state") == "UP" and b.get("nodeid", -1) >= 0)

        watch = _SessionWatch()
        settings = {
            **self._consumer_settings(client_id, max_record_bytes, isolation, _librdkafka_names(tuning)),
            "logger": watch,
            "group.id": group_id,
            "session.timeout.ms": int(session_timeout_s * 1000),
            "heartbeat.interval.ms": heartbeat_interval_ms(session_timeout_s),
            "partition.assignment.strategy": "range",
            "statistics.interval.ms": 1000,
            "stats_cb": stats,
        }
        if instance_id is not None:
            settings["group.instance.id"] = instance_id
        with _translated:
            consumer = _GroupConsumer(Consumer(settings), settings, watch)
        consumer_ref.append(consumer)
        return consumer

    def assigned_consumer(self, *, client_id: str | None = None, max_record_bytes: int,
                          isolation: str = "read_committed", commit_group: str | None = None,
                          **tuning: Any) -> _AssignedConsumer:
        settings = self._consumer_settings(client_id, max_record_bytes, isolation, _librdkafka_names(tuning))
        # librdkafka needs a group id even for a consumer that never joins one.
        settings["group.id"] = commit_group or f"rollout-stream-unjoined-{id(self):x}"
        with _translated:
            return _AssignedConsumer(Consumer(settings), commit_group)

    def producer(
        self,
        *,
        client_id: str | None = None,
        max_record_bytes: int,
        transactional_id: str | None = None,
        transaction_timeout_s: float = 60.0,
        **tuning: Any,
    ) -> _Producer:
        settings: dict[str, Any] = {
            **settings_for(self.conn, client_id),
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "partitioner": "murmur2_random",  # Java's (and kafka-python's) rule for keyed records
            "message.max.bytes": max_record_bytes + 1024 * 1024,
            "reconnect.backoff.max.ms": 5000,
            **_librdkafka_names(tuning),
        }
        if transactional_id is not None:
            settings["transactional.id"] = transactional_id
            settings["transaction.timeout.ms"] = int(transaction_timeout_s * 1000)
        with _translated:
            return _Producer(_RdProducer(settings), settings if transactional_id is not None else None)

    def admin(self, *, client_id: str | None = None, **tuning: Any) -> _Admin:
        settings = {**settings_for(self.conn, client_id), **_librdkafka_names(tuning)}
        with _translated:
            return _Admin(AdminClient(settings))


# kafka-python spellings some callers pass as tuning, in librdkafka's names.
_NAMES = {"linger_ms": "linger.ms", "batch_size": "batch.size", "fetch_max_wait_ms": "fetch.wait.max.ms",
          "max_poll_records": None, "request_timeout_ms": "request.timeout.ms", "bootstrap_timeout_ms": None,
          "ssl_context": None, "ssl_check_hostname": None}


def _librdkafka_names(tuning: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in tuning.items():
        name = _NAMES.get(key, key)
        if name is not None:
            out[name] = value
    return out
