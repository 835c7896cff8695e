"""Fail fast, with the cause, when a client cannot connect: before any consumer or producer exists.

kafka-python retries a refused TLS handshake or SASL login until its timeout and then reports only
"Unable to bootstrap". This check walks the same steps once, on a blocking socket, and names what failed:

    TCP connect ─► TLS handshake ─► ApiVersions ─► SaslHandshake ─► SaslAuthenticate ─► Metadata
    unreachable    untrusted,       no TLS on a     mechanism not    wrong user or       listener wants
                   expired, wrong   TLS listener     offered          password            SASL / TLS
                   host, client
                   cert refused

The first bootstrap server that answers decides; unreachable servers are skipped.
"""

from __future__ import annotations

import socket
import ssl
import time
from typing import Any

from kafka.net.sasl import get_sasl_mechanism
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from rollout_stream.clients import BrokerUnreachable, Connection, bootstrap_addresses, format_address
from rollout_stream.kafka.errors import (
    AuthenticationRefused,
    ConnectionCheckFailed,
    ListenerMismatch,
    TlsRefused,
)
from rollout_stream.kafka.kafka_python.settings import security_settings
from rollout_stream.security import SecuritySettings

__all__ = [
    "AuthenticationRefused",
    "ConnectionCheckFailed",
    "ListenerMismatch",
    "TlsRefused",
    "check_connection",
]

# OpenSSL X509_V_ERR_* codes worth their own sentence
_EXPIRED, _NOT_YET_VALID, _HOSTNAME_MISMATCH = 10, 9, 62
_UNTRUSTED = {2, 18, 19, 20, 21, 27}


class _Closed(Exception):
    """The broker closed the connection before answering."""


def check_connection(conn: Connection, timeout_s: float = 10.0) -> None:
    """Return when one bootstrap server accepts this client up to a Metadata answer; raise otherwise.

    Raises BrokerUnreachable (no server accepts TCP) or a ConnectionCheckFailed subclass.
    """
    security = conn.security
    unreachable: list[str] = []
    for host, port in bootstrap_addresses(conn.bootstrap_servers):
        server = format_address(host, port)
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            unreachable.append(f"{server}: {exc}")
            continue
        try:
            _Session(sock, host, server, security, timeout_s).run()
            return
        finally:
            sock.close()
    raise BrokerUnreachable(f"cannot reach Kafka at {conn.bootstrap_servers} ({'; '.join(unreachable)})")


