"""The seam on kafka-python (the client the design names). Every workaround of its bugs lives here:

* a partition's fetched records parked while it was paused came back only while the fetcher's in-line slot
  was `None`, and a drained slot keeps its spent object (`_unpark_resumed`; a reader stalled for good);
* a group join that completes while `poll()` times out can be dropped: the member owns partitions it never
  receives (`_RejoinWatchdog`: rejoin after `REJOIN_AFTER_S` without partitions);
* rebalance callbacks run on its IO thread as coroutines, where the blocking `commit()` may not run
  (`_Listener` collects the commits of `on_revoked` and awaits the coroutine under `commit()`);
* fetch positions and high watermarks are only readable without a network call from private state;
* a send whose topic metadata the broker refused fails its future at once without failing the transaction
  (committing would lose that record): `send` raises what the client already knows failed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import kafka.errors as ke
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourceType,
)
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.net.sasl.oauth import AbstractTokenProvider
from kafka.partitioner.default import murmur2
from kafka.structs import OffsetAndMetadata

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
from stream.logs import log_event

__all__ = ["KafkaPythonClient", "RejoinWatchdog", "client_settings", "kafka_acl", "raw_admin", "raw_consumer",
           "raw_producer", "security_settings", "translate"]

log = logging.getLogger("rollout_stream.kafka")

# Fetch sizes bound the client's buffers, not the record size: since KIP-74 (fetch v3) the broker returns a
# first record batch larger than these limits whole, so 64 MiB samples still pass. Large limits only let
# one fetch hold ~50 MiB of raw response next to the records copied out of it (measured: peak RSS 1.71 ->
# 1.25 x open-window bytes for 32K-token windows; docs/benchmarks.md).
FETCH_PARTITION_BYTES = 4 * 1024 * 1024
FETCH_MAX_BYTES = 16 * 1024 * 1024
# kafka-python backs off up to 30 s between reconnects; after a broker restart that is 30 s of idling.
RECONNECT_BACKOFF_MAX_MS = 5000
# No partitions this long while subscribed: the join may have been dropped (see the module doc). Long enough
# that a member idle because there are more members than partitions rarely rejoins (each rejoin rebalances).
REJOIN_AFTER_S = 30.0
# A transactional call (send_offsets_to_transaction, commit, abort) takes milliseconds. kafka-python 3.0 can
# wait for it forever once the broker of the group or transaction coordinator is SIGKILLed (seen on the
# local 3-node cluster: TxnOffsetCommit never answered, never retried); past this the producer is replaced.
TXN_TIMEOUT_S = 15.0

_AUTH = {
    ke.TopicAuthorizationFailedError: "topic",
    ke.GroupAuthorizationFailedError: "group",
    ke.TransactionalIdAuthorizationFailedError: "transactional_id",
    ke.ClusterAuthorizationFailedError: "cluster",
}


def translate(exc: BaseException) -> BaseException:
    """kafka-python's exception as the seam's (stream.kafka.errors); anything else unchanged."""
    if isinstance(exc, KafkaFailure) or not isinstance(exc, ke.KafkaError):
        return exc
    kind, text = type(exc).__name__, _text(exc)
    nested = next((a for a in exc.args if isinstance(a, ke.KafkaError)), None)
    if nested is not None and isinstance(nested, (ke.AuthorizationError, ke.ProducerFencedError)):
        # "Cannot perform send because ... failed" wrapping a denial
        exc, kind = nested, type(nested).__name__
    out: KafkaFailure
    if isinstance(exc, ke.AuthorizationError):
        resource = next((r for cls, r in _AUTH.items() if isinstance(exc, cls)), "unknown")
        out = AuthorizationFailed(text, resource=resource, kind=kind)  # type: ignore[arg-type]
    elif isinstance(exc, (ke.ProducerFencedError, ke.InvalidProducerEpochError)):
        out = ProducerFenced(text, kind=kind)
    elif isinstance(exc, (ke.CommitFailedError, ke.RebalanceInProgressError, ke.IllegalGenerationError,
                          ke.UnknownMemberIdError, ke.FencedInstanceIdError)):
        out = CommitFailed(text, kind=kind)
    elif isinstance(exc, ke.TopicAlreadyExistsError):
        out = TopicExists(text, kind=kind)
    elif isinstance(exc, ke.UnknownTopicOrPartitionError):
        out = UnknownTopic(text, kind=kind)
    elif isinstance(exc, (ke.BrokerNotAvailableError, ke.KafkaConnectionError, ke.KafkaTimeoutError,
                          ke.NodeNotReadyError, ke.RequestTimedOutError)):
        out = BrokerUnavailable(text, kind=kind)
    else:
        out = KafkaFailure(text, kind=kind, retriable=bool(getattr(exc, "retriable", False)))
    out.__cause__ = exc
    return out


def _text(exc: BaseException) -> str:
    text = str(exc)
    prefix = f"[Error {getattr(exc, 'errno', '')}] {type(exc).__name__}"
    return text[len(prefix):].lstrip(": ") if text.startswith(prefix) else text


class _Translated:
    """Raise the seam's errors from a block that calls kafka-python."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: Any, exc: BaseException | None, tb: Any) -> bool:
        if isinstance(exc, ke.KafkaError):
            raise translate(exc) from exc
        return False


