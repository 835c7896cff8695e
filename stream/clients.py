"""The one place Kafka clients are built: every command gets its consumers, producers and admin here."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from stream.security import SecuritySettings

__all__ = [
    "DEFAULT_KAFKA_PORT",
    "MAX_RECORD_BYTES",
    "BadBootstrap",
    "BrokerUnreachable",
    "Connection",
    "bootstrap_addresses",
    "format_address",
    "make_admin",
    "make_consumer",
    "make_producer",
    "probe",
]

# Samples of 32 MiB must pass end to end (SPEC §4.5); topics and clients are sized for 64 MiB.
MAX_RECORD_BYTES = 64 * 1024 * 1024
FETCH_PARTITION_BYTES = 4 * 1024 * 1024
FETCH_MAX_BYTES = 16 * 1024 * 1024
# Longest wait between reconnect attempts to a broker that is down (the Java client's default is 1 s).
RECONNECT_BACKOFF_MAX_MS = 5000
# The port of an address given without one, as for every Kafka client (Java, librdkafka, kafka-python).
DEFAULT_KAFKA_PORT = 9092


class BadBootstrap(ValueError):
    """A bootstrap address list that is not `host[:port],...`."""


def bootstrap_addresses(text: str) -> list[tuple[str, int]]:
    """(host, port) of each comma-separated address: the one parser of bootstrap addresses.

    A missing port is 9092; an IPv6 host is written in brackets (`[::1]:9092`) and returned without them.
    Raises BadBootstrap naming the address that is wrong.
    """
    out: list[tuple[str, int]] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        if "://" in entry:
            raise BadBootstrap(f"{entry!r}: give host:port, without a scheme")
        if entry.startswith("["):
            host, closed, rest = entry[1:].partition("]")
            if not closed or (rest and not rest.startswith(":")):
                raise BadBootstrap(f"{entry!r} is not [IPv6-address]:port")
            has_port, port_text = bool(rest), rest[1:]
        elif entry.count(":") > 1:
            raise BadBootstrap(f"{entry!r}: write an IPv6 address in brackets, [{entry}]:9092")
        else:
            host, colon, port_text = entry.partition(":")
            has_port = bool(colon)
        if not host:
            raise BadBootstrap(f"{entry!r} has no host")
        if not has_port:
            out.append((host, DEFAULT_KAFKA_PORT))
        elif port_text.isdigit() and 1 <= int(port_text) <= 65535:
            out.append((host, int(port_text)))
        else:
            raise BadBootstrap(f"{entry!r}: the port {port_text!r} is not a TCP port (1-65535)")
    if not out:
        raise BadBootstrap("no address given")
    return out


def format_address(host: str, port: int) -> str:
    """`host:port`, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class Connection:
    """How to reach the cluster: address and security (TLS/SASL, see stream.security), never per command.

    `bootstrap_servers` is normalized at construction (`localhost` becomes `localhost:9092`), so every
    client, message and instance lock spells one cluster one way; a malformed address raises BadBootstrap.
    """

    bootstrap_servers: str
    client_id: str = "rollout-stream"
    security: SecuritySettings = SecuritySettings()

    def __post_init__(self) -> None:
        addresses = bootstrap_addresses(self.bootstrap_servers)
        object.__setattr__(self, "bootstrap_servers", ",".join(format_address(h, p) for h, p in addresses))

    def client_settings(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap_servers.split(","),
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
    for host, port in bootstrap_addresses(conn.bootstrap_servers):
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                return
        except OSError as exc:
            errors.append(f"{format_address(host, port)}: {exc}")
    raise BrokerUnreachable(f"cannot reach Kafka at {conn.bootstrap_servers} ({'; '.join(errors)})")
