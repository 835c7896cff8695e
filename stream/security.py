"""How a client proves who it is and checks who it talks to: TLS and SASL settings, modeled once.

`SecuritySettings` is filled from command-line flags, environment variables (`SecuritySettings.from_env`)
or a client properties file (rollout_stream.client_properties), in that order of precedence; each
implementation of
the Kafka seam turns it into its library's settings (rollout_stream.kafka.kafka_python.settings,
rollout_stream.kafka.confluent.settings). Secrets live in `SecretStr`, whose repr and str are masked, so a
settings object can be logged, put in an exception or printed by a debugger without leaking them.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal, get_args

from rollout_stream.errors import ConfigurationError

__all__ = [
    "ENV_VARS",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "SaslMechanism",
    "SecretStr",
    "SecurityConfigError",
    "SecurityProtocol",
    "SecuritySettings",
]

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
SECURITY_PROTOCOLS: tuple[str, ...] = get_args(SecurityProtocol)
SASL_MECHANISMS: tuple[str, ...] = get_args(SaslMechanism)

MASK = "**********"

# field name -> environment variable (the same names the typer options use as envvar=)
ENV_VARS: dict[str, str] = {
    "protocol": "KAFKA_SECURITY_PROTOCOL",
    "sasl_mechanism": "KAFKA_SASL_MECHANISM",
    "sasl_username": "KAFKA_SASL_USERNAME",
    "sasl_password": "KAFKA_SASL_PASSWORD",
    "sasl_password_file": "KAFKA_SASL_PASSWORD_FILE",
    "sasl_oauth_token_file": "KAFKA_SASL_OAUTH_TOKEN_FILE",
    "ssl_cafile": "KAFKA_SSL_CAFILE",
    "ssl_certfile": "KAFKA_SSL_CERTFILE",
    "ssl_keyfile": "KAFKA_SSL_KEYFILE",
    "ssl_key_password_file": "KAFKA_SSL_KEY_PASSWORD_FILE",
    "ssl_check_hostname": "KAFKA_SSL_CHECK_HOSTNAME",
}


class SecurityConfigError(ConfigurationError, ValueError):
    """Connection security settings a person must fix (one readable line, never a secret in it)."""


class SecretStr:
    """A string shown as ********** in repr, str, logs and tracebacks; `get_secret_value()` reveals it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def get_secret_value(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"SecretStr('{MASK}')"

    def __str__(self) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)




def _read_secret_file(path: Path, what: str) -> SecretStr:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SecurityConfigError(f"cannot read {what} {str(path)!r}: {exc.strerror or exc}") from None
    value = text.rstrip("\r\n")
    if not value:
        raise SecurityConfigError(f"{what} {str(path)!r} is empty")
    return SecretStr(value)


def _parse_bool(value: str, what: str) -> bool:
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SecurityConfigError(f"{what} must be true or false, got {value!r}")


