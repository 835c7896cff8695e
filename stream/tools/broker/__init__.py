"""The local development broker: Apache Kafka (KRaft, single node) run from Maven jars. See `local.py`;
the errors it raises are in `errors.py`."""

from __future__ import annotations

from stream.tools.broker import errors as _errors
from stream.tools.broker.errors import *  # noqa: F403  one import for callers: the broker and its errors
from stream.tools.broker.local import (
    DEFAULT_DATA_DIR,
    DEFAULT_PORT,
    BrokerStatus,
    LocalBroker,
    running_brokers,
)

__all__ = [
    "DEFAULT_DATA_DIR", "DEFAULT_PORT", "BrokerStatus", "LocalBroker", "running_brokers", *_errors.__all__
]
