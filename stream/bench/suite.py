"""The benchmark run: stage vs passthrough per workload, latency at half load, memory, delivery, cadence."""

from __future__ import annotations

import os
import platform
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from stream.bench.latency import LatencyResult, measure_latency
from stream.bench.proc import RunnerProcess
from stream.bench.runner import RunSpec
from stream.bench.workloads import (
    BenchTopics,
    Preloaded,
    Workload,
    create_topics,
    delete_topics,
    preload,
    standard_workloads,
)
from stream.clients import Connection

__all__ = [
    "BenchSettings",
    "Throughput",
    "WorkloadResult",
    "MemoryResult",
    "SweepPoint",
    "BenchReport",
    "run_bench",
    "THROUGHPUT_TARGET",
    "P99_TARGET_MS",
    "MEMORY_TARGET",
]

THROUGHPUT_TARGET = 0.85  # stage ≥ 0.85 × passthrough on workloads (a) and (b)
P99_TARGET_MS = 250.0  # at half of the measured maximum rate
MEMORY_TARGET = 1.5  # peak RSS ≤ 1.5 × open-window bytes + the idle worker's RSS

SWEEP_INTERVALS = (0.1, 0.5, 1.0, 2.0)
SWEEP_MAX_RECORDS = (1000, 5000, 20000)


@dataclass(frozen=True, slots=True)
class BenchSettings:
    bootstrap: str
    deliveries: tuple[str, ...] = ("exactly-once",)
    quick: bool = False
    partitions: int = 3
    commit_interval_s: float = 1.0
    commit_max_records: int = 5000
    latency_s: float = 4.0
    sweep_latency_s: float = 3.0
    memory: bool = True
    compare_delivery: bool = True  # EOS vs ALO on (a) and (b), g8, when only one delivery is benchmarked
    sweep: bool = True
    profile_dir: str | None = None
    workloads: tuple[Workload, ...] | None = None

    def suite(self) -> list[Workload]:
        return list(self.workloads) if self.workloads else standard_workloads(self.quick)


@dataclass
class Throughput:
    mode: str
    samples: int
    bytes: int
    seconds: float
    cpu_s: float
    loop_cpu_s: float  # the processing thread alone (kafka-python's IO/sender threads excluded)
    commits: int
    final_commit_s: float | None
    thread_cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "samples": self.samples,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "samples_per_s": round(self.samples_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 2),
            "cpu_s": round(self.cpu_s, 2),
            "loop_cpu_us_per_sample": round(self.loop_cpu_s / self.samples * 1e6, 1)
            if self.samples
            else None,
            "commits": self.commits,
            "thread_cpu_s": self.thread_cpu_s,
        }


@dataclass
class WorkloadResult:
    workload: Workload
    delivery: str
    stage: Throughput
    passthrough: Throughput
    latency: LatencyResult | None

    @property
    def ratio(self) -> float:
        return (
            self.stage.samples_per_s / self.passthrough.samples_per_s
            if self.passthrough.samples_per_s
            else 0.0
        )

    def to_json(self) -> dict[str, Any]:
        w = self.workload
        return {
            "workload": w.name,
            "label": w.label(),
            "tokens": w.tokens,
            "group_size": w.group_size,
            "siblings": w.siblings,
            "delivery": self.delivery,
            "stage": self.stage.to_json(),
            "passthrough": self.passthrough.to_json(),
            "ratio": round(self.ratio, 3),
            "latency": self.latency.to_json() if self.latency else None,
        }


@dataclass
class MemoryResult:
    workload: Workload
    base_rss: int
    peak_rss: int
    open_bytes: int
    open_windows: int

    @property
    def ratio(self) -> float:
        """Memory above the idle worker per byte held in open windows."""
        return (self.peak_rss - self.base_rss) / self.open_bytes if self.open_bytes else 0.0

    @property
    def ok(self) -> bool:
        return self.peak_rss <= MEMORY_TARGET * self.open_bytes + self.base_rss

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload.label(),
            "base_rss": self.base_rss,
            "peak_rss": self.peak_rss,
            "open_bytes": self.open_bytes,
            "open_windows": self.open_windows,
            "ratio": round(self.ratio, 3),
            "ok": self.ok,
        }


@dataclass
class SweepPoint:
    commit_interval_s: float
    commit_max_records: int
    stage: Throughput
    latency: LatencyResult | None

    def to_json(self) -> dict[str, Any]:
        return {
            "commit_interval_s": self.commit_interval_s,
            "commit_max_records": self.commit_max_records,
            "samples_per_s": round(self.stage.samples_per_s, 1),
            "commits": self.stage.commits,
            "latency": self.latency.to_json() if self.latency else None,
        }