_translated = _Translated()


def _ktp(tp: TopicPartition) -> KTP:
    return KTP(tp.topic, tp.partition)


def _offsets(offsets: Offsets) -> dict[KTP, OffsetAndMetadata]:
    out = {}
    for tp, pos in offsets.items():
        offset, meta = (pos, "") if isinstance(pos, int) else (pos.offset, pos.metadata)
        out[_ktp(tp)] = OffsetAndMetadata(offset, meta, -1)
    return out


# ---- consumers ---------------------------------------------------------------------------------------------
class _Consumer:
    """What group and assigned consumers share."""

    def __init__(self, consumer: KafkaConsumer) -> None:
        self._c = consumer

    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        _unpark_resumed(self._c)
        with _translated:
            return self._c.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._c.pause(*[_ktp(tp) for tp in partitions])

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._c.resume(*[_ktp(tp) for tp in partitions])

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._c.seek(_ktp(tp), offset)

    def position(self, tp: TopicPartition) -> int:
        with _translated:
            return self._c.position(_ktp(tp))

    def fetch_position(self, tp: TopicPartition) -> int:
        state = self._c._subscription.assignment.get(_ktp(tp))
        position = getattr(state, "position", None) if state is not None else None
        return getattr(position, "offset", -1) if position is not None else -1

    def highwater(self, tp: TopicPartition) -> int | None:
        state = self._c._subscription.assignment.get(_ktp(tp))
        return getattr(state, "highwater", None) if state is not None else None

    def backlog(self) -> int:
        behind = 0
        for state in list(self._c._subscription.assignment.values()):
            if state.paused or state.position is None or state.highwater is None:
                continue
            behind += max(0, state.highwater - state.position.offset)
        return behind

    def beginning_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        with _translated:
            found = self._c.beginning_offsets([_ktp(tp) for tp in tps])
        return {TopicPartition(*k): v for k, v in found.items()}

    def end_offsets(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        with _translated:
            found = self._c.end_offsets([_ktp(tp) for tp in tps])
        return {TopicPartition(*k): v for k, v in found.items()}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        with _translated:
            found = self._c.offsets_for_times({_ktp(tp): ts for tp, ts in timestamps.items()})
        return {TopicPartition(*k): (v.offset if v is not None else None) for k, v in found.items()}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        with _translated:
            found = self._c.partitions_for_topic(topic)
        return set(found) if found else None

    def committed(self, tp: TopicPartition) -> Committed | None:
        with _translated:
            found = self._c.committed(_ktp(tp), metadata=True)
        if found is None or found.offset is None or found.offset < 0:
            return None
        return Committed(found.offset, found.metadata or "")

    def commit(self, offsets: Offsets) -> None:
        with _translated:
            self._c.commit(_offsets(offsets))

    def group_metadata(self) -> Any:
        return self._c.group_metadata()

    def close(self) -> None:
        self._c.close(autocommit=False)


def _unpark_resumed(consumer: KafkaConsumer) -> None:
    fetcher = getattr(consumer, "_fetcher", None)
    current = getattr(fetcher, "_next_partition_records", None)
    if current is not None and not current:  # spent: nothing left to return from it
        fetcher._next_partition_records = None


class _Listener(AsyncConsumerRebalanceListener):
    """Runs the seam's listener on kafka-python's IO thread while the loop waits in poll()."""

    def __init__(self, owner: _GroupConsumer, listener: RebalanceListener) -> None:
        self.owner, self.listener = owner, listener

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.owner._revoking = []
        try:
            self.listener.on_revoked({tp.partition for tp in revoked})
        finally:
            pending, self.owner._revoking = self.owner._revoking, None
        for offsets in pending:
            # The blocking commit() may not run on the IO thread; this is the coroutine under it.
            await self.owner._c._coordinator._commit_offsets_sync_async(offsets)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.listener.on_assigned({tp.partition for tp in assigned})

    async def on_partitions_lost(self, lost: Any) -> None:
        self.listener.on_lost({tp.partition for tp in lost})


class RejoinWatchdog:
    """Call `check(now)` once per poll; it resubscribes after `after_s` without partitions (a dropped
    join)."""

    def __init__(self, consumer: Any, topic: str, after_s: float, listener: Any = None) -> None:
        self.consumer, self.topic, self.after_s, self.listener = consumer, topic, after_s, listener
        self.unassigned_since: float | None = None

    def check(self, now: float, assigned: bool = False) -> float | None:
        """Seconds without partitions when it rejoined just now, else None (`assigned`: the caller knows)."""
        if assigned or self.consumer.assignment():
            self.unassigned_since = None
            return None
        if self.unassigned_since is None:
            self.unassigned_since = now
            return None
        waited = now - self.unassigned_since
        if waited < self.after_s:
            return None
        self.consumer.unsubscribe()
        self.consumer.subscribe([self.topic], listener=self.listener)
        self.unassigned_since = now
        return waited


class _GroupConsumer(_Consumer):
    def __init__(self, consumer: KafkaConsumer, rejoin_after_s: float = REJOIN_AFTER_S) -> None:
        super().__init__(consumer)
        self.rejoin_after_s = rejoin_after_s
        self._revoking: list[dict[KTP, OffsetAndMetadata]] | None = None
        self._watchdog: RejoinWatchdog | None = None

    def subscribe(self, topic: str, listener: RebalanceListener) -> None:
        adapter = _Listener(self, listener)
        self._c.subscribe([topic], listener=adapter)
        self._watchdog = RejoinWatchdog(self._c, topic, self.rejoin_after_s, adapter)

    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        polled = super().poll(timeout_s, max_records)
        if self._watchdog is not None and (waited := self._watchdog.check(time.monotonic())) is not None:
            log_event(log, "partitions.none_assigned", logging.WARNING, seconds=f"{waited:.0f}",
                      action="rejoined the consumer group")
        return polled

    def commit(self, offsets: Offsets) -> None:
        if self._revoking is not None:  # inside on_revoked, on the IO thread: _Listener commits them
            self._revoking.append(_offsets(offsets))
            return
        super().commit(offsets)

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(*tp) for tp in self._c.assignment()}

    def connection_count(self) -> int | None:
        try:
            return int(self._c.metrics()["consumer-metrics"]["connection-count"])
        except (KeyError, TypeError, ValueError):
            return None  # metrics disabled or renamed: say nothing rather than something wrong


