"""The broker's jars: fetched once with Maven from the packaged pom.xml into a per-version cache dir.

Layout: ``${ROLLOUT_STREAM_CACHE:-~/.cache/rollout-stream}/kafka-<version>/``
    pom.xml     copy of the packaged pom that produced lib/
    lib/        the runtime jars (classpath ``lib/*``), plus ``.complete`` (sha256 of that pom)
    mvn.log     output of the last Maven run
A cache whose ``.complete`` matches the packaged pom is used as is: no Maven, no network.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rollout_stream.broker.errors import BrokerError, JarResolutionFailed, MavenNotFound
from rollout_stream.broker.process import exclusive

__all__ = [
    "CACHE_ENV",
    "KafkaJars",
    "Progress",
    "cached_jars",
    "default_cache_root",
    "kafka_version",
    "maven_error",
    "pom_path",
    "resolve_jars",
]

CACHE_ENV = "ROLLOUT_STREAM_CACHE"
_MARKER = ".complete"
_MVN_TIMEOUT_S = 900.0

Progress = Callable[[str], None]
"""Receives one human-readable progress line (e.g. printed to stderr by the CLI)."""


@dataclass(frozen=True)
class KafkaJars:
    """A complete set of broker jars for one Kafka version."""

    version: str
    lib_dir: Path

    @property
    def classpath(self) -> str:
        """The JVM expands the wildcard itself (so it must not reach a shell unquoted)."""
        return str(self.lib_dir / "*")


def default_cache_root() -> Path:
    """``$ROLLOUT_STREAM_CACHE``, else ``~/.cache/rollout-stream``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "rollout-stream").expanduser()


def pom_path() -> Path:
    """The pom.xml shipped as package data next to this module (works from an installed package)."""
    ref = resources.files("rollout_stream.broker") / "pom.xml"
    if not ref.is_file():
        raise BrokerError(f"{ref} is missing from the installed package: reinstall rollout-stream")
    return Path(str(ref))


def kafka_version(pom: Path) -> str:
    """The `kafka.version` property pinned in the pom."""
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    node = ET.parse(pom).getroot().find("m:properties/m:kafka.version", ns)
    if node is None or not (node.text or "").strip():
        raise BrokerError(f"{pom} does not pin <kafka.version>: reinstall rollout-stream")
    return (node.text or "").strip()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version_dir(cache_root: Path | None, pom: Path) -> tuple[str, Path]:
    version = kafka_version(pom)
    root = Path(cache_root or default_cache_root()).expanduser().resolve()  # mvn runs in another cwd
    return version, root / f"kafka-{version}"


def _complete(lib_dir: Path, pom_sha: str) -> bool:
    marker = lib_dir / _MARKER
    return marker.is_file() and marker.read_text().strip() == pom_sha


def cached_jars(cache_root: Path | None = None) -> KafkaJars | None:
    """The cached jars for the packaged pom, or None when they must be fetched first."""
    pom = pom_path()
    version, version_dir = _version_dir(cache_root, pom)
    lib_dir = version_dir / "lib"
    return KafkaJars(version, lib_dir) if _complete(lib_dir, _sha256(pom)) else None


def resolve_jars(cache_root: Path | None = None, *, progress: Progress | None = None) -> KafkaJars:
    """The cached jars; runs Maven once to fetch them when the cache is missing or stale."""
    say = progress or (lambda _line: None)
    pom = pom_path()
    pom_sha = _sha256(pom)
    version, version_dir = _version_dir(cache_root, pom)
    lib_dir = version_dir / "lib"
    if _complete(lib_dir, pom_sha):
        return KafkaJars(version, lib_dir)
    # one resolver per cache dir at a time (parallel test sessions, `make jars` next to a worker)
    with exclusive(version_dir / ".lock"):
        if _complete(lib_dir, pom_sha):  # another process fetched them while we waited
            return KafkaJars(version, lib_dir)
        mvn = shutil.which("mvn")
        if mvn is None:
            raise MavenNotFound(
                f"the Kafka {version} jars are not cached in {lib_dir} and `mvn` is not on PATH: "
                f"install Maven (e.g. `apt-get install maven`), or fill the cache on a machine that has it "
                f"(`rollout-stream broker fetch-jars`) and point {CACHE_ENV} at it"
            )
        say(f"fetching the Kafka {version} jars with Maven into {lib_dir} (first run only)")
        started = time.monotonic()
        _run_maven(mvn, pom, version, version_dir, lib_dir, pom_sha, say)
        count = sum(1 for _ in lib_dir.glob("*.jar"))
        say(f"{count} jars ready in {time.monotonic() - started:.1f} s")
    return KafkaJars(version, lib_dir)


def maven_error(output: list[str]) -> str:
    """The first [ERROR]/[FATAL] message of a Maven run (plus the next one if it only introduces it)."""
    messages = []
    for line in output:
        text = line
        while text.startswith(("[ERROR]", "[FATAL]")):
            text = text[7:].strip()
        if text != line.strip() and text:
            messages.append(text.removesuffix("-> [Help 1]").strip())
    if not messages:
        return next((line.strip() for line in reversed(output) if line.strip()), "no output")
    reason = (
        f"{messages[0]} {messages[1]}" if messages[0].endswith(":") and len(messages) > 1 else messages[0]
    )
    return reason if len(reason) <= 300 else f"{reason[:120]} ... {reason[-170:]}"


def _run_maven(
    mvn: str, pom: Path, version: str, version_dir: Path, lib_dir: Path, pom_sha: str, say: Progress
) -> None:
    """mvn copy-dependencies into a fresh dir, then swap it in as lib/ (a failed run leaves lib/ alone)."""
    local_pom = version_dir / "pom.xml"
    shutil.copyfile(pom, local_pom)
    staging = version_dir / f"lib.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    log_path = version_dir / "mvn.log"
    command = [
        mvn, "-B", "-Dstyle.color=never", "-f", str(local_pom),
        "dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
    ]  # fmt: skip
    tail: deque[str] = deque(maxlen=40)
    try:
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                command, cwd=version_dir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, errors="replace",
            )  # fmt: skip
            assert proc.stdout is not None
            watchdog = threading.Timer(_MVN_TIMEOUT_S, proc.kill)  # a hung download must not hang us
            watchdog.start()
            try:
                for line in proc.stdout:
                    log.write(line)
                    tail.append(line.rstrip())
                    if line.startswith("Downloading from") and line.rstrip().endswith(".jar"):
                        say(f"  downloading {line.rstrip().rsplit('/', 1)[-1]}")
                returncode = proc.wait()
            finally:
                watchdog.cancel()
    except OSError as exc:
        raise JarResolutionFailed(
            f"could not run {mvn} ({type(exc).__name__}: {exc}): check the Maven install"
        ) from exc
    jar = staging / f"kafka_2.13-{version}.jar"
    if returncode != 0 or not jar.is_file():
        shutil.rmtree(staging, ignore_errors=True)
        raise JarResolutionFailed(
            f"mvn could not fetch the Kafka {version} jars (exit {returncode}): {maven_error(list(tail))} "
            f"-- check access to Maven Central (or your ~/.m2/settings.xml mirror); full output in {log_path}"
        )
    (staging / _MARKER).write_text(pom_sha + "\n")
    if lib_dir.exists():
        old = version_dir / f"lib.old-{os.getpid()}"
        lib_dir.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    staging.rename(lib_dir)