@dataclass
class BenchReport:
    settings: BenchSettings
    machine: dict[str, Any]
    results: list[WorkloadResult] = field(default_factory=list)
    delivery_compare: list[WorkloadResult] = field(default_factory=list)
    memory: list[MemoryResult] = field(default_factory=list)
    sweep: list[SweepPoint] = field(default_factory=list)
    sweep_workload: Workload | None = None
    seconds: float = 0.0

    def targets(self) -> dict[str, Any]:
        main = [r for r in self.results if r.workload.name in ("a", "b")]
        lat = [r.latency.p99_ms for r in self.results if r.latency and r.latency.p99_ms is not None]
        return {
            "throughput_ratio_min_ab": round(min((r.ratio for r in main), default=0.0), 3),
            "throughput_ok": bool(main) and all(r.ratio >= THROUGHPUT_TARGET for r in main),
            "p99_ms_max": max(lat, default=None),
            "p99_ok": bool(lat) and all(x <= P99_TARGET_MS for x in lat),
            "memory_ratio_max": round(max((m.ratio for m in self.memory), default=0.0), 3),
            "memory_ok": bool(self.memory) and all(m.ok for m in self.memory),
        }

    def to_json(self) -> dict[str, Any]:
        s = self.settings
        return {
            "machine": self.machine,
            "settings": {
                "deliveries": list(s.deliveries),
                "quick": s.quick,
                "partitions": s.partitions,
                "commit_interval_s": s.commit_interval_s,
                "commit_max_records": s.commit_max_records,
                "latency_s": s.latency_s,
            },
            "results": [r.to_json() for r in self.results],
            "delivery_compare": [r.to_json() for r in self.delivery_compare],
            "memory": [m.to_json() for m in self.memory],
            "sweep": {
                "workload": self.sweep_workload.label() if self.sweep_workload else None,
                "points": [p.to_json() for p in self.sweep],
            },
            "targets": self.targets(),
            "seconds": round(self.seconds, 1),
        }


def machine_info() -> dict[str, Any]:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        mem = 0
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_bytes": mem,
        "python": platform.python_version(),
        "kafka_python": version("kafka-python"),
        "platform": platform.platform(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }


Progress = Callable[[str], None]