class _AssignedConsumer(_Consumer):
    def assign(self, tps: Sequence[TopicPartition]) -> None:
        self._c.assign([_ktp(tp) for tp in tps])

    def seek_to_beginning(self, tps: Sequence[TopicPartition]) -> None:
        self._c.seek_to_beginning(*[_ktp(tp) for tp in tps])

    def seek_to_end(self, tps: Sequence[TopicPartition]) -> None:
        self._c.seek_to_end(*[_ktp(tp) for tp in tps])


# ---- producer ----------------------------------------------------------------------------------------------
class _Future:
    __slots__ = ("_f",)

    def __init__(self, future: Any) -> None:
        self._f = future

    def done(self) -> bool:
        return self._f.is_done

    def exception(self) -> BaseException | None:
        if not self._f.is_done or not self._f.failed():
            return None
        return translate(self._f.exception)

    def get(self, timeout: float | None = None) -> Written:
        with _translated:
            md = self._f.get(timeout)
        return Written(md.topic, md.partition, md.offset)


class _Producer:
    def __init__(self, producer: KafkaProducer, settings: dict[str, Any] | None = None) -> None:
        self._p = producer
        self._settings = settings  # a transactional producer's, to build a fresh one when a call hangs
        self._needs_init = False  # a fresh producer whose init_transactions() has not succeeded yet
        self._replaced = False  # no transaction of its own open yet: nothing to abort

    def _transactional(self, what: str, call: Any) -> None:
        """A transactional call, bounded in time (TXN_TIMEOUT_S). Past it, the wedged producer is abandoned
        for a fresh one with the same transactional id, whose init_transactions() fences the old one and
        aborts its open transaction; the call fails as an aborted transaction would (retriable), so the
        worker restores from its last commit and goes on."""
        producer = self._p
        try:
            with _translated:
                call_within(TXN_TIMEOUT_S, lambda: call(producer), f"kafka-python-{what}")
            return
        except Hung:
            pass
        log_event(log, "producer.replaced", logging.WARNING, call=what, after_s=TXN_TIMEOUT_S,
                  reason="a transactional call did not return (its coordinator's broker went away)")
        if self._settings is None:
            raise BrokerUnavailable(f"{what} hung", kind="TransactionHung")
        stuck = self._p

        def close_stuck() -> None:
            try:
                stuck.close(timeout=0)
            except Exception:  # noqa: BLE001 - it is being abandoned: whatever it says is moot
                pass

        threading.Thread(target=close_stuck, name="kafka-python-abandoned", daemon=True).start()
        with _translated:
            self._p = KafkaProducer(**self._settings)
        self._needs_init, self._replaced = True, True
        self._init()
        raise KafkaFailure(f"{what} hung for {TXN_TIMEOUT_S:g} s; the transaction was aborted and the "
                           "producer replaced", kind="TransactionHung", retriable=True)

    def _init(self) -> None:
        with _translated:
            self._p.init_transactions()
        self._needs_init = False

    def send(self, topic: str, value: bytes | None, key: bytes | None = None, *, partition: int | None = None,
             headers: Sequence[Header] | None = None, timestamp_ms: int | None = None) -> _Future:
        with _translated:
            future = self._p.send(topic, value=value, key=key, headers=list(headers) if headers else None,
                                  partition=partition, timestamp_ms=timestamp_ms)
        if future.is_done and future.failed():  # refused before it left (e.g. no Describe on the topic)
            raise translate(future.exception)
        return _Future(future)

    def partitions_for(self, topic: str) -> list[int] | None:
        try:
            found = self._p.partitions_for(topic)
        except ke.KafkaError:
            return None
        return sorted(found) if found else None

    def partition_for(self, topic: str, key: bytes) -> int | None:
        # kafka-python runs murmur2 in pure Python for every send (a quarter of `send()` in the stage's
        # profile); members of a group share their key, so the stage asks once per group and names it.
        partitions = self.partitions_for(topic)
        if not partitions:
            return None
        return partitions[(murmur2(key) & 0x7FFFFFFF) % len(partitions)]

    def flush(self, timeout: float | None = None) -> None:
        with _translated:
            self._p.flush(timeout=timeout)

    def close(self, timeout: float | None = None) -> None:
        self._p.close(timeout=timeout)

    def init_transactions(self) -> None:
        self._init()

    def begin_transaction(self) -> None:
        if self._needs_init:  # the fresh producer's first init failed (no coordinator yet): again now
            self._init()
        with _translated:
            self._p.begin_transaction()
        self._replaced = False

    def send_offsets_to_transaction(self, offsets: Offsets, group_metadata: Any) -> None:
        positions = _offsets(offsets)
        self._transactional("send_offsets_to_transaction",
                            lambda p: p.send_offsets_to_transaction(positions, group_metadata))

    def commit_transaction(self) -> None:
        self._transactional("commit_transaction", lambda p: p.commit_transaction())

    def abort_transaction(self) -> None:
        if self._replaced:  # the fresh producer's init_transactions() aborted the open transaction already
            return
        self._transactional("abort_transaction", lambda p: p.abort_transaction())


