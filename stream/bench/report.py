"""The benchmark report for people: rich tables of throughput, latency, memory, delivery and cadence."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from stream.bench.results import MEMORY_TARGET, P99_TARGET_MS, THROUGHPUT_TARGET, BenchReport, WorkloadResult

__all__ = ["render"]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _us(cpu_s: float, n: int) -> str:
    return f"{cpu_s / n * 1e6:,.0f}" if n else "-"


def _throughput_table(title: str, results: list[WorkloadResult]) -> Table:
    t = Table(title=title, title_justify="left", padding=(0, 1))
    t.add_column("workload", no_wrap=True)
    t.add_column("mode", no_wrap=True)
    for name in (
        "stage\n/s",
        "stage\nMB/s",
        "pass\n/s",
        "pass\nMB/s",
        "ratio",
        "p50\nms",
        "p99\nms",
        "pass\np99 ms",
        "at\n/s",
        "loop µs/\nsample",
    ):
        t.add_column(name, justify="right", no_wrap=True)
    for r in results:
        target = r.workload.name in ("a", "b")
        ratio = f"{r.ratio:.2f}"
        if target:
            ratio = f"[{'green' if r.ratio >= THROUGHPUT_TARGET else 'red'}]{ratio}[/]"
        p99 = _ms(r.latency.p99_ms if r.latency else None)
        if r.latency and r.latency.p99_ms is not None:
            p99 = f"[{'green' if r.latency.p99_ms <= P99_TARGET_MS else 'red'}]{p99}[/]"
        t.add_row(
            r.workload.label(),
            "EOS" if r.delivery == "exactly-once" else "ALO",
            f"{r.stage.samples_per_s:,.0f}",
            f"{r.stage.mb_per_s:,.1f}",
            f"{r.passthrough.samples_per_s:,.0f}",
            f"{r.passthrough.mb_per_s:,.1f}",
            ratio,
            _ms(r.latency.p50_ms if r.latency else None),
            p99,
            _ms(r.passthrough_latency.p99_ms if r.passthrough_latency else None),
            f"{r.latency.rate:,.0f}" if r.latency else "-",
            f"{_us(r.stage.loop_cpu_s, r.stage.samples)}|"
            f"{_us(r.passthrough.loop_cpu_s, r.passthrough.samples)}",
        )
    return t


def render(report: BenchReport, console: Console | None = None) -> None:
    console = console or Console()
    m = report.machine
    console.print(
        f"[bold]rollout-stream bench[/] — {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}, "
        f"kafka-python {m['kafka_python']}; load average {m['load_average_start'][0]} → "
        f"{m.get('load_average_end', ['?'])[0]}; {report.seconds:.0f} s"
    )
    console.print(
        _throughput_table(
            f"Stage vs passthrough (same clients and delivery: EOS exactly-once, ALO at-least-once); "
            f"latency "
            f"at half the stage's max rate; commit every {report.settings.commit_interval_s:g} s or "
            f"{report.settings.commit_max_records} records; loop µs/sample: processing thread CPU, "
            f"stage|pass",
            report.results,
        )
    )
    if report.delivery_compare:
        same = [r for r in report.results if any(r.workload == c.workload for c in report.delivery_compare)]
        console.print(_throughput_table("Exactly-once vs at-least-once", same + report.delivery_compare))
    if report.memory:
        t = Table(
            title=f"Memory: peak RSS vs bytes in open windows (target ≤ {MEMORY_TARGET:g} × open + idle)",
            title_justify="left",
        )
        for name in (
            "workload",
            "open windows",
            "open MB",
            "idle RSS MB",
            "peak RSS MB",
            "(peak − idle) / open",
        ):
            t.add_column(name, justify="left" if name == "workload" else "right")
        for mem in report.memory:
            t.add_row(
                mem.workload.label(),
                f"{mem.open_windows:,}",
                f"{mem.open_bytes / 1e6:,.0f}",
                f"{mem.base_rss / 1e6:,.0f}",
                f"{mem.peak_rss / 1e6:,.0f}",
                f"[{'green' if mem.ok else 'red'}]{mem.ratio:.2f}[/]",
            )
        console.print(t)
    if report.sweep:
        w = report.sweep_workload
        t = Table(
            title=f"Commit cadence ({w.label() if w else ''}, {report.results[0].delivery}): each point's "
            f"max "
            f"rate, and latency at half of it",
            title_justify="left",
            padding=(0, 1),
        )
        for name in ("interval s", "max records", "stage /s", "commits", "p50 ms", "p99 ms", "at /s"):
            t.add_column(name, justify="right")
        for p in report.sweep:
            t.add_row(
                f"{p.commit_interval_s:g}",
                f"{p.commit_max_records:,}",
                f"{p.stage.samples_per_s:,.0f}",
                str(p.stage.commits),
                _ms(p.latency.p50_ms if p.latency else None),
                _ms(p.latency.p99_ms if p.latency else None),
                f"{p.latency.rate:,.0f}" if p.latency else "-",
            )
        console.print(t)
    tg = report.targets()
    verdict = {True: "[green]met[/]", False: "[red]not met[/]"}
    console.print(
        f"Targets: stage ≥ {THROUGHPUT_TARGET} × passthrough on (a),(b): {verdict[tg['throughput_ok']]} "
        f"(min {tg['throughput_ratio_min_ab']}); p99 ≤ {P99_TARGET_MS:g} ms at half load: "
        f"{verdict[tg['p99_ok']]} (max {_ms(tg['p99_ms_max'])} ms); memory ≤ {MEMORY_TARGET:g} × open + "
        f"idle: {verdict[tg['memory_ok']]} "
        f"(max {tg['memory_ratio_max']})"
    )
