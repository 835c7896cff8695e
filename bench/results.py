"""What a benchmark run found: throughput per side, latency, memory, cadence points, and the targets."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

from bench.latency import LatencyResult
from bench.workloads import Workload, standard_workloads
from rollout_stream.clients import default_client
from rollout_stream.codec import compiled

__all__ = [
    "THROUGHPUT_TARGET",
    "P99_TARGET_MS",
    "MEMORY_TARGET",
    "LIBRDKAFKA_TARGETS",
    "BenchSettings",
    "Throughput",
    "WorkloadResult",
    "MemoryResult",
    "SweepPoint",
    "BenchReport",
    "machine_info",
]

THROUGHPUT_TARGET = 0.85  # stage ≥ 0.85 × passthrough on workloads (a) and (b)
P99_TARGET_MS = 250.0  # at half of the measured maximum rate
MEMORY_TARGET = 1.5  # peak RSS ≤ 1.5 × open-window bytes + the idle worker's RSS
# On librdkafka, groups of 8: stage ≥ these × the librdkafka passthrough, stage on (a) ≥ 3 × the kafka-python
# stage, p99 at half load ≤ 100 ms.
LIBRDKAFKA_TARGETS = {"ratio_a": 0.5, "ratio_b": 0.85, "vs_kafka_python_a": 3.0, "p99_ms": 100.0}


@dataclass(frozen=True, slots=True)
class BenchSettings:
    bootstrap: str
    deliveries: tuple[str, ...] = ("exactly-once",)
    quick: bool = False
    partitions: int = 3
    commit_interval_s: float = 0.1  # the worker's default (WorkerConfig.commit_interval_s)
    commit_max_records: int = 5000
    latency_s: float = 4.0
    repeats: int = 2  # throughput drains per side and workload, alternating; the fastest is reported
    sweep_latency_s: float = 3.0
    memory: bool = True
    compare_delivery: bool = True  # EOS vs ALO on (a) and (b), g8, when only one delivery is benchmarked
    sweep: bool = True
    profile_dir: str | None = None
    workloads: tuple[Workload, ...] | None = None
    compare_clients: bool = True  # (a) and (b), g8, also on the other Kafka client
    # Offered in every workload's latency phases, stage and passthrough alike, instead of half the stage's
    # drain: both sides at one load. The p99 targets are then not judged (they are at half load).
    latency_rate: float | None = None
    write_heads: bool = False  # the stage writes group heads (`run --write-heads`)

    @property
    def at_half_load(self) -> bool:
        """The latency phases ran at half the stage's drain, where the p99 targets are set."""
        return self.latency_rate is None

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
    # Outputs of the drain over the span of their broker append timestamps: the rate seen from outside the
    # process (it leaves out the time to the first output, so it reads a little higher).
    appended: int = 0
    append_span_s: float = 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    @property
    def appended_per_s(self) -> float | None:
        return self.appended / self.append_span_s if self.append_span_s > 0 else None

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
            "appended": self.appended,
            "appended_per_s": round(self.appended_per_s, 1) if self.appended_per_s else None,
        }