# ---- admin -------------------------------------------------------------------------------------------------
_RESOURCE_TYPES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                   "transactional-id": ResourceType.TRANSACTIONAL_ID, "cluster": ResourceType.CLUSTER}
_ERROR_CODES = {3: UnknownTopic, 29: AuthorizationFailed}


class _Admin:
    def __init__(self, admin: KafkaAdminClient) -> None:
        self._a = admin

    def list_topics(self) -> set[str]:
        with _translated:
            return set(self._a.list_topics())

    def describe_topics(
        self, names: Sequence[str], *, authorized_operations: bool = False
    ) -> list[TopicInfo]:
        with _translated:
            found = self._a.describe_topics(list(names))
        out = []
        for t in found:
            code = t.get("error_code", 0)
            error: Exception | None = None
            if code:
                cls = _ERROR_CODES.get(code, KafkaFailure)
                error = (AuthorizationFailed(f"topic {t['name']!r}", resource="topic",
                                             kind="TopicAuthorizationFailedError")
                         if cls is AuthorizationFailed
                         else cls(f"topic {t['name']!r}", kind=ke.for_code(code).__name__))
            ops = _operations(t.get("authorized_operations")) if authorized_operations else None
            parts = [] if code else list(t.get("partitions") or ())
            out.append(TopicInfo(t["name"], None if code else len(parts), error, ops,
                                 min((len(p.get("replica_nodes") or ()) for p in parts), default=None),
                                 sum(1 for p in parts if p.get("leader_id", -1) < 0)))
        return out

    def create_topics(
        self, specs: Sequence[TopicSpec], *, timeout_s: float = 30.0
    ) -> dict[str, Exception | None]:
        out: dict[str, Exception | None] = {}
        for spec in specs:  # one by one: one refusal must not hide whether the others were created
            try:
                with _translated:
                    self._a.create_topics({spec.name: {"num_partitions": spec.partitions,
                                                       "replication_factor": spec.replication_factor,
                                                       "configs": dict(spec.configs)}},
                                          timeout_ms=int(timeout_s * 1000), wait_for_metadata=True)
                out[spec.name] = None
            except KafkaFailure as exc:
                out[spec.name] = exc
        return out

    def delete_topics(self, names: Sequence[str], *, timeout_s: float = 30.0) -> None:
        with _translated:
            self._a.delete_topics(list(names), timeout_ms=int(timeout_s * 1000), raise_errors=False)

    def topic_configs(self, name: str) -> dict[str, str]:
        from kafka.admin import ConfigResource, ConfigResourceType

        with _translated:
            found = self._a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)],
                                             config_filter="all")
        # kafka-python 3 answers {"topic": {name: {key: {"value": ...}}}}
        entries = found.get("topic", {}).get(name, {}) if isinstance(found, dict) else {}
        return {k: str(v.get("value") if isinstance(v, dict) else v) for k, v in entries.items()}

    def group_offsets(self, groups: Sequence[str], tps: Sequence[TopicPartition]
                      ) -> dict[str, dict[TopicPartition, tuple[int, str]]]:
        with _translated:
            found = self._a.list_group_offsets({g: [_ktp(tp) for tp in tps] for g in groups})
        return {g: {TopicPartition(*tp): (om.offset, om.metadata or "") for tp, om in found.get(g, {}).items()
                    if om.offset is not None and om.offset >= 0} for g in groups}

    def broker_count(self) -> int:
        with _translated:
            return len(self._a.describe_cluster().get("brokers", ()))

    def broker_ready(self, port: int) -> bool:
        with _translated:
            brokers = self._a.describe_cluster().get("brokers", [])
        return any(b.get("port") == port and not b.get("is_fenced") for b in brokers)

    def create_acls(self, acls: Sequence[AclSpec]) -> list[tuple[AclSpec, Exception]]:
        kacls = [kafka_acl(a) for a in acls]
        with _translated:
            result = self._a.create_acls(kacls)
        failed = []
        for acl, error in result.get("failed", []):
            spec = acls[kacls.index(acl)] if acl in kacls else None
            if spec is not None:
                failed.append((spec, translate(error) if isinstance(error, BaseException)
                               else KafkaFailure(str(error))))
        return failed

    def may_create_topic(self, name: str) -> bool:
        with _translated:
            result = self._a.create_topics({name: {"num_partitions": 1, "replication_factor": -1}},
                                           validate_only=True, raise_errors=False)
        codes = [t.get("error_code", 0) for t in result.get("topics", [])]
        return 29 not in codes and 31 not in codes  # TOPIC_ / CLUSTER_AUTHORIZATION_FAILED

    def group_operations(self, group: str) -> frozenset[str] | None:
        try:
            described = self._a.describe_groups([group]).get(group, {})
        except ke.GroupAuthorizationFailedError as exc:
            raise translate(exc) from exc
        except ke.KafkaError:
            return None  # coordinator not available and the like: the consumer will report it
        if described.get("error") and "GROUP_AUTHORIZATION_FAILED" in str(described["error"]):
            raise AuthorizationFailed(
                f"group {group!r}", resource="group", kind="GroupAuthorizationFailedError"
            )
        return _operations(described.get("authorized_operations"))

    def cluster_operations(self) -> frozenset[str] | None:
        with _translated:
            return _operations(self._a.describe_cluster().get("authorized_operations"))

    def may_describe_transaction(self, transactional_id: str, budget_s: float = 10.0) -> bool:
        deadline = time.monotonic() + budget_s
        while True:
            try:
                self._a.describe_transactions([transactional_id])
                return True
            except ke.TransactionalIdAuthorizationFailedError:
                return False
            except ke.TransactionalIdNotFoundError:
                return True  # allowed to describe it; it has just never been used
            except (
                ke.CoordinatorNotAvailableError, ke.CoordinatorLoadInProgressError, ke.NotCoordinatorError
            ):
                if time.monotonic() >= deadline:  # a fresh cluster creates __transaction_state on first use
                    return True
                time.sleep(0.25)

    def close(self) -> None:
        self._a.close()


