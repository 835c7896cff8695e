"""Why the local development broker could not be prepared, started or stopped.

Every message is one line that says what to do next.

    BrokerError                   a RolloutStreamError (stream/errors.py)
    ├── BrokerConfigError         change the machine or the options, then retry: a ConfigurationError (exit 2)
    │   ├── JavaNotFound
    │   │   └── UnsupportedJava   found, but older than Java 17
    │   ├── MavenNotFound         jars not cached and no mvn to fetch them
    │   ├── OpenSSLNotFound       (stream/broker/pki.py) --secure needs openssl
    │   ├── PortInUse
    │   ├── BrokerAlreadyRunning  same data dir, other port
    │   ├── DiskFull              too little free space where the data dir is (checked by disk.py)
    │   └── BadOverride           an --override that is not KEY=VALUE, or a key rollout-stream sets itself
    ├── JarResolutionFailed       mvn ran and failed (network, mirror): a RuntimeFailure (exit 1), as are
    ├── BrokerStartFailed         the JVM exited or never became ready; carries the log tail
    └── BrokerStopFailed          the process survived SIGKILL
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rollout_stream.errors import ConfigurationError, RolloutStreamError, RuntimeFailure

if TYPE_CHECKING:
    from rollout_stream.broker.local import BrokerStatus

__all__ = [
    "BrokerError",
    "BrokerConfigError",
    "JavaNotFound",
    "UnsupportedJava",
    "MavenNotFound",
    "PortInUse",
    "BrokerAlreadyRunning",
    "DiskFull",
    "BadOverride",
    "JarResolutionFailed",
    "BrokerStartFailed",
    "BrokerStopFailed",
]


class BrokerError(RolloutStreamError):
    """Base class: the local broker could not be prepared, started or stopped."""


class BrokerConfigError(BrokerError, ConfigurationError):
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


class DiskFull(BrokerConfigError):
    """The filesystem of the data dir has less free space than a broker needs to start and run."""


class BadOverride(BrokerConfigError, ValueError):
    """A server.properties override that is not KEY=VALUE, or sets a key rollout-stream manages."""


class JarResolutionFailed(BrokerError, RuntimeFailure):
    """mvn could not download/copy the Kafka jars."""


class BrokerStartFailed(BrokerError, RuntimeFailure):
    """The broker process exited during start, or did not become ready in time."""

    def __init__(self, message: str, *, log_path: Path | None = None, log_tail: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.log_path = log_path
        self.log_tail: tuple[str, ...] = tuple(log_tail)


class BrokerStopFailed(BrokerError, RuntimeFailure):
    """The broker process did not exit, not even after SIGKILL."""
