"""The project's Connection and security settings as kafka-python arguments: passwords masked in its logs,
OAUTHBEARER tokens read from a file, raw request bytes kept out of its debug logs."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kafka.net.sasl.oauth import AbstractTokenProvider

from rollout_stream.clients import Connection
from rollout_stream.security import SecuritySettings


class _MaskedStr(str):
    """What kafka-python receives as a password: a real str, but a dict of client settings it logs at debug
    level (``Starting KafkaAdminClient with configuration: {...}``) shows it masked."""

    def __repr__(self) -> str:
        return repr("**********")


class _FileTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # kafka-python has no type hints
    """OAUTHBEARER: the token is read from a file at every (re)authentication, so a sidecar can refresh it."""

    def __init__(self, path: Path) -> None:
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


def security_settings(security: SecuritySettings) -> dict[str, Any]:
    """kafka-python keyword arguments for a SecuritySettings."""
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


def client_settings(conn: Connection) -> dict[str, Any]:
    """kafka-python keyword arguments for a Connection (address, client id, security)."""
    return {"bootstrap_servers": conn.bootstrap_servers.split(","), "client_id": conn.client_id,
            **security_settings(conn.security)}