@dataclass(frozen=True, slots=True)
class SecuritySettings:
    """TLS and SASL settings of a client connection (the default is PLAINTEXT, no authentication).

    Passwords are given as `SecretStr` or as files (read once, when the settings are built). `describe()`
    is the masked form for logs; each client library gets them from its seam implementation's settings.
    """

    protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_oauth_token_file: Path | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in SECURITY_PROTOCOLS:
            raise SecurityConfigError(
                f"security protocol must be one of {', '.join(SECURITY_PROTOCOLS)}, got {self.protocol!r}"
            )
        if self.sasl_password is not None and not isinstance(self.sasl_password, SecretStr):
            raise TypeError("sasl_password must be a SecretStr")  # a plain str would print in clear
        if self.ssl_key_password is not None and not isinstance(self.ssl_key_password, SecretStr):
            raise TypeError("ssl_key_password must be a SecretStr")
        if self.uses_sasl:
            self._check_sasl()
        else:
            given = [name for name, value in (
                ("SASL mechanism", self.sasl_mechanism), ("SASL user name", self.sasl_username),
                ("SASL password", self.sasl_password), ("OAUTHBEARER token file", self.sasl_oauth_token_file),
            ) if value]  # fmt: skip
            if given:
                raise SecurityConfigError(
                    f"{' and '.join(given)} given, but security protocol {self.protocol} does not use SASL: "
                    "use SASL_SSL (or SASL_PLAINTEXT)"
                )
        if not self.uses_tls:
            given = [name for name, value in (
                ("CA file", self.ssl_cafile), ("client certificate", self.ssl_certfile),
                ("client key", self.ssl_keyfile),
            ) if value]  # fmt: skip
            if given:
                raise SecurityConfigError(
                    f"TLS {' and '.join(given)} given, but security protocol {self.protocol} "
                    "does not use TLS: "
                    "use SSL or SASL_SSL"
                )
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise SecurityConfigError("a TLS client key needs its certificate: add --ssl-certfile")

    def _check_sasl(self) -> None:
        mech = self.sasl_mechanism
        if mech is None:
            raise SecurityConfigError(
                f"security protocol {self.protocol} needs a SASL mechanism: {', '.join(SASL_MECHANISMS)} "
                "(--sasl-mechanism or KAFKA_SASL_MECHANISM)"
            )
        if mech not in SASL_MECHANISMS:
            raise SecurityConfigError(
                f"SASL mechanism must be one of {', '.join(SASL_MECHANISMS)}, got {mech!r}"
            )
        if mech == "OAUTHBEARER":
            if self.sasl_oauth_token_file is None:
                raise SecurityConfigError(
                    "OAUTHBEARER needs a token file (--sasl-oauth-token-file or KAFKA_SASL_OAUTH_TOKEN_FILE)"
                )
            return
        if not self.sasl_username:
            raise SecurityConfigError(
                f"SASL {mech} needs a user name (--sasl-username or KAFKA_SASL_USERNAME)"
            )
        if not self.sasl_password:
            raise SecurityConfigError(
                f"SASL {mech} needs a password for user {self.sasl_username!r}: --sasl-password-file FILE, "
                "KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE"
            )

    # -- queries ------------------------------------------------------------------------------------
    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def principal(self) -> str | None:
        """The Kafka principal this client authenticates as, when the settings alone tell it."""
        if self.uses_sasl and self.sasl_mechanism != "OAUTHBEARER" and self.sasl_username:
            return f"User:{self.sasl_username}"
        if self.protocol == "PLAINTEXT":
            return "User:ANONYMOUS"
        return None

    def describe(self) -> dict[str, Any]:
        """The settings as logged: paths and names, every secret replaced by **********."""
        out: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_sasl:
            out["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_username:
                out["sasl_username"] = self.sasl_username
            if self.sasl_password:
                out["sasl_password"] = MASK
            if self.sasl_oauth_token_file:
                out["sasl_oauth_token_file"] = str(self.sasl_oauth_token_file)
        if self.uses_tls:
            out["ssl_cafile"] = str(self.ssl_cafile) if self.ssl_cafile else "system CAs"
            if self.ssl_certfile:
                out["ssl_certfile"] = str(self.ssl_certfile)
            if self.ssl_keyfile:
                out["ssl_keyfile"] = str(self.ssl_keyfile)
            if self.ssl_key_password:
                out["ssl_key_password"] = MASK
            out["ssl_check_hostname"] = self.ssl_check_hostname
        return out

    def __str__(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.describe().items())

    # -- the TLS context (kafka-python's; loading it checks the CA, certificate and key files) ---------
    def ssl_context(self) -> ssl.SSLContext:
        """The TLS client context every connection uses (TLS >= 1.2, as kafka-python's own)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = self.ssl_check_hostname
        if not self.ssl_check_hostname:
            ctx.verify_mode = ssl.CERT_REQUIRED  # the chain is still verified; only the name is not
        try:
            if self.ssl_cafile is not None:
                ctx.load_verify_locations(cafile=str(self.ssl_cafile))
            else:
                ctx.load_default_certs()
        except (OSError, ssl.SSLError) as exc:
            raise SecurityConfigError(
                f"cannot load the TLS CA file {str(self.ssl_cafile)!r}: {_why(exc)}"
            ) from None
        if self.ssl_certfile is not None:
            password = self.ssl_key_password.get_secret_value() if self.ssl_key_password else None
            try:
                ctx.load_cert_chain(
                    str(self.ssl_certfile),
                    str(self.ssl_keyfile) if self.ssl_keyfile else None,
                    password=password,
                )
            except (OSError, ssl.SSLError) as exc:
                raise SecurityConfigError(
                    f"cannot load the TLS client certificate {str(self.ssl_certfile)!r}"
                    f"{f' and key {str(self.ssl_keyfile)!r}' if self.ssl_keyfile else ''}: {_why(exc)}"
                    + (" (wrong key password?)" if password and isinstance(exc, ssl.SSLError) else "")
                ) from None
        return ctx

    # -- construction from the outside world --------------------------------------------------------
    @classmethod
    def from_values(cls, values: Mapping[str, Any], *, base_dir: Path | None = None) -> SecuritySettings:
        """Settings from plain values (flags, env vars, a properties file): strings, paths, file references.

        Keys are the field names, plus ``sasl_password_file`` and ``ssl_key_password_file`` (read here) and
        ``sasl_password`` / ``ssl_key_password`` as plain strings. Relative paths resolve against base_dir.
        """
        known = {f.name for f in fields(cls)} | {"sasl_password_file", "ssl_key_password_file"}
        unknown = set(values) - known
        if unknown:
            raise SecurityConfigError(f"unknown security settings: {', '.join(sorted(unknown))}")

        def path(key: str) -> Path | None:
            value = values.get(key)
            if value in (None, ""):
                return None
            p = Path(str(value)).expanduser()
            return p if p.is_absolute() or base_dir is None else base_dir / p

        def secret(key: str, file_key: str, what: str) -> SecretStr | None:
            value = values.get(key)
            if isinstance(value, SecretStr):
                return value if value else None
            if value not in (None, ""):
                return SecretStr(str(value))
            file = path(file_key)
            return _read_secret_file(file, what) if file is not None else None

        protocol = str(values.get("protocol") or "PLAINTEXT").strip().upper()
        mechanism = values.get("sasl_mechanism")
        check = values.get("ssl_check_hostname")
        return cls(
            protocol=protocol,  # type: ignore[arg-type]  # strings: __post_init__ checks both
            sasl_mechanism=str(mechanism).strip().upper() if mechanism else None,  # type: ignore[arg-type]
            sasl_username=str(values["sasl_username"]) if values.get("sasl_username") else None,
            sasl_password=secret("sasl_password", "sasl_password_file", "SASL password file"),
            sasl_oauth_token_file=path("sasl_oauth_token_file"),
            ssl_cafile=path("ssl_cafile"),
            ssl_certfile=path("ssl_certfile"),
            ssl_keyfile=path("ssl_keyfile"),
            ssl_key_password=secret("ssl_key_password", "ssl_key_password_file", "TLS key password file"),
            ssl_check_hostname=(
                check
                if isinstance(check, bool)
                else _parse_bool(str(check), "ssl check hostname")
                if check not in (None, "")
                else True
            ),
        )

    def to_values(self) -> dict[str, Any]:
        """The inverse of `from_values`, secrets in clear: only for handing the settings to a child process
        over a pipe (never to argv, the environment or a log)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            elif isinstance(value, Path):
                value = str(value)
            out[f.name] = value
        return out

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SecuritySettings:
        """Settings from the KAFKA_* environment variables (see ENV_VARS); PLAINTEXT when none is set."""
        env = os.environ if environ is None else environ
        return cls.from_values({name: env[var] for name, var in ENV_VARS.items() if env.get(var)})


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or exc.strerror or str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


