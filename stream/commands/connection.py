"""Connection options every Kafka command shares: security flags and env vars, and one checked Connection.

Adopt them in a command with two lines:

    @grouped_options
    def tail(bootstrap_servers: Bootstrap = None, ..., security: SecurityOptions = NO_SECURITY_OPTIONS):
        conn = connection_from_options(bootstrap_servers, security, local=running_local_broker)

`SecurityOptions` is an option group (rollout_stream.commands.options): `grouped_options` shows typer its
flags and hands them to the function as one `SecurityOptions`. `connection_from_options` builds the settings
(flag > env var > --kafka-config file), resolves the bootstrap address, and checks TCP, TLS and SASL once, so
a wrong password or an untrusted certificate ends the command at once with one line, not a retry loop.

Given no address, a command fails with `NO_ADDRESS` unless it hands in where else to look (`local=`: the
lookups of rollout_stream.commands.local). This module never reaches the local development broker itself, so
`run`, which imports it and passes no `local`, cannot start one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import typer

from rollout_stream.client_properties import load_properties
from rollout_stream.clients import CLIENT_ENV, BadBootstrap, Connection, default_client
from rollout_stream.commands.options import fail, option_group
from rollout_stream.errors import described
from rollout_stream.kafka import check_connection
from rollout_stream.security import ENV_VARS, SASL_MECHANISMS, SECURITY_PROTOCOLS, SecretStr, SecuritySettings

__all__ = [
    "NO_ADDRESS",
    "NO_SECURITY_OPTIONS",
    "LocalAddress",
    "SecurityOptions",
    "connection_from_options",
    "security_from_options",
]

_PANEL = "Connection security (TLS / SASL)"

NO_ADDRESS = (
    "no Kafka address: pass --bootstrap-servers HOST:PORT (or set KAFKA_BOOTSTRAP_SERVERS); "
    "for a local broker run `rollout-stream demo` or `rollout-stream broker start`"
)

# Where a command given no address looks for one: an address, or None (then NO_ADDRESS).
LocalAddress = Callable[[SecuritySettings], str | None]


def _opt(flag: str, field: str, help: str, **kw: Any) -> Any:
    return typer.Option(
        flag, envvar=ENV_VARS.get(field), help=help, show_default=False, rich_help_panel=_PANEL, **kw
    )


# None defaults everywhere, so an unset flag falls back to its env var, then to --kafka-config, then to the
# SecuritySettings default.
@option_group
@dataclass(frozen=True)
class SecurityOptions:
    """The raw values of the connection and security flags of one command invocation (not validated yet)."""

    client: Annotated[
        str | None,
        typer.Option(
            "--client",
            envvar=CLIENT_ENV,
            show_default=False,
            rich_help_panel=_PANEL,
            help="Kafka client library: confluent (librdkafka, the default: a higher ceiling) or "
            "kafka-python (pure Python, the design's client); see docs/clients.md.",
        ),
    ] = None

    kafka_config: Annotated[
        Path | None,
        typer.Option(
            "--kafka-config",
            envvar="KAFKA_CONFIG_FILE",
            show_default=False,
            rich_help_panel=_PANEL,
            help="Client properties file (Java client or librdkafka keys: bootstrap.servers, "
            "security.protocol, sasl.mechanism, sasl.jaas.config, sasl.username, sasl.password.file, "
            "ssl.cafile / ssl.truststore.location "
            "(PEM), ...). Flags and env vars override it.",
        ),
    ] = None
    security_protocol: Annotated[
        str | None,
        _opt("--security-protocol", "protocol", f"{', '.join(SECURITY_PROTOCOLS)} (default: PLAINTEXT)"),
    ] = None
    sasl_mechanism: Annotated[
        str | None, _opt("--sasl-mechanism", "sasl_mechanism", f"{', '.join(SASL_MECHANISMS)}.")
    ] = None
    sasl_username: Annotated[str | None, _opt("--sasl-username", "sasl_username", "SASL user name.")] = None
    # parser: the value is a SecretStr from the moment it is read, so nothing can print it by accident.
    sasl_password: Annotated[
        SecretStr | None,
        _opt(
            "--sasl-password",
            "sasl_password",
            "SASL password. Prefer --sasl-password-file or the environment "
            "variable: a flag is visible in the process list.",
            metavar="<str>",
            parser=SecretStr,
        ),
    ] = None
    sasl_password_file: Annotated[
        Path | None,
        _opt("--sasl-password-file", "sasl_password_file", "File holding the SASL password (one line)."),
    ] = None
    sasl_oauth_token_file: Annotated[
        Path | None,
        _opt(
            "--sasl-oauth-token-file",
            "sasl_oauth_token_file",
            "OAUTHBEARER: file holding the token; read at every login, so a sidecar may refresh it.",
        ),
    ] = None
    ssl_cafile: Annotated[
        Path | None,
        _opt(
            "--ssl-cafile",
            "ssl_cafile",
            "PEM file of the CA(s) that signed the broker certificates (default: the system CAs).",
        ),
    ] = None
    ssl_certfile: Annotated[
        Path | None, _opt("--ssl-certfile", "ssl_certfile", "mTLS: PEM client certificate (chain).")
    ] = None
    ssl_keyfile: Annotated[
        Path | None, _opt("--ssl-keyfile", "ssl_keyfile", "mTLS: PEM client private key.")
    ] = None
    ssl_key_password_file: Annotated[
        Path | None,
        _opt(
            "--ssl-key-password-file",
            "ssl_key_password_file",
            "mTLS: file holding the password of an encrypted key.",
        ),
    ] = None
    ssl_check_hostname: Annotated[
        bool | None,
        _opt(
            "--ssl-check-hostname/--no-ssl-check-hostname",
            "ssl_check_hostname",
            "Check that the broker certificate names the host connected to (default: check). "
            "Turning it off "
            "allows a man in the middle.",
        ),
    ] = None

    def given(self) -> dict[str, Any]:
        """The settings values given by flag or env var, keyed like SecuritySettings.from_values."""
        names = {"security_protocol": "protocol"}
        return {
            names.get(f.name, f.name): getattr(self, f.name)
            for f in fields(self)
            if f.name not in ("kafka_config", "client") and getattr(self, f.name) not in (None, "")
        }


NO_SECURITY_OPTIONS = SecurityOptions()


def security_from_options(options: SecurityOptions) -> tuple[SecuritySettings, str | None]:
    """The settings (flags and env vars over the --kafka-config file) and the file's bootstrap.servers."""
    values: dict[str, Any] = {}
    bootstrap = None
    if options.kafka_config is not None:
        values, bootstrap = load_properties(options.kafka_config)
    given = options.given()
    # A password given here replaces one from the file, whichever form either used.
    if "sasl_password" in given or "sasl_password_file" in given:
        values.pop("sasl_password", None)
        values.pop("sasl_password_file", None)
    values.update(given)
    return SecuritySettings.from_values(values), bootstrap