def _operations(ops: Any) -> frozenset[str] | None:
    if not isinstance(ops, (list, set, frozenset, tuple)):
        return None  # no authorizer, or an old broker: nothing to check
    return frozenset(str(o).upper().rsplit(".", 1)[-1] for o in ops)


def kafka_acl(spec: AclSpec) -> ACL:
    """kafka-python's ACL for one of ours."""
    pattern = ACLResourcePatternType.PREFIXED if spec.prefixed else ACLResourcePatternType.LITERAL
    return ACL(principal=spec.principal, host=spec.host,
               operation=getattr(ACLOperation, _op_name(spec.operation)),
               permission_type=ACLPermissionType.ALLOW,
               resource_pattern=ResourcePattern(_RESOURCE_TYPES[spec.resource], spec.name, pattern))


def _op_name(operation: str) -> str:
    return "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(operation)).upper()


# ---- settings: the project's Connection as kafka-python arguments ----------------------------------------
class _MaskedStr(str):
    """What kafka-python receives as a password: a real str, but a dict of client settings it logs at debug
    level (``Starting KafkaAdminClient with configuration: {...}``) shows it masked."""

    def __repr__(self) -> str:
        return repr("**********")


class _FileTokenProvider(AbstractTokenProvider):
    """OAUTHBEARER: the token is read from a file at every (re)authentication, so a sidecar can refresh it."""

    def __init__(self, path: Any) -> None:
        super().__init__()
        self.path = path

    def token(self) -> str:
        return self.path.read_text().strip()

    def __repr__(self) -> str:
        return f"_FileTokenProvider({str(self.path)!r})"


