"""The local development broker: Apache Kafka (KRaft, single node) run from Maven jars. See `local.py`."""

from __future__ import annotations

from stream.broker.errors import (
    BrokerAlreadyRunning,
    BrokerConfigError,
    BrokerError,
    BrokerStartFailed,
    BrokerStopFailed,
    JarResolutionFailed,
    JavaNotFound,
    MavenNotFound,
    PortInUse,
    UnsupportedJava,
)
from stream.broker.local import DEFAULT_DATA_DIR, DEFAULT_PORT, BrokerStatus, LocalBroker

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_PORT",
    "BrokerStatus",
    "LocalBroker",
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