def connection_from_options(
    bootstrap_servers: str | None,
    options: SecurityOptions = NO_SECURITY_OPTIONS,
    *,
    client_id: str = "rollout-stream",
    check: bool = True,
    local: LocalAddress | None = None,
) -> Connection:
    """A Connection that has been seen to work (TCP, TLS, SASL login).

    Raises a ConfigurationError (exit 2) when the settings are wrong or the broker refuses them (a retry will
    not help: SecurityConfigError, BadBootstrap, ConnectionCheckFailed), BrokerUnreachable (exit 1) when no
    broker answers. Without a bootstrap address (here and in --kafka-config): the address `local` finds
    (rollout_stream.commands.local), else a ConfigurationError saying how to give one (`NO_ADDRESS`).
    """
    security, file_bootstrap = security_from_options(options)
    if security.uses_tls:
        security.ssl_context()  # loads CA and key files now: a bad path is a one-line error here
    bootstrap = bootstrap_servers or file_bootstrap or (local(security) if local is not None else None)
    if not bootstrap:
        fail(NO_ADDRESS)
    given = (
        "--bootstrap-servers (or KAFKA_BOOTSTRAP_SERVERS)" if bootstrap_servers
        else f"bootstrap.servers in {options.kafka_config}" if file_bootstrap
        else "the local broker's address"
    )
    with described(BadBootstrap, given, advice="give host:port[,host:port...] (a missing port is 9092)"):
        conn = Connection(bootstrap, client_id=client_id, security=security,
                          client=options.client or default_client())
    if check:
        check_connection(conn)  # BrokerUnreachable says "is the broker running?" itself
    return conn
