"""`python -m bench run --quick` on the real broker: it runs, and both sides report positive throughput."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

# any client: the bench's logic; each client's producer and consumer are shown elsewhere
pytestmark = pytest.mark.any_client

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.kafka(timeout=90)
def test_bench_quick_reports_stage_and_passthrough_throughput(kafka_bootstrap):
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--bootstrap-servers", kafka_bootstrap, "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=85,
        cwd=ROOT,  # the workshop is not installed: it runs from the repository's root
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
        # the baseline's latency, offered the same paced load as the stage
        assert r["passthrough_latency"]["rate"] == r["latency"]["rate"]
        assert r["passthrough_latency"]["seen"] == r["passthrough_latency"]["groups"] > 0
    assert report["memory"] == [] and report["sweep"]["points"] == []  # full runs only
    assert set(report["targets"]) >= {"throughput_ok", "p99_ok", "memory_ok"}
    assert report["machine"]["cpus"] >= 1


def test_bench_table_and_option_errors():
    from typer.testing import CliRunner

    from bench.__main__ import app

    result = CliRunner().invoke(
        app, ["run", "--delivery", "sometimes", "--bootstrap-servers", "127.0.0.1:1"]
    )
    assert result.exit_code == 2
    assert "--delivery must be exactly-once, at-least-once or both" in result.output


def test_bench_latency_rate_and_workload_options_reach_the_run(monkeypatch):
    """`--latency-rate` and `--workload` become the run's settings; bad values stop it before any Kafka."""
    from typer.testing import CliRunner

    import bench.command as command
    from bench import suite
    from bench.__main__ import app
    from bench.results import BenchReport
    from rollout_stream.clients import Connection

    seen = []

    def run_bench(settings, progress, security=None):
        seen.append(settings)
        return BenchReport(settings, {"cpus": 2, "cpu_model": "test"})

    monkeypatch.setattr(suite, "run_bench", run_bench)
    monkeypatch.setattr(command, "connection_from_options", lambda *a, **k: Connection("127.0.0.1:1"))
    runner = CliRunner()
    result = runner.invoke(app, ["run", "--bootstrap-servers", "127.0.0.1:1", "--json",
                                 "--latency-rate", "20000", "--workload", "b-g8", "--workload", "a-g8",
                                 "--no-compare-delivery"])
    assert result.exit_code == 0, result.output
    (settings,) = seen
    assert settings.latency_rate == 20000 and settings.compare_delivery is False
    assert [w.label() for w in settings.suite()] == ["a 256t g8", "b 32Kt g8"]  # the standard order
    assert '"latency_rate": 20000' in result.output

    for args, message in ((["--workload", "a-g9"], "--workload a-g9: not a workload of this run"),
                          (["--latency-rate", "0"], "--latency-rate must be at least one per 100 years")):
        result = runner.invoke(app, ["run", "--bootstrap-servers", "127.0.0.1:1", *args])
        assert result.exit_code == 2 and message in result.output, result.output
    assert len(seen) == 1


def test_at_a_fixed_latency_rate_the_half_load_p99_targets_are_not_judged():
    from rich.console import Console

    from bench.latency import LatencyResult
    from bench.report import render
    from bench.results import BenchReport, BenchSettings, WorkloadResult
    from bench.workloads import Workload

    lat = LatencyResult(rate=20000.0, groups=100, seen=100, p50_ms=30.0, p99_ms=400.0, max_ms=410.0,
                        seconds=6.0)
    a = Workload("a", 256, 8, 1, 125)
    report = BenchReport(BenchSettings(bootstrap="x:1", latency_rate=20000.0),
                         {"cpus": 2, "cpu_model": "t", "python": "3.11", "kafka_python": "3",
                          "load_average_start": [1.0]})
    report.results = [WorkloadResult(a, "exactly-once", _throughput("stage", 900),
                                     _throughput("passthrough", 1000), lat, lat, client="confluent")]
    targets = report.targets()
    assert targets["p99_ok"] is None and targets["librdkafka"]["p99_ok"] is None
    assert targets["librdkafka"]["p99_ms_a"] == 400.0  # still reported, only not judged
    console = Console(record=True, width=200)
    render(report, console)
    assert "not judged (--latency-rate 20000: not half load)" in console.export_text()


def _throughput(mode: str, rate: float):
    from bench.results import Throughput

    return Throughput(mode, samples=1000, bytes=2_000_000, seconds=1000 / rate, cpu_s=0.5, loop_cpu_s=0.04,
                      commits=3, final_commit_s=0.01)


