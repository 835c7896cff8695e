"""kafka-python's group and assigned consumers, with the workarounds of its consumer bugs (see the package
doc): parked records of resumed partitions, dropped joins (`RejoinWatchdog`), commits in `on_revoked`."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kafka import KafkaConsumer
from kafka import TopicPartition as KTP
from kafka.consumer.subscription_state import AsyncConsumerRebalanceListener
from kafka.structs import OffsetAndMetadata

from rollout_stream.kafka.errors import BrokerUnavailable
from rollout_stream.kafka.kafka_python.convert import _ktp, _offsets
from rollout_stream.kafka.kafka_python.errors import _translated
from rollout_stream.kafka.seam import Committed, Offsets, Polled, RebalanceListener, TopicPartition
from rollout_stream.logs import log_event

log = logging.getLogger("rollout_stream.kafka")

# No partitions this long while subscribed: the join may have been dropped (see the package doc). Long enough
# that a member idle because there are more members than partitions rarely rejoins (each rejoin rebalances).
REJOIN_AFTER_S = 30.0


class _Consumer:
    """What group and assigned consumers share."""

    def __init__(self, consumer: KafkaConsumer) -> None:
        self._c = consumer

    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        _unpark_resumed(self._c)
        deadline = time.monotonic() + timeout_s
        try:
            with _translated:
                polled: Polled = self._c.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except BrokerUnavailable:
            # kafka-python sometimes raises a refused connection out of poll while the broker is away;
            # librdkafka only reports it. The client reconnects with backoff on its own, so this is a poll
            # that found nothing: it waits out its timeout (no spinning) and the caller's broker watch
            # says the broker is gone.
            time.sleep(max(0.0, deadline - time.monotonic()))
            return {}
        return polled

    def pause(self, partitions: Iterable[TopicPartition]) -> None:
        self._c.pause(*[_ktp(tp) for tp in partitions])

    def resume(self, partitions: Iterable[TopicPartition]) -> None:
        self._c.resume(*[_ktp(tp) for tp in partitions])

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._c.seek(_ktp(tp), offset)

    def position(self, tp: TopicPartition) -> int:
        with _translated:
            position: int = self._c.position(_ktp(tp))
        return position

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
    if fetcher is not None and current is not None and not current:  # spent: nothing left to return from it
        fetcher._next_partition_records = None


class _Listener(AsyncConsumerRebalanceListener):  # type: ignore[misc]  # kafka-python has no type hints
    """Runs the seam's listener on kafka-python's IO thread while the loop waits in poll()."""

    def __init__(self, owner: _GroupConsumer, listener: RebalanceListener) -> None:
        self.owner, self.listener = owner, listener

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self._watched(revoked=True)
        self.owner._revoking = []
        try:
            self.listener.on_revoked({tp.partition for tp in revoked})
        finally:
            pending, self.owner._revoking = self.owner._revoking, None
        for offsets in pending:
            # The blocking commit() may not run on the IO thread; this is the coroutine under it.
            await self.owner._c._coordinator._commit_offsets_sync_async(offsets)

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self._watched(revoked=False)
        self.listener.on_assigned({tp.partition for tp in assigned})

    async def on_partitions_lost(self, lost: Any) -> None:
        self._watched(revoked=True)
        self.listener.on_lost({tp.partition for tp in lost})

    def _watched(self, *, revoked: bool) -> None:
        if self.owner._watchdog is not None:
            self.owner._watchdog.revoked = revoked


class RejoinWatchdog:
    """Call `check(now)` once per poll; it resubscribes after `after_s` without partitions (a dropped
    join). `revoked` is set from the rebalance listener: under the eager protocol kafka-python lists the
    revoked partitions as assigned until the next join completes, so a rejoin dropped after a revocation
    (partitions revoked 21 ms after their assignment, then nothing for a minute) looks assigned."""

    def __init__(self, consumer: Any, topic: str, after_s: float, listener: Any = None) -> None:
        self.consumer, self.topic, self.after_s, self.listener = consumer, topic, after_s, listener
        self.unassigned_since: float | None = None
        self.revoked = False  # by the listener, on kafka-python's IO thread: revoked, not assigned since

    def check(self, now: float, assigned: bool = False) -> float | None:
        """Seconds without partitions when it rejoined just now, else None (`assigned`: the caller knows)."""
        if assigned or (self.consumer.assignment() and not self.revoked):
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
    """`start_fetch` (tuning): (partition bytes, received bytes): fetch that much a partition until that many
    bytes were received, then `max_partition_fetch_bytes`. A large fetch is parsed whole before its first
    record is handed out: at 32 KB records and 16 MiB a fetch, 1.1-1.4 s to a reader's first batch, 0.5-0.8
    s starting at 1 MiB (docs/reader.md)."""

    def __init__(self, consumer: KafkaConsumer, start_fetch: tuple[int, int] | None = None) -> None:
        super().__init__(consumer)
        self._start_for: int | None = None  # bytes still to receive at the start fetch size
        if start_fetch is not None:
            # kafka-python's fetcher reads its own copy of the setting as it builds each request
            self._full_fetch = consumer._fetcher.config["max_partition_fetch_bytes"]
            consumer._fetcher.config["max_partition_fetch_bytes"] = start_fetch[0]
            self._start_for = start_fetch[1]

    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        polled = super().poll(timeout_s, max_records)
        if self._start_for is not None and polled:
            self._start_for -= sum(len(r.value or b"") for records in polled.values() for r in records)
            if self._start_for <= 0:
                self._c._fetcher.config["max_partition_fetch_bytes"] = self._full_fetch
                self._start_for = None
        return polled

    def assign(self, tps: Sequence[TopicPartition]) -> None:
        ktps = [_ktp(tp) for tp in tps]
        self._c.assign(ktps)
        # Assigned the same partitions again, kafka-python keeps their state, paused too: a new assignment
        # fetches, as on librdkafka (its seam resumes what it paused).
        self._c.resume(*ktps)

    def assign_at(self, tp: TopicPartition, offset: int) -> None:
        self.assign_from({tp: offset})

    def assign_from(self, positions: Mapping[TopicPartition, int]) -> None:
        self.assign(list(positions))  # kafka-python fetches in poll(), after the seeks
        for tp, offset in positions.items():
            self.seek(tp, offset)

    def seek_to_beginning(self, tps: Sequence[TopicPartition]) -> None:
        self._c.seek_to_beginning(*[_ktp(tp) for tp in tps])

    def seek_to_end(self, tps: Sequence[TopicPartition]) -> None:
        self._c.seek_to_end(*[_ktp(tp) for tp in tps])
