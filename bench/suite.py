"""The benchmark run: stage vs passthrough per workload, latency at half load, memory, delivery, cadence."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from bench.latency import LatencyResult, measure_latency
from bench.proc import RunnerFailed, RunnerProcess
from bench.results import (
    BenchReport,
    BenchSettings,
    MemoryResult,
    SweepPoint,
    Throughput,
    WorkloadResult,
    machine_info,
)
from bench.runner import RunSpec
from bench.workloads import (
    BenchTopics,
    Preloaded,
    PreloadFailed,
    Workload,
    append_span,
    create_topics,
    delete_topics,
    end_offsets,
    preload,
    standard_workloads,
)
from rollout_stream.clients import CLIENTS, MAX_RECORD_BYTES, Connection
from rollout_stream.kafka import TopicPartition, client_for

__all__ = ["run_bench", "SWEEP_INTERVALS", "SWEEP_MAX_RECORDS"]

T = TypeVar("T")

# kafka-python 3.0 can busy-loop looking for a group coordinator (dpkp/kafka-python#2667, #2672) and never
# join: a measurement that has not drained in this long is retried once in a new process.
DRAIN_TIMEOUT_S = 120.0
FIRST_RECORD_S = 30.0  # a drain that has read nothing by then is one of those: retried at once
SWEEP_INTERVALS = (0.1, 0.5, 1.0, 2.0)
SWEEP_MAX_RECORDS = (1000, 5000, 20000)


Progress = Callable[[str], None]


class _Bench:
    def __init__(self, settings: BenchSettings, progress: Progress, security: Any = None) -> None:
        self.s = settings
        self.security = security
        self.conn = Connection(settings.bootstrap, client_id="rollout-stream-bench",
                               **({"security": security} if security is not None else {}))
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
            security=self.security.to_values() if self.security is not None else None,
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
            client=self.conn.client,
            write_heads=self.s.write_heads and mode == "stage",
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

    def catch_up(self, proc: RunnerProcess, topic: str) -> None:
        """Wait until the process has read all of `topic` as it is now: the passthrough drains after the
        stage, behind the stage's latency groups, and must not carry that backlog into its own latency
        phase."""
        consumer = client_for(self.conn).assigned_consumer(client_id=self.conn.client_id,
                                                           max_record_bytes=MAX_RECORD_BYTES)
        try:
            tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
            total = sum(consumer.end_offsets(tps).values())  # input records only: no transaction markers
        finally:
            consumer.close()
        proc.wait_until(lambda st: st["records_in"] >= total, timeout=DRAIN_TIMEOUT_S,
                        what="the rest of the input read before the latency phase")

    def drain(
        self,
        mode: str,
        topics: BenchTopics,
        delivery: str,
        pre: Preloaded,
        *,
        latency_of: Workload | None = None,
        rate: float | None = None,
        latency_s: float | None = None,
        interval: float | None = None,
        max_records: int | None = None,
        tag: str = "",
    ) -> tuple[Throughput, LatencyResult | None]:
        """Drain the preloaded backlog with one `mode` process (its maximum rate); with `latency_of`, then
        offer that workload paced at `rate` samples/s (default: half the rate just measured). A process that
        fails is replaced once."""
        for attempt in (1, 2):
            spec = self.spec(mode, topics, delivery, pre, serve_after=latency_of is not None,
                             interval=interval, max_records=max_records, tag=tag)
            before = end_offsets(self.conn, topics.names.output)
            proc = RunnerProcess(spec)
            try:
                drained = proc.wait_for("drained", timeout=DRAIN_TIMEOUT_S,
                                        first_record_within=FIRST_RECORD_S)
                tp = self.throughput(mode, pre, drained)
                # Committed before "drained": the outputs of this drain, before any latency-phase output.
                tp.appended, tp.append_span_s = append_span(self.conn, topics.names.output, before,
                                                            end_offsets(self.conn, topics.names.output))
                lat = None
                if latency_of is not None:
                    self.catch_up(proc, topics.names.input)
                    lat = measure_latency(
                        self.conn,
                        topics.names.input,
                        topics.names.output,
                        latency_of,
                        rate=rate or tp.samples_per_s / 2,
                        seconds=latency_s or self.s.latency_s,
                        run_id=f"lat-{uuid.uuid4().hex[:6]}",
                    )
                    proc.stop()
                else:
                    proc.wait_for("result", timeout=60)
                return tp, lat
            except RunnerFailed as exc:
                if attempt == 2:
                    raise
                self.progress(f"{mode} run failed, retrying once with a new process: {exc}")
            finally:
                proc.kill()
        raise AssertionError("unreachable")

    def workload(self, w: Workload, delivery: str, client: str | None = None) -> WorkloadResult:
        """Stage and passthrough on `w`, both on `client` (default: the connection's)."""
        if client is not None and client != self.conn.client:
            on_client = _Bench(self.s, self.progress, self.security)
            on_client.conn = replace(self.conn, client=client)
            return on_client.workload(w, delivery)
        topics = create_topics(self.conn, self.s.partitions, heads=self.s.write_heads)
        try:
            pre = preload(self.conn, topics.names.input, w)
            tag = w.key
            stage, lat = self.drain("stage", topics, delivery, pre, latency_of=w, rate=self.s.latency_rate,
                                    tag=tag)
            # the bare clients' latency at the rate the stage was offered
            passthrough, pass_lat = self.drain(
                "passthrough", topics, delivery, pre, latency_of=w, rate=lat.rate if lat else None, tag=tag
            )
            # On a shared machine one drain can be slowed by anything else running: alternate further drains
            # of the same backlog (fresh consumer groups) and keep each side's fastest; each pair's ratio is
            # kept too, for the spread.
            pairs = [_pair_ratio(stage, passthrough)]
            for i in range(2, self.s.repeats + 1):
                again, _ = self.drain("stage", topics, delivery, pre, tag=f"{tag}-r{i}")
                other, _ = self.drain("passthrough", topics, delivery, pre, tag=f"{tag}-r{i}")
                pairs.append(_pair_ratio(again, other))
                stage = max(stage, again, key=lambda t: t.samples_per_s)
                passthrough = max(passthrough, other, key=lambda t: t.samples_per_s)
        finally:
            delete_topics(self.conn, topics.all())
        r = WorkloadResult(w, delivery, stage, passthrough, lat, pass_lat, client=self.conn.client,
                           pair_ratios=pairs)
        self.progress(
            f"{w.label()} [{delivery}, {self.conn.client}]: stage {stage.samples_per_s:,.0f}/s, passthrough "
            f"{passthrough.samples_per_s:,.0f}/s, ratio {r.ratio:.2f}, p99 "
            f"{lat.p99_ms if lat else '-'} ms (passthrough {pass_lat.p99_ms if pass_lat else '-'} ms)"
        )
        return r

    def memory(self, w: Workload, open_groups: int) -> MemoryResult:
        """Idle RSS after a warm-up drain, then RSS while `open_groups` groups miss their last member."""
        topics = create_topics(self.conn, self.s.partitions, heads=self.s.write_heads)
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
        topics = create_topics(self.conn, self.s.partitions, heads=self.s.write_heads)
        try:
            pre = preload(self.conn, topics.names.input, w)
            tp, lat = self.drain("stage", topics, delivery, pre, latency_of=w, interval=interval,
                                 max_records=max_records, latency_s=self.s.sweep_latency_s)
        finally:
            delete_topics(self.conn, topics.all())
        self.progress(
            f"cadence {interval:g}s/{max_records}: {tp.samples_per_s:,.0f}/s, p50 "
            f"{lat.p50_ms if lat else '-'} p99 {lat.p99_ms if lat else '-'} ms at "
            f"{lat.rate if lat else 0:,.0f}/s"
        )
        return SweepPoint(interval, max_records, tp, lat)


def _pair_ratio(stage: Throughput, passthrough: Throughput) -> float:
    return stage.samples_per_s / passthrough.samples_per_s if passthrough.samples_per_s else 0.0


def run_bench(
    settings: BenchSettings, progress: Progress = lambda _: None, security: Any = None
) -> BenchReport:
    started = time.monotonic()
    bench = _Bench(settings, progress, security)
    report = BenchReport(settings, machine_info())

    def measured(what: str, measure: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
        """`measure(*args, **kwargs)`, or None when its processes failed twice or its preload failed: that is
        recorded in the report and the run goes on (a full run takes ten minutes; one lost drain should not
        lose the rest)."""
        try:
            return measure(*args, **kwargs)
        except (RunnerFailed, PreloadFailed) as exc:
            report.failures.append(f"{what}: {exc}")
            progress(f"{what} not measured: {exc}")
            return None

    def workload(w: Workload, delivery: str, client: str | None = None) -> WorkloadResult | None:
        label = f"{w.label()} [{delivery}, {client or bench.conn.client}]"
        return measured(label, bench.workload, w, delivery, client)

    suite = settings.suite()
    for delivery in settings.deliveries:
        for w in suite:
            if (r := workload(w, delivery)) is not None:
                report.results.append(r)
    if settings.compare_delivery and len(settings.deliveries) == 1 and not settings.quick:
        other = "at-least-once" if settings.deliveries[0] == "exactly-once" else "exactly-once"
        for w in suite:
            if w.group_size == 8 and w.name in ("a", "b") and (r := workload(w, other)) is not None:
                report.delivery_compare.append(r)
    if settings.compare_clients and not settings.quick:
        other = next(c for c in CLIENTS if c != bench.conn.client)
        for w in suite:
            if w.group_size == 8 and w.name in ("a", "b") and \
                    (r := workload(w, settings.deliveries[0], other)) is not None:
                report.client_compare.append(r)
    if settings.memory and not settings.quick:
        # The standard sample sizes, whichever workloads this run chose.
        tokens = {w.name: w.tokens for w in standard_workloads()}
        for w, open_groups in ((Workload("b", tokens["b"], 16, 1, 40), 64),
                               (Workload("a", tokens["a"], 16, 1, 400), 3000)):
            m = measured(f"memory {w.label()}", bench.memory, w, open_groups=open_groups)
            if m is not None:
                report.memory.append(m)
    if settings.sweep and not settings.quick:
        base = next(
            (r for r in report.results if r.workload.name == "a" and r.workload.group_size == 8), None
        )
        if base is None:
            report.failures.append("commit cadence sweep: not run; it starts from (a) g8, not measured")
        else:
            w = Workload("a", base.workload.tokens, 8, 1, 750)
            report.sweep_workload = w
            for interval in SWEEP_INTERVALS:
                for max_records in SWEEP_MAX_RECORDS:
                    point = measured(f"cadence {interval:g}s/{max_records}", bench.sweep_point, w,
                                     base.delivery, interval, max_records)
                    if point is not None:
                        report.sweep.append(point)
    report.machine["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    report.seconds = time.monotonic() - started
    return report