def test_table_renders_every_section_and_judges_the_targets():
    from rich.console import Console

    from bench.latency import LatencyResult, percentile
    from bench.report import render
    from bench.results import (
        BenchReport,
        BenchSettings,
        MemoryResult,
        SweepPoint,
        WorkloadResult,
    )
    from bench.workloads import Workload

    tp = _throughput
    lat = LatencyResult(
        rate=450.0, groups=100, seen=100, p50_ms=80.0, p99_ms=200.0, max_ms=210.0, seconds=4.0
    )
    a, b = Workload("a", 256, 8, 1, 125), Workload("b", 32768, 8, 1, 80)
    report = BenchReport(
        BenchSettings(bootstrap="x:1"),
        {"cpus": 2, "cpu_model": "test", "python": "3.11", "kafka_python": "3", "load_average_start": [1.0]},
    )
    report.results = [
        WorkloadResult(a, "exactly-once", tp("stage", 900), tp("passthrough", 1000), lat,
                       pair_ratios=[0.9, 0.84, 0.95]),
        WorkloadResult(b, "exactly-once", tp("stage", 50), tp("passthrough", 100), lat),
    ]
    report.delivery_compare = [
        WorkloadResult(a, "at-least-once", tp("stage", 950), tp("passthrough", 1000), lat)
    ]
    report.memory = [
        MemoryResult(b, base_rss=700_000_000, peak_rss=900_000_000, open_bytes=200_000_000, open_windows=64)
    ]
    report.sweep = [SweepPoint(0.1, 1000, tp("stage", 800), lat)]
    report.sweep_workload = a
    targets = report.targets()
    assert targets["throughput_ok"] is False and targets["throughput_ratio_min_ab"] == 0.5  # (b) is at 0.5
    assert targets["p99_ok"] is True and targets["memory_ok"] is True and targets["memory_ratio_max"] == 1.0
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    for needle in (
        "a 256t g8",
        "b 32Kt g8",
        "Exactly-once vs at-least-once",
        "ALO",
        "Memory",
        "Commit cadence",
        "Targets",
        "not met",
        "alternating stage/passthrough pair",
        "a 256t g8 exactly-once: pairs 0.90, 0.84, 0.95",
    ):
        assert needle in text, needle
    assert report.to_json()["results"][0]["ratio"] == 0.9
    assert report.results[0].spread == (0.84, 0.95) and report.results[1].spread is None
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0 and percentile([], 99) is None


def test_bench_measures_the_worker_default_commit_cadence():
    from bench.results import BenchSettings
    from bench.runner import RunSpec
    from rollout_stream.config import WorkerConfig

    worker = WorkerConfig(bootstrap_servers="x:1", group_id="g")
    assert BenchSettings(bootstrap="x:1").commit_interval_s == worker.commit_interval_s
    assert RunSpec("stage", "x:1", "i", "o", "d", "g").commit_interval_s == worker.commit_interval_s
    assert BenchSettings(bootstrap="x:1").commit_max_records == worker.commit_max_records


@pytest.mark.kafka(timeout=90)
def test_bench_topics_go_with_the_windows_changelog_of_their_input(kafka_bootstrap):
    from kafka.admin import KafkaAdminClient, NewTopic

    from bench.workloads import create_topics, delete_topics
    from rollout_stream.clients import Connection
    from rollout_stream.names import changelog_topic_name
    from tests.stream.helpers import wait_until

    conn = Connection(kafka_bootstrap)
    topics = create_topics(conn, 1, tag="bench-cleanup")
    changelog = changelog_topic_name("bench-stage-group", topics.names.input)  # as a stage drain makes it
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(changelog, 1, 1)])
        mine = {*topics.all(), changelog}
        # A topic just created reaches the broker's metadata a moment later (CI once listed it missing)
        wait_until(lambda: mine <= set(admin.list_topics()), 30, "bench topics and changelog listed")
        delete_topics(conn, topics.all())
        wait_until(lambda: not mine & set(admin.list_topics()), 30, "bench topics and changelog deleted")
    finally:
        admin.close()


@pytest.mark.kafka(timeout=90)
def test_a_drain_that_stops_short_says_where_each_partition_stands(kafka_bootstrap):
    """Groups missing their last member never let the stage commit to the end: the failure names the open
    groups, how far each partition was read and committed, and the input's end offsets."""
    from bench.proc import RunnerFailed, RunnerProcess
    from bench.results import BenchSettings
    from bench.suite import _Bench
    from bench.workloads import Workload, create_topics, delete_topics, preload
    from rollout_stream.clients import Connection

    bench = _Bench(BenchSettings(bootstrap=kafka_bootstrap), lambda _: None)
    conn = Connection(kafka_bootstrap)
    topics = create_topics(conn, 2, tag="bench-short")
    try:
        pre = preload(conn, topics.names.input, Workload("a", 16, 4, 1, 6), drop_last=True)
        assert pre.records == 6 * 3
        proc = RunnerProcess(bench.spec("stage", topics, "exactly-once", pre))
        try:
            # Read all there is (a first join can take a while), then the drain cannot finish.
            proc.wait_until(lambda st: st["records_in"] == pre.records and len(st["open"]) == 5, timeout=60,
                            what="every record read")
            with pytest.raises(RunnerFailed) as failed:
                proc.wait_for("drained", timeout=3)
        finally:
            proc.kill()
    finally:
        delete_topics(conn, topics.all())
    message = str(failed.value)
    assert f"input end offsets {pre.end_offsets}" in message
    status = proc.last_status
    assert status["records_in"] == pre.records
    # every record read, nothing committed past the open groups' first members
    assert {int(p): n for p, n in status["read_to"].items()} == pre.end_offsets
    assert all(status["committed"].get(str(p), 0) == 0 for p in pre.end_offsets), status["committed"]
    assert len(status["open"]) == 5 and all(g.endswith(": 3/4") for g in status["open"]), status["open"]


