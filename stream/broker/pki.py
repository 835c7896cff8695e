"""A throwaway certificate authority for the secured local broker, made with the `openssl` command line.

Everything is PEM, so the same files serve the broker (PEM key store and trust store, Kafka >= 2.7) and
kafka-python (``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``). Private keys are unencrypted PKCS#8 and
written with mode 0600. Certificates name ``localhost`` and ``127.0.0.1``, where the local broker listens,
so hostname verification stays on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rollout_stream.broker.errors import BrokerConfigError, BrokerError

__all__ = ["CertificateAuthority", "IssuedCertificate", "OpenSSLNotFound", "issue", "new_ca", "find_openssl"]

_DEFAULT_DAYS = 825  # the longest validity macOS and browsers accept for a TLS server certificate


class OpenSSLNotFound(BrokerConfigError):
    """No `openssl` executable on PATH."""


@dataclass(frozen=True)
class CertificateAuthority:
    cert: Path  # ca.pem: what clients pass as --ssl-cafile
    key: Path


@dataclass(frozen=True)
class IssuedCertificate:
    cert: Path  # the leaf certificate followed by the CA certificate (a chain)
    key: Path


def find_openssl() -> str:
    exe = shutil.which("openssl")
    if exe is None:
        raise OpenSSLNotFound(
            "the secured broker needs `openssl` to create its certificates: install it "
            "(e.g. `apt-get install openssl`)"
        )
    return exe


def _run(args: list[str], what: str) -> None:
    try:
        result = subprocess.run(
            [find_openssl(), *args], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(f"openssl did not finish {what} within 60 s") from exc
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BrokerError(f"openssl failed {what}: {detail}")


def _private(path: Path) -> None:
    os.chmod(path, 0o600)


def new_ca(
    directory: Path, *, name: str = "rollout-stream local CA", days: int = _DEFAULT_DAYS, stem: str = "ca"
) -> CertificateAuthority:
    """A self-signed CA certificate and key in `directory` (<stem>.pem, <stem>.key)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{stem}.pem", directory / f"{stem}.key"
    _run(
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-sha256",
            "-days",
            str(days),
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            f"/CN={name}",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        f"creating the CA in {directory}",
    )
    _private(key)
    return CertificateAuthority(cert, key)


def issue(
    ca: CertificateAuthority,
    directory: Path,
    stem: str,
    *,
    common_name: str,
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
    days: int = _DEFAULT_DAYS,
    not_before: str | None = None,
    not_after: str | None = None,
) -> IssuedCertificate:
    """A key and a certificate signed by `ca`, valid for TLS server and client use on `hosts`.

    not_before/not_after (``YYYYMMDDHHMMSSZ``) replace `days`; tests use them for an expired certificate.
    """
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{stem}.pem", directory / f"{stem}.key"
    sans = ",".join(f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts)
    with tempfile.TemporaryDirectory(prefix="rollout-stream-pki-") as tmp:
        work = Path(tmp)
        csr = work / "leaf.csr"
        _run(
            [
                "req",
                "-new",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(csr),
                "-subj",
                f"/CN={common_name}",
            ],
            f"creating the key of {stem}",
        )
        _private(key)
        extensions = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=serverAuth,clientAuth",
            f"subjectAltName={sans}",
        ]
        leaf = work / "leaf.pem"
        if not_before is None and not_after is None:
            ext = work / "leaf.ext"
            ext.write_text("\n".join(extensions) + "\n")
            _run(
                [
                    "x509",
                    "-req",
                    "-in",
                    str(csr),
                    "-CA",
                    str(ca.cert),
                    "-CAkey",
                    str(ca.key),
                    "-sha256",
                    "-set_serial",
                    str(int.from_bytes(os.urandom(8), "big")),
                    "-days",
                    str(days),
                    "-extfile",
                    str(ext),
                    "-out",
                    str(leaf),
                ],
                f"signing {stem}",
            )
        else:
            _sign_with_dates(ca, csr, leaf, extensions, work, not_before, not_after, stem)
        cert.write_text(leaf.read_text() + ca.cert.read_text())
    return IssuedCertificate(cert, key)


def _sign_with_dates(
    ca: CertificateAuthority,
    csr: Path,
    out: Path,
    extensions: list[str],
    work: Path,
    not_before: str | None,
    not_after: str | None,
    stem: str,
) -> None:
    """`openssl ca` is the one OpenSSL 3.0 command that takes explicit validity dates."""
    (work / "index.txt").write_text("")
    (work / "serial").write_text(os.urandom(8).hex() + "\n")
    config = work / "ca.cnf"
    config.write_text(
        "\n".join(
            [
                "[ca]",
                "default_ca = local",
                "[local]",
                f"dir = {work}",
                f"database = {work / 'index.txt'}",
                f"serial = {work / 'serial'}",
                f"new_certs_dir = {work}",
                f"certificate = {ca.cert}",
                f"private_key = {ca.key}",
                "default_md = sha256",
                "policy = any",
                "copy_extensions = none",
                "x509_extensions = leaf",
                "unique_subject = no",
                "[any]",
                "commonName = supplied",
                "[leaf]",
                *extensions,
                "",
            ]
        )
    )
    args = ["ca", "-batch", "-notext", "-config", str(config), "-in", str(csr), "-out", str(out)]
    if not_before:
        args += ["-startdate", not_before]
    if not_after:
        args += ["-enddate", not_after]
    _run(args, f"signing {stem} with fixed dates")
