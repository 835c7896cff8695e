"""The seam on kafka-python (the client the design names). Every workaround of its bugs lives in this package:

* a partition's fetched records parked while it was paused came back only while the fetcher's in-line slot
  was `None`, and a drained slot keeps its spent object (`consumer._unpark_resumed`; a reader stalled for
  good);
* a group join that completes while `poll()` times out can be dropped: the member owns partitions it never
  receives, or keeps listing partitions it was revoked (`consumer.RejoinWatchdog`: rejoin after
  `REJOIN_AFTER_S` without partitions, revoked ones not counted);
* rebalance callbacks run on its IO thread as coroutines, where the blocking `commit()` may not run
  (`consumer._Listener` collects the commits of `on_revoked` and awaits the coroutine under `commit()`);
* fetch positions and high watermarks are only readable without a network call from private state
  (`consumer._Consumer`);
* a send whose topic metadata the broker refused fails its future at once without failing the transaction
  (committing would lose that record): `send` raises what the client already knows failed (`producer.py`).

The parts: `settings.py` (a Connection as kafka-python arguments), `errors.py` (`translate`), `convert.py`,
`consumer.py`, `producer.py`, `admin.py` (and `kafka_acl`), `preflight.py` (the connection check); here,
`KafkaPythonClient`, which builds them, and the `raw_*` clients for tests and benchmarks.
"""

from __future__ import annotations

from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from rollout_stream.clients import MAX_RECORD_BYTES, Connection
from rollout_stream.kafka.kafka_python.admin import _Admin, kafka_acl
from rollout_stream.kafka.kafka_python.consumer import (
    REJOIN_AFTER_S,
    RejoinWatchdog,
    _AssignedConsumer,
    _GroupConsumer,
)
from rollout_stream.kafka.kafka_python.errors import _translated, translate
from rollout_stream.kafka.kafka_python.producer import _Producer
from rollout_stream.kafka.kafka_python.settings import client_settings, security_settings
from rollout_stream.kafka.seam import heartbeat_interval_ms

__all__ = ["KafkaPythonClient", "RejoinWatchdog", "client_settings", "kafka_acl", "raw_admin", "raw_consumer",
           "raw_producer", "security_settings", "translate"]

# Fetch sizes bound the client's buffers, not the record size: since KIP-74 (fetch v3) the broker returns a
# first record batch larger than these limits whole, so 64 MiB samples still pass. Large limits only let
# one fetch hold ~50 MiB of raw response next to the records copied out of it (the peak RSS of 32K-token
# windows with larger and with these limits: docs/benchmarks.md).
FETCH_PARTITION_BYTES = 4 * 1024 * 1024
FETCH_MAX_BYTES = 16 * 1024 * 1024
# kafka-python backs off up to 30 s between reconnects; after a broker restart that is 30 s of idling.
RECONNECT_BACKOFF_MAX_MS = 5000


def raw_consumer(conn: Connection, *, max_record_bytes: int = MAX_RECORD_BYTES,
                 **overrides: Any) -> KafkaConsumer:
    """kafka-python's own consumer with the project's settings: for tests and benchmarks that want a client
    independent of the seam (the product itself uses `KafkaPythonClient`)."""
    settings = {"group_id": None, **overrides}
    group_id = settings.pop("group_id")
    isolation = settings.pop("isolation_level", "read_committed")
    return KafkaPythonClient(conn)._consumer(client_id=None, group_id=group_id,
                                             max_record_bytes=max_record_bytes,
                                             isolation=isolation, tuning=settings)


def raw_producer(conn: Connection, *, max_record_bytes: int = MAX_RECORD_BYTES,
                 **overrides: Any) -> KafkaProducer:
    """kafka-python's own producer with the project's settings (see `raw_consumer`)."""
    return KafkaPythonClient(conn).producer(max_record_bytes=max_record_bytes, **overrides)._p


def raw_admin(conn: Connection, **overrides: Any) -> KafkaAdminClient:
    """kafka-python's own admin client with the project's settings (see `raw_consumer`)."""
    return KafkaAdminClient(**client_settings(conn), **overrides)


# ---- the client --------------------------------------------------------------------------------------------
class KafkaPythonClient:
    """Builds kafka-python clients for one Connection."""

    name = "kafka-python"

    def __init__(self, conn: Connection) -> None:
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
            # As librdkafka's consumers (fetch.wait.max.ms): the broker holds an empty fetch this long, and
            # a reader's view of where a quiet partition ends is that old (500 ms by default).
            "fetch_max_wait_ms": 100,
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
        start_fetch = tuning.pop("start_fetch", None)
        return _AssignedConsumer(self._consumer(client_id=client_id, group_id=commit_group,
                                                max_record_bytes=max_record_bytes, isolation=isolation,
                                                tuning=tuning), start_fetch)

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
