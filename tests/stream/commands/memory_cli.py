"""Commands on the in-memory Kafka seam: where a broker adds nothing to what a test shows (a footer, a line
on stderr), the modules a command reaches Kafka through are pointed at a MemoryCluster."""

from __future__ import annotations

import importlib

import pytest

from rollout_stream.kafka.memory import MemoryClient, MemoryCluster

BOOTSTRAP = ["--bootstrap-servers", "memory:9092"]


def on_memory(monkeypatch: pytest.MonkeyPatch, cluster: MemoryCluster, *modules: str) -> None:
    """`client_for` of each module returns the cluster's client; connections are not dialled first."""
    client = MemoryClient(cluster)
    monkeypatch.setattr("rollout_stream.commands.connection.check_connection",
                        lambda conn, timeout_s=10.0: None)
    for name in modules:
        monkeypatch.setattr(importlib.import_module(name), "client_for", lambda conn: client)
