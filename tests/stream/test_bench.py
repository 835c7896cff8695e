"""`rollout-stream bench --quick` on the real broker: it runs, and both sides report positive throughput."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka(timeout=90)


def test_bench_quick_reports_stage_and_passthrough_throughput(kafka_bootstrap):
    exe = Path(sys.executable).with_name("rollout-stream")
    started = time.monotonic()
    result = subprocess.run(
        [str(exe), "bench", "--bootstrap-servers", kafka_bootstrap, "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=85,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert elapsed < 60, f"bench --quick took {elapsed:.0f}s"
    names = {r["workload"] for r in report["results"]}
    assert names == {"a", "b"}
    for r in report["results"]:
        assert r["delivery"] == "exactly-once"
        for side in ("stage", "passthrough"):
            assert r[side]["samples_per_s"] > 0 and r[side]["mb_per_s"] > 0, r
            assert r[side]["samples"] == r["stage"]["samples"] > 0
        assert r["ratio"] > 0
        assert r["latency"]["seen"] == r["latency"]["groups"] > 0 and r["latency"]["p99_ms"] > 0
    [memory] = report["memory"]
    assert (
        memory["open_windows"] > 0 and memory["open_bytes"] > 0 and memory["peak_rss"] >= memory["base_rss"]
    )
    assert set(report["targets"]) >= {"throughput_ok", "p99_ok", "memory_ok"}
    assert report["machine"]["cpus"] >= 1


def test_bench_table_and_option_errors():
    from typer.testing import CliRunner

    from stream.cli import app

    result = CliRunner().invoke(
        app, ["bench", "--delivery", "sometimes", "--bootstrap-servers", "127.0.0.1:1"]
    )
    assert result.exit_code == 2
    assert "--delivery must be exactly-once, at-least-once or both" in result.output