def _quiet_wire_logs() -> None:
    """kafka-python logs raw request bytes at DEBUG (a SASL PLAIN token holds the password): keep INFO."""
    for name in ("kafka.protocol.parser", "kafka.net.connection"):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.INFO:
            logger.setLevel(logging.INFO)


def security_settings(security: Any) -> dict[str, Any]:
    """kafka-python keyword arguments for a `stream.security.SecuritySettings`."""
    out: dict[str, Any] = {"security_protocol": security.protocol}
    if security.uses_tls:
        out["ssl_context"] = security.ssl_context()
        out["ssl_check_hostname"] = security.ssl_check_hostname
    if security.uses_sasl:
        _quiet_wire_logs()
        out["sasl_mechanism"] = security.sasl_mechanism
        if security.sasl_mechanism == "OAUTHBEARER":
            assert security.sasl_oauth_token_file is not None
            out["sasl_oauth_token_provider"] = _FileTokenProvider(security.sasl_oauth_token_file)
        else:
            assert security.sasl_password is not None
            out["sasl_plain_username"] = security.sasl_username
            out["sasl_plain_password"] = _MaskedStr(security.sasl_password.get_secret_value())
    return out


def client_settings(conn: Any) -> dict[str, Any]:
    """kafka-python keyword arguments for a `stream.clients.Connection` (address, client id, security)."""
    return {"bootstrap_servers": conn.bootstrap_servers.split(","), "client_id": conn.client_id,
            **security_settings(conn.security)}


