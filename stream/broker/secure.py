"""The secured local broker: a SASL_SSL listener, SCRAM users, the KRaft StandardAuthorizer with ACLs on.

Files in ``<data dir>/secure/`` (created once, reused at every start; secrets are mode 0600):

    ca.pem                      the CA clients trust (--ssl-cafile); ca.key stays here
    broker.pem, broker.key      the broker certificate (localhost, 127.0.0.1), embedded in server.properties
    client.pem, client.key      a client certificate from the same CA, for trying mTLS
    admin.password              SCRAM-SHA-512/256 password of User:admin, the super user
    worker.password             ... of User:worker, which has no ACLs until they are granted
    admin.properties            client settings (Java-client compatible, bootstrap.servers included) for
    worker.properties           `--kafka-config`, `kafka-acls.sh --command-config`, and the like
    controller.password         the controller listener's SASL/PLAIN login (broker to controller only)

Listeners: ``SASL_SSL://127.0.0.1:PORT`` for clients and between brokers (SCRAM-SHA-512 as User:admin),
``CONTROLLER`` on a free 127.0.0.1 port with SASL_PLAINTEXT/PLAIN (SCRAM cannot serve the controller
listener in KRaft: its credentials live in the metadata the controller serves). Super users: admin and
controller. Nobody else may do anything without an ACL (allow.everyone.if.no.acl.found=false).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from rollout_stream.broker.pki import CertificateAuthority, IssuedCertificate, issue, new_ca
from rollout_stream.security import SaslMechanism, SecretStr, SecuritySettings

__all__ = [
    "ADMIN_USER",
    "CLIENT_USERS",
    "SCRAM_MECHANISMS",
    "SecureMaterial",
    "describe_secure_broker",
    "prepare_secure_material",
    "secure_listener_properties",
    "scram_format_arguments",
]

ADMIN_USER = "admin"
CLIENT_USERS = (ADMIN_USER, "worker")
CONTROLLER_USER = "controller"
SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
LISTENER = "SASL_SSL"


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read, without a moment where it is readable by others."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    tmp.replace(path)


@dataclass(frozen=True)
class SecureMaterial:
    """Where the secured broker's certificates and credentials are."""

    directory: Path
    ca: CertificateAuthority
    broker: IssuedCertificate
    client: IssuedCertificate

    def password_file(self, user: str) -> Path:
        return self.directory / f"{user}.password"

    def password(self, user: str) -> SecretStr:
        return SecretStr(self.password_file(user).read_text().strip())

    def properties_file(self, user: str) -> Path:
        return self.directory / f"{user}.properties"

    def security(self, user: str = ADMIN_USER,
                 mechanism: SaslMechanism = "SCRAM-SHA-512") -> SecuritySettings:
        """Client settings that log in as `user` over SASL_SSL, trusting only this CA."""
        return SecuritySettings(
            protocol="SASL_SSL",
            sasl_mechanism=mechanism,
            sasl_username=user,
            sasl_password=self.password(user),
            ssl_cafile=self.ca.cert,
        )

    def write_client_properties(self, bootstrap: str) -> None:
        """One properties file per user, readable by rollout-stream (--kafka-config) and by Java tools."""
        for user in CLIENT_USERS:
            write_private(
                self.properties_file(user),
                "\n".join(
                    [
                        f"# rollout-stream local secured broker: client settings of User:{user}"
                        + (" (super user)" if user == ADMIN_USER else ""),
                        f"bootstrap.servers={bootstrap}",
                        "security.protocol=SASL_SSL",
                        "sasl.mechanism=SCRAM-SHA-512",
                        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                        f'username="{user}" password="{self.password(user).get_secret_value()}";',
                        "ssl.truststore.type=PEM",
                        f"ssl.truststore.location={self.ca.cert}",
                        "",
                    ]
                ),
            )


def _new_password() -> str:
    # URL-safe alphabet: no quote, comma, '=' or ']' that would need escaping in JAAS or --add-scram.
    return secrets.token_urlsafe(24)


