"""How to reach the cluster (`Connection`: addresses, client id, security), parsed once; the clients
themselves are built by the Kafka seam's factory, `rollout_stream.kafka.client_for(conn)`."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from rollout_stream.errors import ConfigurationError, RuntimeFailure
from rollout_stream.security import SecuritySettings

__all__ = [
    "DEFAULT_KAFKA_PORT",
    "MAX_RECORD_BYTES",
    "BadBootstrap",
    "BrokerUnreachable",
    "Connection",
    "bootstrap_addresses",
    "format_address",
    "probe",
]

# Samples of 32 MiB must pass end to end (docs/spec.md §4.5); topics and clients are sized for 64 MiB.
MAX_RECORD_BYTES = 64 * 1024 * 1024
# The port of an address given without one, as for every Kafka client (Java, librdkafka, kafka-python).
DEFAULT_KAFKA_PORT = 9092


CLIENTS = ("confluent", "kafka-python")
CLIENT_ENV = "ROLLOUT_STREAM_CLIENT"


def default_client() -> str:
    """The client library to use when none is named: $ROLLOUT_STREAM_CLIENT, else confluent (librdkafka:
    the stage runs several times faster on it than on kafka-python, docs/benchmarks.md). kafka-python stays
    fully supported: `--client kafka-python`."""
    return os.environ.get(CLIENT_ENV, "").strip() or "confluent"


class BadClient(ConfigurationError, ValueError):
    """A client library name that is not one of CLIENTS."""


class BadBootstrap(ConfigurationError, ValueError):
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
    """How to reach the cluster: address and security (TLS/SASL, see rollout_stream.security), never per
    command.

    `bootstrap_servers` is normalized at construction (`localhost` becomes `localhost:9092`), so every
    client, message and instance lock spells one cluster one way; a malformed address raises BadBootstrap.
    """

    bootstrap_servers: str
    client_id: str = "rollout-stream"
    security: SecuritySettings = SecuritySettings()
    # Which Kafka client library implements the seam (rollout_stream.kafka.client_for): --client or
    # ROLLOUT_STREAM_CLIENT choose (default_client()).
    client: str = field(default_factory=default_client)

    def __post_init__(self) -> None:
        if self.client not in CLIENTS:
            raise BadClient(f"the Kafka client must be {' or '.join(CLIENTS)}, got {self.client!r}")
        addresses = bootstrap_addresses(self.bootstrap_servers)
        object.__setattr__(self, "bootstrap_servers", ",".join(format_address(h, p) for h, p in addresses))


class BrokerUnreachable(RuntimeFailure, ConnectionError):
    """No bootstrap server accepted a TCP connection."""

    advice = "is the broker running?"


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