def test_a_measurement_that_fails_is_reported_and_the_run_goes_on(monkeypatch):
    """A drain that failed twice costs its own row, not the run: the rest is measured and reported, the
    failure is named in the table and the JSON, and the command exits 1."""
    from rich.console import Console
    from typer.testing import CliRunner

    from bench import suite
    from bench.__main__ import app
    from bench.proc import RunnerFailed
    from bench.report import render
    from bench.results import BenchSettings, WorkloadResult
    from bench.workloads import Workload

    def workload(self, w, delivery, client=None):
        if w.group_size == 16:
            raise RunnerFailed("stage (exactly-once) gave no 'drained' within 120s; last status {...}")
        return WorkloadResult(w, delivery, _throughput("stage", 900), _throughput("passthrough", 1000), None)

    monkeypatch.setattr(suite._Bench, "workload", workload)
    settings = BenchSettings(bootstrap="127.0.0.1:1", memory=False, sweep=False, compare_clients=False,
                             compare_delivery=False, workloads=(Workload("a", 256, 8, 1, 10),
                                                                Workload("b", 32768, 16, 1, 10),
                                                                Workload("c", 256, 8, 3, 10)))
    seen: list[str] = []
    report = suite.run_bench(settings, seen.append)
    assert [r.workload.label() for r in report.results] == ["a 256t g8", "c 256t×3 g8"]
    assert len(report.failures) == 1 and report.failures[0].startswith("b 32Kt g16 [exactly-once, ")
    assert "gave no 'drained'" in report.failures[0] and any("not measured" in line for line in seen)
    assert report.to_json()["failures"] == report.failures
    console = Console(record=True, width=200)
    render(report, console)
    text = console.export_text()
    assert "Not measured" in text and "b 32Kt g16 [exactly-once" in text

    import bench.command as command
    from rollout_stream.clients import Connection

    monkeypatch.setattr(suite, "run_bench", lambda *a, **k: report)
    monkeypatch.setattr(command, "connection_from_options", lambda *a, **k: Connection("127.0.0.1:1"))
    result = CliRunner().invoke(app, ["run", "--bootstrap-servers", "127.0.0.1:1", "--json"])
    assert result.exit_code == 1, result.output
    assert '"failures"' in result.output and "1 measurement(s) failed" in result.output


def test_without_a_g8_measurement_the_cadence_sweep_is_reported_as_not_run(monkeypatch):
    from bench import suite
    from bench.proc import RunnerFailed
    from bench.results import BenchSettings
    from bench.workloads import Workload

    def workload(self, w, delivery, client=None):
        raise RunnerFailed("stage (exactly-once) exited (1) before 'drained'")

    monkeypatch.setattr(suite._Bench, "workload", workload)
    monkeypatch.setattr(suite._Bench, "sweep_point", lambda *a: pytest.fail("the sweep ran without (a) g8"))
    settings = BenchSettings(bootstrap="127.0.0.1:1", memory=False, compare_clients=False,
                             compare_delivery=False, workloads=(Workload("a", 256, 8, 1, 10),))
    report = suite.run_bench(settings)
    assert report.results == [] and report.targets()["complete"] is False
    assert len(report.failures) == 2 and report.failures[0].startswith("a 256t g8 [exactly-once, ")
    assert report.failures[1].startswith("commit cadence sweep: not run")


def test_thread_cpu_names_the_client_threads_beside_the_loop():
    """librdkafka's own threads (not Python's) are counted by their kernel names, beside `MainThread`."""
    import threading

    from confluent_kafka import Producer

    from bench.procstat import thread_cpu_seconds

    producer = Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    spin = threading.Thread(target=lambda: sum(range(2_000_000)), name="bench-spin")
    spin.start()
    spin.join()  # an ended thread is gone from /proc: not counted, and nothing fails
    try:
        threads = thread_cpu_seconds()
    finally:
        producer.flush(0)
        del producer
    assert "MainThread" in threads and threads["MainThread"] > 0
    assert any(name.startswith("rdk:") for name in threads), threads
    assert "bench-spin" not in threads
