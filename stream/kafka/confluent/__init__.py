"""The seam on confluent-kafka (librdkafka): the default client, for its speed and static membership.

What librdkafka does differently, handled in this package and nowhere else:

* rebalance callbacks run inside `consume()` on the calling thread (what the seam promises), with the eager
  `range` assignor so `on_assigned` gets the member's whole assignment, as kafka-python's does
  (`group_consumer.py`);
* a message is an object of methods (`topic()`, `offset()`, ...): records are handed out as light tuples with
  the seam's attribute names (`consumer.Rec`);
* its default partitioner hashes keys with CRC32: producers use `murmur2_random`, Java's rule, so a group
  lands in the same partition whichever client produced it (`ConfluentClient.producer`, here);
* delivery reports arrive through `poll()`/`flush()` callbacks: each send gets a future they complete
  (`producer.py`);
* open broker connections are only known from its statistics (one JSON document a second).

The parts: `settings.py` (a Connection as librdkafka properties, its logger), `errors.py` (`translate`),
`convert.py`, `consumer.py`, `group_consumer.py`, `assigned_consumer.py`, `producer.py`, `admin.py`; here,
`ConfluentClient`, which builds them.
"""

from __future__ import annotations

import json
from typing import Any

from confluent_kafka import Consumer
from confluent_kafka import Producer as _RdProducer
from confluent_kafka.admin import AdminClient

from rollout_stream.clients import Connection
from rollout_stream.kafka.confluent.admin import _Admin
from rollout_stream.kafka.confluent.assigned_consumer import _AssignedConsumer
from rollout_stream.kafka.confluent.errors import _translated, translate
from rollout_stream.kafka.confluent.group_consumer import _GroupConsumer
from rollout_stream.kafka.confluent.producer import _Producer
from rollout_stream.kafka.confluent.settings import _librdkafka_names, settings_for
from rollout_stream.kafka.seam import heartbeat_interval_ms

__all__ = ["ConfluentClient", "settings_for", "translate"]

FETCH_PARTITION_BYTES = 4 * 1024 * 1024
FETCH_MAX_BYTES = 16 * 1024 * 1024
# Once its local queue holds queued.min.messages (100,000) or queued.max.messages.kbytes (64 MiB), librdkafka
# fetches a partition again only after this pause, 1 s by default: a consumer a little slower than its
# fetcher read a backlog in bursts with idle seconds between (python -m bench, one broker: the stage's
# 32K-token drains 1,200 -> 3,000 samples/s, its 256-token ones 37,000 -> 75,000, the passthrough's
# 44,000 -> 238,000).
FETCH_QUEUE_BACKOFF_MS = 20


class ConfluentClient:
    """Builds librdkafka clients for one Connection."""

    name = "confluent"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def _consumer_settings(self, client_id: str | None, max_record_bytes: int, isolation: str,
                           tuning: dict[str, Any]) -> dict[str, Any]:
        return {
            **settings_for(self.conn, client_id),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            # The end-of-partition events say where the fetcher reached the end: past transaction markers,
            # which the position alone does not pass after a pause and resume (the reader's merge stalled).
            "enable.partition.eof": True,
            "max.partition.fetch.bytes": min(max_record_bytes, FETCH_PARTITION_BYTES),
            "fetch.max.bytes": FETCH_MAX_BYTES,
            "receive.message.max.bytes": max(max_record_bytes, FETCH_MAX_BYTES) + 1024 * 1024,
            "reconnect.backoff.max.ms": 5000,
            # An offset query waits behind the connection's in-flight fetch, which the broker holds for up to
            # this long when there is nothing new: 500 ms (the default) per query made restores slow.
            "fetch.wait.max.ms": 100,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
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

        settings = {
            **self._consumer_settings(client_id, max_record_bytes, isolation, _librdkafka_names(tuning)),
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
            consumer = _GroupConsumer(Consumer(settings), settings)
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
            # A commit made right after the last one finds the broker still writing that one's markers and is
            # told CONCURRENT_TRANSACTIONS. librdkafka retries AddOffsetsToTxn after retry.backoff.ms, 100 ms
            # by default and doubling, which held up such commits; shorter backoffs held up fewer
            # (docs/benchmarks.md). Produce retries are idempotent here.
            settings.setdefault("retry.backoff.ms", 10)
            settings.setdefault("retry.backoff.max.ms", 50)
        with _translated:
            return _Producer(_RdProducer(settings), settings if transactional_id is not None else None)

    def admin(self, *, client_id: str | None = None, **tuning: Any) -> _Admin:
        settings = {**settings_for(self.conn, client_id), **_librdkafka_names(tuning)}
        with _translated:
            return _Admin(AdminClient(settings), settings)