class _Bench:
    def __init__(self, settings: BenchSettings, progress: Progress) -> None:
        self.s = settings
        self.conn = Connection(settings.bootstrap, client_id="rollout-stream-bench")
        self.progress = progress

    def spec(
        self,
        mode: str,
        topics: BenchTopics,
        delivery: str,
        pre: Preloaded,
        *,
        serve_after: bool = False,
        interval: float | None = None,
        max_records: int | None = None,
        tag: str = "",
    ) -> RunSpec:
        gid = f"bench-{mode}-{uuid.uuid4().hex[:8]}"
        profile = (
            os.path.join(self.s.profile_dir, f"{tag}-{delivery}-{mode}.prof")
            if self.s.profile_dir and tag
            else None
        )
        return RunSpec(
            mode=mode,
            bootstrap=self.s.bootstrap,
            input_topic=topics.names.input,
            output_topic=topics.names.output,
            dead_letter_topic=topics.names.dead_letter,
            group_id=gid,
            delivery=delivery,
            end_offsets=pre.end_offsets,
            serve_after=serve_after,
            profile=profile,
            commit_interval_s=self.s.commit_interval_s if interval is None else interval,
            commit_max_records=self.s.commit_max_records if max_records is None else max_records,
        )

    @staticmethod
    def throughput(mode: str, pre: Preloaded, drained: dict[str, Any]) -> Throughput:
        threads = drained.get("thread_cpu_s", {})
        return Throughput(
            mode=mode,
            samples=pre.records,
            bytes=pre.bytes,
            seconds=drained["seconds"],
            cpu_s=drained["cpu_s"],
            loop_cpu_s=threads.get("MainThread", 0.0),
            commits=drained["commits"],
            final_commit_s=drained.get("final_commit_s"),
            thread_cpu_s=threads,
        )

    def stage_run(
        self,
        topics: BenchTopics,
        delivery: str,
        pre: Preloaded,
        w: Workload,
        *,
        latency: bool,
        interval: float | None = None,
        max_records: int | None = None,
        latency_s: float | None = None,
        tag: str = "",
    ) -> tuple[Throughput, LatencyResult | None]:
        """Drain the preloaded backlog (max rate), then offer paced load (half of it, or `rate`)."""
        proc = RunnerProcess(
            self.spec(
                "stage",
                topics,
                delivery,
                pre,
                serve_after=latency,
                interval=interval,
                max_records=max_records,
                tag=tag,
            )
        )
        try:
            tp = self.throughput("stage", pre, proc.wait_for("drained", timeout=240))
            lat = None
            if latency:
                lat = measure_latency(
                    self.conn,
                    topics.names.input,
                    topics.names.output,
                    w,
                    rate=tp.samples_per_s / 2,
                    seconds=latency_s or self.s.latency_s,
                    run_id=f"lat-{uuid.uuid4().hex[:6]}",
                )
                proc.stop()
            else:
                proc.wait_for("result", timeout=60)
            return tp, lat
        finally:
            proc.kill()

    def passthrough_run(
        self, topics: BenchTopics, delivery: str, pre: Preloaded, tag: str = ""
    ) -> Throughput:
        proc = RunnerProcess(self.spec("passthrough", topics, delivery, pre, tag=tag))
        try:
            tp = self.throughput("passthrough", pre, proc.wait_for("drained", timeout=240))
            proc.wait_for("result", timeout=60)
            return tp
        finally:
            proc.kill()

    def workload(self, w: Workload, delivery: str) -> WorkloadResult:
        topics = create_topics(self.conn, self.s.partitions)
        try:
            pre = preload(self.conn, topics.names.input, w)
            tag = f"{w.name}-g{w.group_size}"
            passthrough = self.passthrough_run(topics, delivery, pre, tag)
            stage, lat = self.stage_run(topics, delivery, pre, w, latency=True, tag=tag)
        finally:
            delete_topics(self.conn, topics.all())
        r = WorkloadResult(w, delivery, stage, passthrough, lat)
        self.progress(
            f"{w.label()} [{delivery}]: stage {stage.samples_per_s:,.0f}/s, passthrough "
            f"{passthrough.samples_per_s:,.0f}/s, ratio {r.ratio:.2f}, p99 "
            f"{lat.p99_ms if lat else '-'} ms"
        )
        return r

    def memory(self, w: Workload, open_groups: int) -> MemoryResult:
        """Idle RSS after a warm-up drain, then RSS while `open_groups` groups miss their last member."""
        topics = create_topics(self.conn, self.s.partitions)
        try:
            warm = preload(self.conn, topics.names.input, w, groups=max(2, w.groups // 10))
            proc = RunnerProcess(self.spec("stage", topics, "exactly-once", warm, serve_after=True))
            try:
                drained = proc.wait_for("drained", timeout=240)
                loaded = preload(self.conn, topics.names.input, w, groups=open_groups, drop_last=True)
                total = warm.records + loaded.records
                proc.wait_until(lambda st: st["records_in"] >= total, timeout=240, what="open windows filled")
                time.sleep(1.0)
                status = proc.wait_for("status", timeout=10)
                proc.stop()
            finally:
                proc.kill()
        finally:
            delete_topics(self.conn, topics.all())
        m = MemoryResult(
            w,
            base_rss=drained["rss"],
            peak_rss=status["peak_rss"],
            open_bytes=status["open_bytes"],
            open_windows=status["open_windows"],
        )
        self.progress(
            f"memory {w.label()}: {m.open_windows} open windows, {m.open_bytes / 1e6:.0f} MB; RSS "
            f"{m.base_rss / 1e6:.0f} → peak {m.peak_rss / 1e6:.0f} MB ({m.ratio:.2f} x open bytes)"
        )
        return m

    def sweep_point(self, w: Workload, delivery: str, interval: float, max_records: int) -> SweepPoint:
        """One cadence: its own maximum rate, then latency at half of it (as in the main table)."""
        topics = create_topics(self.conn, self.s.partitions)
        try:
            pre = preload(self.conn, topics.names.input, w)
            tp, lat = self.stage_run(
                topics,
                delivery,
                pre,
                w,
                latency=True,
                interval=interval,
                max_records=max_records,
                latency_s=self.s.sweep_latency_s,
            )
        finally:
            delete_topics(self.conn, topics.all())
        self.progress(
            f"cadence {interval:g}s/{max_records}: {tp.samples_per_s:,.0f}/s, p50 "
            f"{lat.p50_ms if lat else '-'} p99 {lat.p99_ms if lat else '-'} ms at "
            f"{lat.rate if lat else 0:,.0f}/s"
        )
        return SweepPoint(interval, max_records, tp, lat)


def run_bench(settings: BenchSettings, progress: Progress = lambda _: None) -> BenchReport:
    started = time.monotonic()
    bench = _Bench(settings, progress)
    report = BenchReport(settings, machine_info())
    suite = settings.suite()
    for delivery in settings.deliveries:
        for w in suite:
            report.results.append(bench.workload(w, delivery))
    if settings.compare_delivery and len(settings.deliveries) == 1 and not settings.quick:
        other = "at-least-once" if settings.deliveries[0] == "exactly-once" else "exactly-once"
        for w in suite:
            if w.group_size == 8 and w.name in ("a", "b"):
                report.delivery_compare.append(bench.workload(w, other))
    if settings.memory and not settings.quick:
        long = next(w for w in suite if w.name == "b")
        short = next(w for w in suite if w.name == "a")
        report.memory.append(bench.memory(Workload("b", long.tokens, 16, 1, 40), open_groups=64))
        report.memory.append(bench.memory(Workload("a", short.tokens, 16, 1, 400), open_groups=3000))
    if settings.sweep and not settings.quick:
        base = next(
            (r for r in report.results if r.workload.name == "a" and r.workload.group_size == 8), None
        )
        if base is not None:
            w = Workload("a", base.workload.tokens, 8, 1, 750)
            report.sweep_workload = w
            for interval in SWEEP_INTERVALS:
                for max_records in SWEEP_MAX_RECORDS:
                    report.sweep.append(bench.sweep_point(w, base.delivery, interval, max_records))
    report.machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    report.seconds = time.monotonic() - started
    return report
