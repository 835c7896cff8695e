"""librdkafka's group consumer: the rebalance callbacks, partitions kept through an eager rebalance, and the
replacement of a static member that fenced itself (librdkafka#3437)."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as RdTP

from rollout_stream.kafka.confluent.consumer import _Consumer
from rollout_stream.kafka.confluent.errors import _translated
from rollout_stream.kafka.seam import RebalanceListener, TopicPartition

log = logging.getLogger("rollout_stream.kafka")

# A member fenced again this soon after rejoining for a fence is fenced by another live member with its id.
REFENCED_WITHIN_S = 60.0


class _GroupConsumer(_Consumer):
    def __init__(self, consumer: Consumer, settings: dict[str, Any]) -> None:
        super().__init__(consumer)
        self._settings = settings  # to replace a consumer librdkafka fenced by mistake
        self._subscription: tuple[str, RebalanceListener] | None = None
        self._rejoined_at: float | None = None  # when a fence last replaced the consumer
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
            self._forget((tp.topic, tp.partition) for tp in tps)

        def lost(_c: Any, tps: list[RdTP]) -> None:
            if mine != self._consumers:
                return
            listener.on_lost({tp.partition for tp in tps})
            for tp in tps:
                self._kept.pop((tp.topic, tp.partition), None)  # its state is gone: restored if it comes back
            self._forget((tp.topic, tp.partition) for tp in tps)

        with _translated:
            self._c.subscribe([topic], on_assign=assigned, on_revoke=revoked, on_lost=lost)

    def _recovered(self, error: KafkaError) -> bool:
        # librdkafka#3437: a static member can be fenced "by another consumer with the same group.instance.id"
        # that is its own retried join, a fatal error: after its session timed out when a coordinator's broker
        # died, and on a worker restarted just as a coordinator's broker stopped (a 3-node chaos run). The
        # consumer is replaced and rejoins with the same id. Another live worker given the same id fences this
        # one's transactions too (the worker then stops naming the id), and a second fence within
        # REFENCED_WITHIN_S of a rejoin is not recovered: two members taking one id from each other stop.
        # consume() hands the fencing over as an event whose code is _FATAL and whose fatal flag is unset
        fatal = error.fatal() or error.code() == KafkaError._FATAL
        fenced = (error.code() == KafkaError.FENCED_INSTANCE_ID
                  or (fatal and "group.instance.id" in error.str()))
        now = time.monotonic()
        if not fenced or self._subscription is None or (
                self._rejoined_at is not None and now - self._rejoined_at < REFENCED_WITHIN_S):
            return False
        log.warning("the group fenced this consumer's instance id (librdkafka#3437 fences a static member by "
                    "its own retried join): rejoining with a new consumer and the same instance id")
        self._rejoined_at = now
        # The listener hears of the loss first: librdkafka may not have served the lost callback yet.
        topic, listener = self._subscription
        if lost_now := {tp.partition for tp in self._c.assignment()}:
            listener.on_lost(lost_now)
        self._consumers += 1  # the old consumer's callbacks go nowhere from now on
        try:
            self._c.close()
        except (KafkaException, RuntimeError):  # fatal already: what it says on closing is moot
            pass
        with _translated:
            self._c = Consumer(self._settings)
        self._forget_all()
        self._kept.clear()
        self.subscribe(topic, listener)
        return True

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(tp.topic, tp.partition) for tp in self._c.assignment()}

    def connection_count(self) -> int | None:
        return self.connections
