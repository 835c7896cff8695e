"""`rollout-stream tail` on the in-memory seam: it says what it follows at once, and Ctrl-C exits 130."""

from __future__ import annotations

import signal
import threading

import pytest
from typer.testing import CliRunner

from rollout_stream.cli import app
from rollout_stream.kafka.memory import MemoryCluster
from tests.stream.commands.memory_cli import BOOTSTRAP, on_memory

runner = CliRunner()


@pytest.fixture
def cluster(monkeypatch) -> MemoryCluster:
    c = MemoryCluster()
    c.create_topic("train-data", 3)
    on_memory(monkeypatch, c, "rollout_stream.topics", "rollout_stream.reader.train_data")
    return c


@pytest.fixture
def ctrl_c_soon():
    """Ctrl-C in 1 s, with Python's own handler (whatever an earlier in-process command left installed)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    # to the main thread itself: a signal another thread takes leaves the main one waiting
    timer = threading.Timer(1.0, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    yield
    timer.cancel()
    signal.signal(signal.SIGINT, previous)


def test_tail_of_an_empty_topic_says_what_it_follows_and_ctrl_c_exits_130(cluster, ctrl_c_soon):
    result = runner.invoke(app, ["tail", *BOOTSTRAP, "--from-beginning"], env={"COLUMNS": "200"})
    assert result.exit_code == 130, result.output
    assert result.stderr.splitlines() == [
        "following train-data (3 partitions) from the beginning; Ctrl-C stops; waiting for groups…",
        "0 group(s) shown",
    ]
    assert result.stdout == ""


def test_tail_says_where_it_starts_and_when_it_stops():
    from rollout_stream.commands.tail import following

    assert following("t", 1, False, 5) == ("following t (1 partition) from its end (new groups only); stops "
                                           "after 5 group(s); waiting for groups…")
