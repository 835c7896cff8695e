"""Client properties files (`--kafka-config`): the Java client's format, librdkafka's key names, our own.

    security.protocol=SASL_SSL
    sasl.mechanism=SCRAM-SHA-512
    sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\
        username="worker" password="…";
    ssl.truststore.type=PEM
    ssl.truststore.location=ca.pem

`load_properties` returns values for `SecuritySettings.from_values` and the file's bootstrap.servers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rollout_stream.security import SecretStr, SecurityConfigError

__all__ = ["load_properties"]

_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"')

# property key -> settings key. Java client names, librdkafka names, and this project's own.
_PROPERTY_KEYS: dict[str, str] = {
    "security.protocol": "protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",  # librdkafka
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
    "sasl.password.file": "sasl_password_file",
    "sasl.oauth.token.file": "sasl_oauth_token_file",
    "ssl.cafile": "ssl_cafile",
    "ssl.ca.location": "ssl_cafile",  # librdkafka
    "ssl.certfile": "ssl_certfile",
    "ssl.certificate.location": "ssl_certfile",  # librdkafka
    "ssl.keyfile": "ssl_keyfile",
    "ssl.key.location": "ssl_keyfile",  # librdkafka
    "ssl.key.password": "ssl_key_password",
    "ssl.check.hostname": "ssl_check_hostname",
}


def _parse_properties(text: str) -> dict[str, str]:
    """Java .properties as clients use them: KEY=VALUE or KEY: VALUE, # and ! comments, continuations."""
    props: dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.strip() if not logical else raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", logical)
        if match:
            props[match.group(1)] = match.group(2).strip()
        logical = ""
    return props


def load_properties(path: Path) -> tuple[dict[str, Any], str | None]:
    """The security values and the bootstrap address in a client properties file.

    Understands Java client files (security.protocol, sasl.mechanism, sasl.jaas.config with username and
    password, ssl.truststore.location of type PEM, ssl.endpoint.identification.algorithm), librdkafka names
    (sasl.username, ssl.ca.location, ...) and sasl.password.file / ssl.cafile. Other keys are ignored.
    Relative paths in the file are relative to the file's directory.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise SecurityConfigError(
            f"cannot read the Kafka client config {str(path)!r}: {exc.strerror or exc}"
        ) from None
    props = _parse_properties(text)
    values: dict[str, Any] = {}
    for key, value in props.items():
        if key in _PROPERTY_KEYS and value != "":
            values[_PROPERTY_KEYS[key]] = value
    jaas = props.get("sasl.jaas.config")
    if jaas:
        options = {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _JAAS_OPTION.findall(jaas)}
        if "username" in options:
            values.setdefault("sasl_username", options["username"])
        if "password" in options:
            values.setdefault("sasl_password", SecretStr(options["password"]))
    if "ssl.endpoint.identification.algorithm" in props:
        values.setdefault(
            "ssl_check_hostname", props["ssl.endpoint.identification.algorithm"].lower() == "https"
        )
    for store in ("truststore", "keystore"):
        location = props.get(f"ssl.{store}.location")
        if not location:
            continue
        kind = props.get(f"ssl.{store}.type", "JKS").upper()
        if kind != "PEM":
            raise SecurityConfigError(
                f"{str(path)!r}: ssl.{store}.location is a {kind} {store}, which only Java reads: "
                "export it as PEM "
                f"(`keytool -exportcert -rfc` / `openssl pkcs12 -nodes`) and use "
                f"{'ssl.cafile' if store == 'truststore' else 'ssl.certfile and ssl.keyfile'}"
            )
        if store == "truststore":
            values.setdefault("ssl_cafile", location)
        else:  # a PEM key store: key and certificate chain in one file
            values.setdefault("ssl_certfile", location)
    base = path.resolve().parent
    for key in ("sasl_password_file", "sasl_oauth_token_file", "ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if key in values and not Path(str(values[key])).expanduser().is_absolute():
            values[key] = str(base / str(values[key]))
    return values, props.get("bootstrap.servers") or None