def prepare_secure_material(directory: Path) -> SecureMaterial:
    """Create the CA, certificates and passwords that are missing; keep the ones that exist."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    ca = CertificateAuthority(directory / "ca.pem", directory / "ca.key")
    if not (ca.cert.exists() and ca.key.exists()):
        ca = new_ca(directory)
        for stale in ("broker", "client"):  # signed by a CA that is gone
            (directory / f"{stale}.pem").unlink(missing_ok=True)
    broker = IssuedCertificate(directory / "broker.pem", directory / "broker.key")
    if not (broker.cert.exists() and broker.key.exists()):
        broker = issue(ca, directory, "broker", common_name="localhost")
    client = IssuedCertificate(directory / "client.pem", directory / "client.key")
    if not (client.cert.exists() and client.key.exists()):
        client = issue(ca, directory, "client", common_name="worker", hosts=("localhost",))
    for user in (*CLIENT_USERS, CONTROLLER_USER):
        path = directory / f"{user}.password"
        if not path.exists():
            write_private(path, _new_password() + "\n")
    return SecureMaterial(directory, ca, broker, client)


def scram_format_arguments(material: SecureMaterial) -> list[str]:
    """`kafka-storage format` arguments that create every client user for every SCRAM mechanism."""
    args = []
    for user in CLIENT_USERS:
        password = material.password(user).get_secret_value()
        for mechanism in SCRAM_MECHANISMS:
            args += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    return args


def secure_listener_properties(
    material: SecureMaterial, *, port: int, controller_port: int
) -> dict[str, str]:
    """The server.properties entries that replace the PLAINTEXT listeners (this file then holds secrets)."""
    admin = material.password(ADMIN_USER).get_secret_value()
    controller = material.password(CONTROLLER_USER).get_secret_value()
    listeners = f"{LISTENER}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}"
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule required"
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule required"
    prefix = f"listener.name.{LISTENER.lower()}"
    return {
        "listeners": listeners,
        "advertised.listeners": listeners,
        "inter.broker.listener.name": LISTENER,
        "listener.security.protocol.map": f"CONTROLLER:SASL_PLAINTEXT,{LISTENER}:{LISTENER}",
        # broker -> controller: SASL/PLAIN with a static user known to the controller listener only
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": (
            f'{plain} username="{CONTROLLER_USER}" password="{controller}" '
            f'user_{CONTROLLER_USER}="{controller}";'
        ),
        # clients and inter-broker traffic: SCRAM over TLS
        "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        f"{prefix}.sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
        f"{prefix}.scram-sha-512.sasl.jaas.config": f'{scram} username="{ADMIN_USER}" password="{admin}";',
        f"{prefix}.scram-sha-256.sasl.jaas.config": f"{scram};",
        f"{prefix}.ssl.client.auth": "requested",  # a client certificate, if sent, must be valid
        "ssl.keystore.type": "PEM",
        "ssl.keystore.key": material.broker.key.read_text(),
        "ssl.keystore.certificate.chain": material.broker.cert.read_text(),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(material.ca.cert),
        # authorization: ACLs in the KRaft metadata log, deny by default
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{ADMIN_USER};User:{CONTROLLER_USER}",
        "allow.everyone.if.no.acl.found": "false",
    }


def describe_secure_broker(material: SecureMaterial, bootstrap: str) -> list[str]:
    """What `broker start --secure` prints: where to connect and with what (never a password itself)."""
    d = material.directory
    return [
        f"SASL_SSL (SCRAM-SHA-512/256) on {bootstrap}; ACLs on (StandardAuthorizer), "
        "nothing allowed without one",
        f"  CA certificate:   {material.ca.cert}   (--ssl-cafile)",
        f"  admin (super user): --kafka-config {material.properties_file(ADMIN_USER)}  "
        f"(password in {material.password_file(ADMIN_USER)})",
        f"  worker (no ACLs yet): --kafka-config {material.properties_file('worker')}  "
        f"(password in {material.password_file('worker')})",
        f"  mTLS client certificate: {d / 'client.pem'}, key {d / 'client.key'}",
        "  grant the worker its ACLs: rollout-stream acls apply --principal User:worker --kafka-config "
        f"{material.properties_file(ADMIN_USER)}",
    ]