class _Session:
    def __init__(
        self, sock: socket.socket, host: str, server: str, security: SecuritySettings, timeout_s: float
    ) -> None:
        self.sock: Any = sock
        self.host, self.server, self.security = host, server, security
        self.deadline = time.monotonic() + timeout_s
        self.parser = KafkaProtocol(client_id="rollout-stream-preflight")
        self.step = "connect"

    def run(self) -> None:
        s = self.security
        if s.uses_tls:
            self._tls()
        try:
            self.step = "ApiVersions"
            self._call(ApiVersionsRequest(version=0))
        except _Closed:
            raise self._closed_on_first_request() from None
        if s.uses_sasl:
            self._sasl()
        self.step = "Metadata"
        try:
            self._call(MetadataRequest(version=1, topics=[]))
        except _Closed:
            if not s.uses_sasl:
                raise ListenerMismatch(
                    f"{self.server} closed the connection after the first request: "
                    "the listener requires SASL "
                    f"authentication, but the security protocol is {s.protocol} (use "
                    f"{'SASL_SSL' if s.uses_tls else 'SASL_PLAINTEXT'} with --sasl-mechanism and a user)"
                ) from None
            raise ConnectionCheckFailed(
                f"{self.server} closed the connection after a successful login"
            ) from None

    # -- TLS ----------------------------------------------------------------------------------------
    def _tls(self) -> None:
        self.step = "TLS handshake"
        ctx = self.security.ssl_context()
        try:
            self.sock = ctx.wrap_socket(self.sock, server_hostname=self.host)
        except ssl.SSLCertVerificationError as exc:
            raise self._verify_failed(exc) from None
        except ssl.SSLError as exc:
            raise self._tls_failed(exc) from None
        except TimeoutError:
            raise ListenerMismatch(
                f"no TLS answer from {self.server} within the timeout: is it a TLS listener? "
                f"(security protocol {self.security.protocol})"
            ) from None
        except OSError as exc:
            raise ListenerMismatch(
                f"TLS handshake with {self.server} failed ({exc.strerror or exc}): the "
                f"listener does not speak TLS? (security protocol {self.security.protocol})"
            ) from None

    def _verify_failed(self, exc: ssl.SSLCertVerificationError) -> TlsRefused:
        code, reason = exc.verify_code, exc.verify_message
        ca = str(self.security.ssl_cafile) if self.security.ssl_cafile else "the system CAs"
        if code == _EXPIRED:
            return TlsRefused(
                f"TLS: the certificate {self.server} presented has expired (certificate verify "
                f"failed: {reason}); the broker needs a renewed certificate"
            )
        if code == _NOT_YET_VALID:
            return TlsRefused(
                f"TLS: the certificate {self.server} presented is not valid yet ({reason}): check "
                "the clocks of this machine and the broker"
            )
        if code == _HOSTNAME_MISMATCH:
            return TlsRefused(
                f"TLS: the certificate {self.server} presented is not issued for {self.host!r} "
                f"({reason}): connect with a host name the certificate lists, or turn hostname "
                "verification off (--no-ssl-check-hostname; insecure)"
            )
        if code in _UNTRUSTED:
            return TlsRefused(
                f"TLS: the certificate {self.server} presented is not signed by a trusted CA "
                f"({reason}; trusted: {ca}): pass the CA that signed the broker certificate with "
                "--ssl-cafile"
            )
        return TlsRefused(f"TLS: certificate verify failed for {self.server}: {reason} (trusted: {ca})")

    def _tls_failed(self, exc: ssl.SSLError) -> ConnectionCheckFailed:
        reason = (exc.reason or str(exc)).upper()
        if (
            "CERTIFICATE_REQUIRED" in reason
            or "HANDSHAKE_FAILURE" in reason
            and not self.security.ssl_certfile
        ):
            return TlsRefused(
                f"TLS: {self.server} requires a client certificate (mTLS): pass --ssl-certfile "
                "and --ssl-keyfile"
            )
        if any(
            word in reason
            for word in (
                "BAD_CERTIFICATE",
                "UNKNOWN_CA",
                "CERTIFICATE_EXPIRED",
                "CERTIFICATE_UNKNOWN",
                "CERTIFICATE_REVOKED",
                "UNSUPPORTED_CERTIFICATE",
                "DECRYPT_ERROR",
            )
        ):
            return TlsRefused(
                f"TLS: {self.server} refused our client certificate {str(self.security.ssl_certfile)!r} "
                f"({exc.reason}): it must be valid and signed by a CA the broker trusts"
            )
        if any(
            word in reason
            for word in (
                "WRONG_VERSION_NUMBER",
                "RECORD_LAYER_FAILURE",
                "UNEXPECTED_EOF",
                "PACKET_LENGTH_TOO_LONG",
                "UNKNOWN_PROTOCOL",
                "EOF",
            )
        ):
            return ListenerMismatch(
                f"TLS handshake with {self.server} failed ({exc.reason}): the listener does "
                f"not speak TLS; use security protocol "
                f"{'SASL_PLAINTEXT' if self.security.uses_sasl else 'PLAINTEXT'}?"
            )
        return TlsRefused(f"TLS handshake with {self.server} failed: {exc.reason or exc}")

    # -- Kafka requests -----------------------------------------------------------------------------
    def _call(self, request: Any) -> Any:
        self.parser.send_request(request)
        try:
            self.sock.settimeout(max(0.1, self.deadline - time.monotonic()))
            self.sock.sendall(self.parser.send_bytes())
            while True:
                data = self.sock.recv(65536)
                if not data:
                    raise _Closed()
                try:
                    responses = self.parser.receive_bytes(data)
                except Exception:  # a frame that is not Kafka: e.g. a TLS alert on a plaintext connection
                    raise _Closed() from None
                if responses:
                    return responses[0][1]
        except ssl.SSLError as exc:  # TLS 1.3: a refused client certificate shows up at the first read
            raise self._tls_failed(exc) from None
        except (ConnectionResetError, BrokenPipeError):
            raise _Closed() from None
        except TimeoutError:
            raise ConnectionCheckFailed(
                f"no answer from {self.server} within the timeout ({self.step}): "
                f"does the listener speak {self.security.protocol}?"
            ) from None

    def _closed_on_first_request(self) -> ConnectionCheckFailed:
        if not self.security.uses_tls:
            return ListenerMismatch(
                f"{self.server} closed the connection on the first request: "
                "the listener probably requires TLS "
                f"(security protocol SSL or SASL_SSL, with --ssl-cafile), but the security protocol is "
                f"{self.security.protocol}"
            )
        return ConnectionCheckFailed(f"{self.server} closed the connection on the first request")

    def _sasl(self) -> None:
        s = self.security
        user = f"user {s.sasl_username!r}" if s.sasl_username else "the OAUTHBEARER token"
        self.step = "SaslHandshake"
        try:
            response = self._call(SaslHandshakeRequest(version=1, mechanism=s.sasl_mechanism))
        except _Closed:
            raise ListenerMismatch(
                f"{self.server} closed the connection at the SASL handshake: the listener does "
                f"not use SASL (security protocol {'SSL' if s.uses_tls else 'PLAINTEXT'}?)"
            ) from None
        if response.error_code == 33:  # UNSUPPORTED_SASL_MECHANISM
            offered = ", ".join(response.mechanisms) or "none"
            raise AuthenticationRefused(
                f"{self.server} does not offer SASL mechanism {s.sasl_mechanism} "
                f"(it offers: {offered}): set --sasl-mechanism"
            )
        if response.error_code == 34:  # ILLEGAL_SASL_STATE
            raise ListenerMismatch(f"{self.server} does not expect a SASL login on this listener")
        if response.error_code:
            raise AuthenticationRefused(
                f"SASL handshake with {self.server} failed (error {response.error_code})"
            )
        self.step = "SaslAuthenticate"
        mechanism = get_sasl_mechanism(s.sasl_mechanism)(host=self.host, **security_settings(s))
        refused = f"authentication failed for {user} with {s.sasl_mechanism} at {self.server}"
        hint = (
            "check the user name and password (--sasl-password-file, KAFKA_SASL_PASSWORD)"
            if s.sasl_mechanism != "OAUTHBEARER"
            else "check the token in --sasl-oauth-token-file"
        )
        while not mechanism.is_done():
            try:
                response = self._call(SaslAuthenticateRequest(version=1, auth_bytes=mechanism.auth_bytes()))
            except _Closed:
                raise AuthenticationRefused(f"{refused} (the broker closed the connection): {hint}") from None
            if response.error_code:
                detail = (response.error_message or f"error {response.error_code}").rstrip(".")
                raise AuthenticationRefused(f"{refused}: {detail}; {hint}")
            mechanism.receive(response.auth_bytes)
        if not mechanism.is_authenticated():
            raise AuthenticationRefused(
                f"{refused}: the broker's answer did not prove it knows the credentials; "
                "is this the right cluster?"
            )
