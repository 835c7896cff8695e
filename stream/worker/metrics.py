"""Prometheus metrics and health endpoints of a running worker (`rollout-stream run --metrics-port N`).

    /metrics   Prometheus text format, names prefixed `rollout_stream_`
    /healthz   200 while the processing loop ticked within `alive_within_s` (liveness), else 503
    /readyz    200 once partitions are assigned and every restore is done (readiness), else 503

Counters and gauges are read from `worker.stats` / `worker.store` at scrape time by a custom collector, so the
loop pays nothing for them; only the histograms (batch processing time, end-to-end latency, commit duration)
are observed by the worker, through `LoopMetrics`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from rollout_stream.errors import ConfigurationError
from rollout_stream.worker.outputs import STAGE_VERSION
from rollout_stream.worker.progress import ProgressCollector, StageProgressPublisher

__all__ = ["LoopMetrics", "MetricsPortUnavailable", "WorkerCollector", "MetricsServer", "serve_metrics"]


class MetricsPortUnavailable(ConfigurationError, OSError):
    """The metrics port cannot be listened on (taken, or privileged): choose another --metrics-port."""

PREFIX = "rollout_stream"
# Batches are tens of ms; end-to-end latency is dominated by the commit cadence (up to seconds).
_BATCH_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_COMMIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopMetrics:
    """The observations the worker's loop makes (the only metrics it touches itself)."""

    def __init__(self, registry: CollectorRegistry, delivery: str) -> None:
        self.batch_seconds = Histogram(
            f"{PREFIX}_batch_processing_seconds",
            "Time to process one polled batch: decode, window, normalize, hand outputs to the producer.",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.end_to_end_seconds = Histogram(
            f"{PREFIX}_end_to_end_latency_seconds",
            "From the Kafka timestamp of a group's last member to the commit that published the group "
            "(exactly-once: when read_committed consumers see it).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        commit = Histogram(
            f"{PREFIX}_commit_duration_seconds",
            "Duration of one commit: the transaction commit (exactly-once) or flush + offset commit "
            "(at-least-once).",
            ["delivery"],
            buckets=_COMMIT_BUCKETS,
            registry=registry,
        )
        self.commit_seconds = commit.labels(delivery=delivery)

    def observe_batch(self, seconds: float) -> None:
        self.batch_seconds.observe(seconds)

    def observe_commit(self, seconds: float, published_ts_ms: Iterable[int], now_ms: int) -> None:
        self.commit_seconds.observe(seconds)
        for ts in published_ts_ms:
            self.end_to_end_seconds.observe(max(0.0, (now_ms - ts) / 1000))


def _copy(mapping: Any) -> dict[Any, Any]:
    """A snapshot of a dict the worker thread may be changing (retry on a resize mid-copy)."""
    for _ in range(5):
        try:
            return dict(mapping)
        except RuntimeError:
            continue
    return {}


class WorkerCollector(Collector):
    """Counters and gauges read from a live worker at scrape time."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        snap = w.snapshot  # published whole by the loop at each tick: nothing of the loop's own is touched
        s = snap.stats

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            return CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)

        info = GaugeMetricFamily(
            f"{PREFIX}_info",
            "Stage version and settings.",
            labels=["version", "delivery", "group_id", "input_topic"],
        )
        info.add_metric([STAGE_VERSION, w.config.delivery, w.config.group_id, w.config.topics.input], 1)
        yield info
        yield counter("samples_in", "Input records consumed.", s.records_in)
        yield counter("samples_published", "Train samples published (counted when their commit lands).",
                      s.samples_published)
        yield counter("groups_published", "Prompt groups published (counted when their commit lands).",
                      s.groups_published)
        by_reason = CounterMetricFamily(
            f"{PREFIX}_dead_letters", "Records dead-lettered, by reason.", labels=["reason"]
        )
        groups_by_reason = CounterMetricFamily(
            f"{PREFIX}_dead_letter_groups",
            "Groups (or lone records) dead-lettered, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(_copy(s.dead_lettered).items()):
            by_reason.add_metric([reason], n)
        for reason, n in sorted(_copy(s.dead_letter_groups).items()):
            groups_by_reason.add_metric([reason], n)
        yield by_reason
        yield groups_by_reason
        yield counter("duplicates", "Identical duplicate records dropped.", s.duplicates)
        yield counter(
            "zero_variance_groups", "Groups whose rollouts all share one reward.", s.zero_variance_groups
        )
        yield counter(
            "zero_variance_dropped_samples",
            "Samples of zero-variance groups dropped by policy.",
            s.zero_variance_dropped,
        )
        yield counter("commits", "Successful commits (transactions or offset commits).", s.commits)
        yield counter(
            "transaction_aborts", "Aborted transactions (state restored from the last commit).", s.aborts
        )
        yield counter("restores", "Partition state restores.", s.restores)
        yield gauge("open_windows", "Prompt groups currently open.", snap.open_windows)
        yield gauge("open_window_bytes", "Bytes of input records held in open windows and in the chunks of "
                    "values not yet whole.", snap.open_bytes)
        yield gauge("open_chunked_values", "Values larger than a record whose chunks are still arriving.",
                    snap.open_chunked_values)
        yield gauge("open_windows_limit", "--max-open-groups: fetching pauses at this many open groups.",
                    w.config.max_open_groups)
        yield gauge("open_window_bytes_limit", "--max-open-mib in bytes: fetching pauses at this many bytes.",
                    w.config.max_open_bytes)
        yield gauge("dead_letter_window_ratio",
                    "Dead-lettered share of the last --dead-letter-window resolved input records.",
                    snap.dead_letter_ratio)
        yield gauge("dead_letter_ratio_limit", "--max-dead-letter-ratio: the worker stops above this share.",
                    w.config.max_dead_letter_ratio)
        yield gauge(
            "closed_groups_remembered",
            "Resolved groups remembered to recognise late members.",
            snap.closed_groups,
        )
        yield gauge("paused", "1 while fetching is paused by back-pressure.", 1 if s.paused else 0)
        yield gauge("ready", "1 once partitions are assigned and restored.", 1 if snap.ready else 0)
        yield gauge(
            "loop_last_tick_age_seconds",
            "Seconds since the processing loop last ticked.",
            max(0.0, time.monotonic() - snap.last_tick) if snap.last_tick else float("nan"),
        )
        lag = GaugeMetricFamily(
            f"{PREFIX}_consumer_lag",
            "Records behind the high watermark, per input partition.",
            labels=["topic", "partition"],
        )
        for p, n in sorted(snap.lag.items()):
            lag.add_metric([w.config.topics.input, str(p)], n)
        yield lag


class _Handler(BaseHTTPRequestHandler):
    server: MetricsServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._reply(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            ok, text = self.server.alive()
            self._reply(200 if ok else 503, text.encode())
        elif path == "/readyz":
            ok, text = self.server.ready()
            self._reply(200 if ok else 503, text.encode())
        else:
            self._reply(404, b"not found: try /metrics, /healthz or /readyz\n")

    def _reply(self, code: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - scrapes are not worth a log line
        pass


class MetricsServer(ThreadingHTTPServer):
    """/metrics, /healthz and /readyz for one worker, on a daemon thread."""

    daemon_threads = True

    def __init__(self, worker: Any, port: int, host: str = "0.0.0.0", alive_within_s: float = 60.0) -> None:
        super().__init__((host, port), _Handler)
        self.worker = worker
        self.alive_within_s = alive_within_s
        self.started = time.monotonic()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(WorkerCollector(worker))
        # Pacing (docs/pacing.md): producers', trainers' and this stage's positions, via the progress topic.
        self.progress = ProgressCollector(worker)
        self.registry.register(self.progress)
        self.stage_progress = StageProgressPublisher(worker)
        worker.observe_with(LoopMetrics(self.registry, worker.config.delivery))
        self.thread = threading.Thread(target=self.serve_forever, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def alive(self) -> tuple[bool, str]:
        tick = self.worker.snapshot.last_tick
        if not tick:
            # Not looping yet (connecting, waiting for the input topic): alive unless that takes too long.
            age = time.monotonic() - self.started
            return age < self.alive_within_s, f"starting ({age:.0f}s)\n"
        age = time.monotonic() - tick
        if age < self.alive_within_s:
            return True, f"ok: loop ticked {age:.1f}s ago\n"
        return False, f"stalled: loop last ticked {age:.0f}s ago (limit {self.alive_within_s:g}s)\n"

    def ready(self) -> tuple[bool, str]:
        if self.worker.snapshot.ready:
            return True, "ready\n"
        return False, "not ready: waiting for partition assignment or restore\n"

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        self.stage_progress.close()
        self.progress.close()


def serve_metrics(worker: Any, port: int, host: str = "0.0.0.0") -> MetricsServer:
    """Start the endpoint for `worker` (before `worker.run()`, so the loop's observations are recorded)."""
    try:
        return MetricsServer(worker, port, host).start()
    except OSError as exc:
        raise MetricsPortUnavailable(f"cannot serve metrics on port {port}: {exc}") from exc
