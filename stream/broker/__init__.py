"""The local development broker: Apache Kafka (KRaft) run from Maven jars, a single node (`local.py`) or a
cluster of several (`cluster.py`); the errors they raise are in `errors.py`."""

from __future__ import annotations

from rollout_stream.broker import errors as _errors
from rollout_stream.broker.errors import *  # noqa: F403  one import for callers: the broker and its errors
from rollout_stream.broker.local import (
    DEFAULT_DATA_DIR,
    DEFAULT_PORT,
    BrokerStatus,
    LocalBroker,
    running_brokers,
)

__all__ = [
    "DEFAULT_DATA_DIR", "DEFAULT_PORT", "BrokerStatus", "LocalBroker", "running_brokers", *_errors.__all__
]
