"""librdkafka's configuration: the properties for a `rollout_stream.clients.Connection`, kafka-python's tuning
names in librdkafka's, and its logger (repeated lines filtered)."""

from __future__ import annotations

import logging
import time
from typing import Any

from rollout_stream.clients import Connection


class _OncePerInterval(logging.Filter):
    """librdkafka repeats a failing connect every backoff (tens a second while a broker is down): one line of
    each kind per `interval_s`; the worker's broker watch says when the broker is gone and back."""

    def __init__(self, interval_s: float = 10.0) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = record.getMessage().split(" ", 1)[0]
        now = time.monotonic()
        if now - self.last.get(key, -self.interval_s) < self.interval_s:
            return False
        self.last[key] = now
        return True


librdkafka_log = logging.getLogger("rollout_stream.kafka.librdkafka")
librdkafka_log.addFilter(_OncePerInterval())

TIMEOUT_S = 30.0  # metadata and offset queries


def settings_for(conn: Connection, client_id: str | None = None) -> dict[str, Any]:
    """librdkafka properties for a Connection (address, client id, TLS/SASL)."""
    sec = conn.security
    out: dict[str, Any] = {
        "bootstrap.servers": conn.bootstrap_servers,
        "client.id": client_id or conn.client_id,
        "security.protocol": sec.protocol.lower(),
        "logger": librdkafka_log,
        # librdkafka re-bootstraps when every broker it knows is down at once (one broker restarting, a whole
        # cluster restarting), and the re-bootstrap decommissions the brokers it knew: a coordinator cached
        # on a decommissioned broker is never asked for again (librdkafka#5511, fixed after 2.16), so the
        # transactional producer's send_offsets_to_transaction hung until replaced and the group consumer
        # found no coordinator for 45 s and more. Without it the known brokers stay, reconnecting with
        # backoff, as the Java client did before 4.0. What is lost: a client whose brokers all come back at
        # new addresses cannot find them from bootstrap.servers (a restart of the process does).
        "metadata.recovery.strategy": "none",
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
            assert path is not None  # SecuritySettings requires it for OAUTHBEARER

            def token(_config: str) -> tuple[str, float]:
                # Read at every (re)authentication, so a sidecar can refresh the file.
                return path.read_text().strip(), time.time() + 300

            out["oauth_cb"] = token
        else:
            assert sec.sasl_password is not None  # SecuritySettings requires it for the other mechanisms
            out["sasl.username"] = sec.sasl_username
            out["sasl.password"] = sec.sasl_password.get_secret_value()
    return out


# kafka-python spellings some callers pass as tuning, in librdkafka's names.
_NAMES = {"linger_ms": "linger.ms", "batch_size": "batch.size", "fetch_max_wait_ms": "fetch.wait.max.ms",
          "max_partition_fetch_bytes": "max.partition.fetch.bytes", "fetch_max_bytes": "fetch.max.bytes",
          "max_poll_records": None, "request_timeout_ms": "request.timeout.ms", "bootstrap_timeout_ms": None,
          "ssl_context": None, "ssl_check_hostname": None,
          # RolloutProducer(..., compression_type=...) (docs/compression.md): librdkafka refuses this name
          "compression_type": "compression.type"}


def _librdkafka_names(tuning: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in tuning.items():
        name = _NAMES.get(key, key)
        if name is not None:
            out[name] = value
    return out