@dataclass
class WorkloadResult:
    workload: Workload
    delivery: str
    stage: Throughput
    passthrough: Throughput
    latency: LatencyResult | None
    passthrough_latency: LatencyResult | None = None  # same offered rate as `latency`
    client: str = ""  # the Kafka client both sides ran on
    pair_ratios: list[float] = field(default_factory=list)  # stage/passthrough of each alternating pair

    @property
    def spread(self) -> tuple[float, float] | None:
        """The lowest and highest ratio of one stage drain to the passthrough drain next to it."""
        return (min(self.pair_ratios), max(self.pair_ratios)) if len(self.pair_ratios) > 1 else None

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
            "client": self.client,
            "stage": self.stage.to_json(),
            "passthrough": self.passthrough.to_json(),
            "ratio": round(self.ratio, 3),
            "pair_ratios": [round(r, 3) for r in self.pair_ratios],
            "latency": self.latency.to_json() if self.latency else None,
            "passthrough_latency": self.passthrough_latency.to_json() if self.passthrough_latency else None,
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
    client_compare: list[WorkloadResult] = field(default_factory=list)
    memory: list[MemoryResult] = field(default_factory=list)
    sweep: list[SweepPoint] = field(default_factory=list)
    sweep_workload: Workload | None = None
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)  # what was not measured, and why (the run went on)

    def targets(self) -> dict[str, Any]:
        """Each target met (True), not met (False), or not measured (None: e.g. memory in a --quick run)."""
        main = [r for r in self.results if r.workload.name in ("a", "b")]
        lat = [r.latency.p99_ms for r in self.results if r.latency and r.latency.p99_ms is not None
               and self.settings.at_half_load]
        return {
            "throughput_ratio_min_ab": round(min(r.ratio for r in main), 3) if main else None,
            "throughput_ok": all(r.ratio >= THROUGHPUT_TARGET for r in main) if main else None,
            "p99_ms_max": max(lat, default=None),
            "p99_ok": all(x <= P99_TARGET_MS for x in lat) if lat else None,
            "memory_ratio_max": round(max(m.ratio for m in self.memory), 3) if self.memory else None,
            "memory_ok": all(m.ok for m in self.memory) if self.memory else None,
            "librdkafka": self.librdkafka_targets(),
            "complete": not self.failures,  # False: the verdicts above judge only what was measured
        }

    def _g8(self, client: str, name: str) -> WorkloadResult | None:
        delivery = self.settings.deliveries[0]
        return next((r for r in self.results + self.client_compare
                     if r.client == client and r.delivery == delivery and r.workload.name == name
                     and r.workload.group_size == 8 and r.workload.siblings == 1), None)

    def librdkafka_targets(self) -> dict[str, Any] | None:
        """The targets: the stage on librdkafka against its passthrough and against the kafka-python stage."""
        rd_a, rd_b = self._g8("confluent", "a"), self._g8("confluent", "b")
        kp_a = self._g8("kafka-python", "a")
        if rd_a is None and rd_b is None:
            return None
        t = LIBRDKAFKA_TARGETS
        out: dict[str, Any] = {}
        if rd_a is not None:
            out["ratio_a"] = round(rd_a.ratio, 3)
            out["ratio_a_ok"] = rd_a.ratio >= t["ratio_a"]
            p99 = rd_a.latency.p99_ms if rd_a.latency else None
            out["p99_ms_a"] = p99
            out["p99_ok"] = p99 <= t["p99_ms"] if p99 is not None and self.settings.at_half_load else None
        if rd_b is not None:
            out["ratio_b"] = round(rd_b.ratio, 3)
            out["ratio_b_ok"] = rd_b.ratio >= t["ratio_b"]
        if rd_a is not None and kp_a is not None and kp_a.stage.samples_per_s:
            x = rd_a.stage.samples_per_s / kp_a.stage.samples_per_s
            out["vs_kafka_python_a"] = round(x, 2)
            out["vs_kafka_python_a_ok"] = x >= t["vs_kafka_python_a"]
        return out

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
                "latency_rate": s.latency_rate,
                "repeats": s.repeats,
                "write_heads": s.write_heads,
            },
            "results": [r.to_json() for r in self.results],
            "delivery_compare": [r.to_json() for r in self.delivery_compare],
            "client_compare": [r.to_json() for r in self.client_compare],
            "memory": [m.to_json() for m in self.memory],
            "sweep": {
                "workload": self.sweep_workload.label() if self.sweep_workload else None,
                "points": [p.to_json() for p in self.sweep],
            },
            "targets": self.targets(),
            "failures": list(self.failures),
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
        "confluent_kafka": version("confluent-kafka"),
        "client": default_client(),
        "hot_path": compiled.status().describe(),
        "platform": platform.platform(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }
