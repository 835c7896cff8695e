"""The one place Kafka clients are built: every command gets its consumers, producers and admin here."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from stream.security import SecuritySettings

__all__ = ["BrokerUnreachable", "probe", "Connection", "make_consumer", "make_producer", "make_admin", "MAX_RECORD_BYTES"]

# Samples of 32 MiB must pass end to end (SPEC §4.5); topics and clients are sized for 64 MiB.
MAX_RECORD_BYTES = 64 * 1024 * 1024
FETCH_PARTITION_BYTES = 4 * 1024 * 1024
FETCH_MAX_BYTES = 16 * 1024 * 1024
# Longest wait between reconnect attempts to a broker that is down (the Java client's default is 1 s).
RECONNECT_BACKOFF_MAX_MS = 5000


@dataclass(frozen=True, slots=True)
class Connection:
    """How to reach the cluster: address and security (TLS/SASL, see stream.security), never per command."""

    bootstrap_servers: str
    client_id: str = "rollout-stream"
    security: SecuritySettings = SecuritySettings()

    def client_settings(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()],
            "client_id": self.client_id,
            **self.security.client_settings(),
        }


def make_consumer(conn: Connection, *, max_record_bytes: int = MAX_RECORD_BYTES, **overrides: Any) -> KafkaConsumer:
    settings: dict[str, Any] = {
        **conn.client_settings(),
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": "read_committed",
        # Fetch sizes bound the client's buffers, not the record size: since KIP-74 (fetch v3) the broker
        # returns a first record batch larger than these limits whole, so 64 MiB samples still pass. Large
        # limits only let one fetch hold ~50 MiB of raw response next to the records copied out of it
        # (measured: peak RSS 1.71 -> 1.25 x open-window bytes for 32K-token windows; docs/benchmarks.md).
        "max_partition_fetch_bytes": min(max_record_bytes, FETCH_PARTITION_BYTES),
        "fetch_max_bytes": FETCH_MAX_BYTES,
        "max_poll_records": 500,
        # kafka-python backs off up to 30 s between reconnects; after a broker restart that is 30 s of idling.
        "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
    }
    settings.update(overrides)
    return KafkaConsumer(**settings)


def make_producer(conn: Connection, *, max_record_bytes: int = MAX_RECORD_BYTES, **overrides: Any) -> KafkaProducer:
    settings: dict[str, Any] = {
        **conn.client_settings(),
        "acks": "all",
        "enable_idempotence": True,
        "linger_ms": 5,
        "batch_size": 256 * 1024,
        # A train sample is its rollout sample plus ~300 bytes of statistics and lineage.
        "max_request_size": max_record_bytes + 1024 * 1024,
        "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
    }
    settings.update(overrides)
    return KafkaProducer(**settings)


def make_admin(conn: Connection, **overrides: Any) -> KafkaAdminClient:
    return KafkaAdminClient(**conn.client_settings(), **overrides)


class BrokerUnreachable(ConnectionError):
    """No bootstrap server accepted a TCP connection."""


def probe(conn: Connection, timeout_s: float = 5.0) -> None:
    """Fail fast, with the address in the message, when no bootstrap server answers."""
    errors = []
    for server in conn.client_settings()["bootstrap_servers"]:
        host, _, port = server.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]") or "localhost", int(port)), timeout=timeout_s):
                return
        except (OSError, ValueError) as exc:
            errors.append(f"{server}: {exc}")
    raise BrokerUnreachable(f"cannot reach Kafka at {conn.bootstrap_servers} ({'; '.join(errors)})")
