"""Find a Java runtime new enough for the broker."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rollout_stream.broker.errors import JavaNotFound, UnsupportedJava

__all__ = ["JavaRuntime", "MIN_JAVA_MAJOR", "find_java", "parse_java_major"]

MIN_JAVA_MAJOR = 17  # Kafka 4.x brokers need Java 17

_INSTALL_HINT = (
    "install a JDK/JRE >= 17 (e.g. `apt-get install openjdk-17-jre-headless`) or set JAVA_HOME to one"
)


@dataclass(frozen=True)
class JavaRuntime:
    """A `java` executable and the version it reported."""

    executable: Path
    version: str
    major: int


def parse_java_major(version_output: str) -> tuple[str, int] | None:
    """The version string and major number from `java -version` output ("1.8.0_392" → 8, "17.0.15" → 17)."""
    match = re.search(r'version "([^"]+)"', version_output)
    if match is None:
        return None
    version = match.group(1)
    parts = re.findall(r"\d+", version)
    if not parts:
        return None
    major = int(parts[1]) if parts[0] == "1" and len(parts) > 1 else int(parts[0])
    return version, major


def _candidate() -> Path | None:
    """$JAVA_HOME/bin/java when JAVA_HOME is set (like Kafka's own scripts), else `java` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        path = Path(java_home) / "bin" / "java"
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise JavaNotFound(
            f"JAVA_HOME={java_home} has no bin/java: fix or unset JAVA_HOME, or {_INSTALL_HINT}"
        )
    found = shutil.which("java")
    return Path(found) if found else None


def find_java(min_major: int = MIN_JAVA_MAJOR) -> JavaRuntime:
    """The Java runtime to start the broker with; raises JavaNotFound / UnsupportedJava."""
    executable = _candidate()
    if executable is None:
        raise JavaNotFound(
            f"java not found on PATH (the Kafka broker needs Java >= {min_major}): {_INSTALL_HINT}"
        )
    try:
        result = subprocess.run(
            [str(executable), "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFound(
            f"{executable} -version failed ({type(exc).__name__}: {exc}): {_INSTALL_HINT}"
        ) from exc
    parsed = parse_java_major(result.stderr + result.stdout)
    if parsed is None:
        raise JavaNotFound(f"could not read the version printed by `{executable} -version`: {_INSTALL_HINT}")
    version, major = parsed
    if major < min_major:
        raise UnsupportedJava(
            f"{executable} is Java {version}, the Kafka broker needs Java >= {min_major}: {_INSTALL_HINT}"
        )
    return JavaRuntime(executable=executable, version=version, major=major)