def raw_consumer(conn: Any, *, max_record_bytes: int = 64 << 20, **overrides: Any) -> KafkaConsumer:
    """kafka-python's own consumer with the project's settings: for tests and benchmarks that want a client
    independent of the seam (the product itself uses `KafkaPythonClient`)."""
    settings = {"group_id": None, **overrides}
    group_id = settings.pop("group_id")
    isolation = settings.pop("isolation_level", "read_committed")
    return KafkaPythonClient(conn)._consumer(client_id=None, group_id=group_id,
                                             max_record_bytes=max_record_bytes,
                                             isolation=isolation, tuning=settings)


def raw_producer(conn: Any, *, max_record_bytes: int = 64 << 20, **overrides: Any) -> KafkaProducer:
    """kafka-python's own producer with the project's settings (see `raw_consumer`)."""
    return KafkaPythonClient(conn).producer(max_record_bytes=max_record_bytes, **overrides)._p


def raw_admin(conn: Any, **overrides: Any) -> KafkaAdminClient:
    """kafka-python's own admin client with the project's settings (see `raw_consumer`)."""
    return KafkaAdminClient(**client_settings(conn), **overrides)


# ---- the client --------------------------------------------------------------------------------------------
class KafkaPythonClient:
    """Builds kafka-python clients for one `stream.clients.Connection`."""

    name = "kafka-python"

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def _base(self, client_id: str | None) -> dict[str, Any]:
        settings = client_settings(self.conn)
        if client_id:
            settings["client_id"] = client_id
        return settings

    def _consumer(self, *, client_id: str | None, group_id: str | None, max_record_bytes: int,
                  isolation: str, tuning: dict[str, Any]) -> KafkaConsumer:
        settings: dict[str, Any] = {
            **self._base(client_id),
            "group_id": group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "isolation_level": isolation,
            "max_partition_fetch_bytes": min(max_record_bytes, FETCH_PARTITION_BYTES),
            "fetch_max_bytes": FETCH_MAX_BYTES,
            "max_poll_records": 500,
            "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
            **tuning,
        }
        with _translated:
            return KafkaConsumer(**settings)

    def group_consumer(self, group_id: str, *, client_id: str | None = None, max_record_bytes: int,
                       session_timeout_s: float = 45.0, instance_id: str | None = None,
                       isolation: str = "read_committed", **tuning: Any) -> _GroupConsumer:
        tuning = {"session_timeout_ms": int(session_timeout_s * 1000),
                  "heartbeat_interval_ms": heartbeat_interval_ms(session_timeout_s), **tuning}
        if instance_id is not None:
            tuning["group_instance_id"] = instance_id
        rejoin_after_s = tuning.pop("rejoin_after_s", REJOIN_AFTER_S)
        return _GroupConsumer(self._consumer(client_id=client_id, group_id=group_id,
                                             max_record_bytes=max_record_bytes, isolation=isolation,
                                             tuning=tuning),
                              rejoin_after_s)

    def assigned_consumer(self, *, client_id: str | None = None, max_record_bytes: int,
                          isolation: str = "read_committed", commit_group: str | None = None,
                          **tuning: Any) -> _AssignedConsumer:
        return _AssignedConsumer(self._consumer(client_id=client_id, group_id=commit_group,
                                                max_record_bytes=max_record_bytes, isolation=isolation,
                                                tuning=tuning))

    def producer(self, *, client_id: str | None = None, max_record_bytes: int,
                 transactional_id: str | None = None, transaction_timeout_s: float = 60.0,
                 **tuning: Any) -> _Producer:
        settings: dict[str, Any] = {
            **self._base(client_id),
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": 5,
            "batch_size": 256 * 1024,
            # A train sample is its rollout sample plus ~300 bytes of statistics and lineage.
            "max_request_size": max_record_bytes + 1024 * 1024,
            "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
            **tuning,
        }
        if transactional_id is not None:
            settings["transactional_id"] = transactional_id
            settings.setdefault("transaction_timeout_ms", int(transaction_timeout_s * 1000))
        with _translated:
            return _Producer(KafkaProducer(**settings), settings if transactional_id is not None else None)

    def admin(self, *, client_id: str | None = None, **tuning: Any) -> _Admin:
        with _translated:
            return _Admin(KafkaAdminClient(**{**self._base(client_id), **tuning}))
