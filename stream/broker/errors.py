"""Why the local development broker could not be prepared, started or stopped.

Every message is one line that says what to do next.

    BrokerError
    ├── BrokerConfigError         change the machine or the options, then retry
    │   ├── JavaNotFound
    │   │   └── UnsupportedJava   found, but older than Java 17
    │   ├── MavenNotFound         jars not cached and no mvn to fetch them
    │   ├── PortInUse
    │   └── BrokerAlreadyRunning  same data dir, other port
    ├── JarResolutionFailed       mvn ran and failed (network, mirror)
    ├── BrokerStartFailed         the JVM exited or never became ready; carries the log tail
    └── BrokerStopFailed          the process survived SIGKILL
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stream.broker.local import BrokerStatus

__all__ = [
    "BrokerError",
    "BrokerConfigError",
    "JavaNotFound",
    "UnsupportedJava",
    "MavenNotFound",
    "PortInUse",
    "BrokerAlreadyRunning",
    "JarResolutionFailed",
    "BrokerStartFailed",
    "BrokerStopFailed",
]


class BrokerError(Exception):
    """Base class: the local broker could not be prepared, started or stopped."""


class BrokerConfigError(BrokerError):
    """A retry will not help until the environment or the options change."""


class JavaNotFound(BrokerConfigError):
    """No `java` executable ($JAVA_HOME/bin/java, else PATH)."""


class UnsupportedJava(JavaNotFound):
    """A `java` was found but it is older than the broker needs."""


class MavenNotFound(BrokerConfigError):
    """The Kafka jars are not cached and there is no `mvn` to fetch them."""


class PortInUse(BrokerConfigError):
    """The broker port on 127.0.0.1 is taken by another process.

    `holder`: the local broker (its BrokerStatus, from another data dir) listening there, when it is one.
    """

    def __init__(self, message: str, *, port: int, holder: BrokerStatus | None = None) -> None:
        super().__init__(message)
        self.port = port
        self.holder = holder


class BrokerAlreadyRunning(BrokerConfigError):
    """A broker already runs from this data dir, on a different port than asked for."""


class JarResolutionFailed(BrokerError):
    """mvn could not download/copy the Kafka jars."""


class BrokerStartFailed(BrokerError):
    """The broker process exited during start, or did not become ready in time."""

    def __init__(self, message: str, *, log_path: Path | None = None, log_tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail: tuple[str, ...] = tuple(log_tail)


class BrokerStopFailed(BrokerError):
    """The broker process did not exit, not even after SIGKILL."""
