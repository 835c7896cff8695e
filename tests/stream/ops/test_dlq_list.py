"""`dlq list`'s last line says what was listed, on the in-memory seam (a broker adds nothing here)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rollout_stream.cli import app
from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.core.records import DeadLettered, InputRecord
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.worker.outputs import dead_letter_records
from tests.stream.commands.memory_cli import BOOTSTRAP, on_memory

runner = CliRunner()
TOPIC = "rollouts-dlq"


@pytest.fixture
def cluster(monkeypatch) -> MemoryCluster:
    c = MemoryCluster(clock_ms=1_700_000_000_000)
    c.create_topic(TOPIC, 1)
    producer = c.client().producer()
    for i in range(5):
        failed = DeadLettered(R.DECODE_ERROR, "empty value (0 bytes)", f"r/{i}",
                              (InputRecord("rollouts", 0, i, 1_700_000_000_000, b"r/%d" % i, b""),))
        for out in dead_letter_records(failed, TOPIC):
            producer.send(out.topic, out.value, out.key, headers=out.headers)
    producer.flush()
    on_memory(monkeypatch, c, "rollout_stream.commands.dlq")
    return c


def _footer(*args: str) -> str:
    result = runner.invoke(app, ["dlq", "list", *BOOTSTRAP, *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()[-1].strip()


def test_a_listing_stopped_by_its_limit_says_it_shows_the_first_records_only(cluster):
    assert _footer("--limit", "3") == (
        f"the first 3 record(s) of {TOPIC}, every record: --limit 3 reached (--limit 0 lists them all, "
        "`rollout-stream dlq stats` counts them)")


def test_a_whole_listing_counts_what_it_shows(cluster):
    assert _footer("--limit", "0") == f"5 record(s) of {TOPIC}, every record"
    assert _footer("--limit", "9") == f"5 record(s) of {TOPIC}, every record"
