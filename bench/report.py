"""The benchmark report for people: rich tables of throughput, latency, memory, delivery and cadence.

Each table is shown whole where it fits the width; at 80 columns the throughput table splits in two (with a
legend for the shortened headers), and below that every workload becomes a paragraph (stream/layout.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from bench.results import (
    LIBRDKAFKA_TARGETS,
    MEMORY_TARGET,
    P99_TARGET_MS,
    THROUGHPUT_TARGET,
    BenchReport,
    MemoryResult,
    SweepPoint,
    WorkloadResult,
)
from rollout_stream.layout import Fit, Flow, output_console, titled

__all__ = ["render", "targets_view"]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _us(cpu_s: float, n: int) -> str:
    return f"{cpu_s / n * 1e6:,.0f}" if n else "-"


def _ratio(r: WorkloadResult) -> str:
    ratio = f"{r.ratio:.2f}"
    if r.workload.name in ("a", "b"):  # the workloads the throughput target is about
        return f"[{'green' if r.ratio >= THROUGHPUT_TARGET else 'red'}]{ratio}[/]"
    return ratio


def _p99(r: WorkloadResult) -> str:
    p99 = _ms(r.latency.p99_ms if r.latency else None)
    if r.latency and r.latency.p99_ms is not None:
        return f"[{'green' if r.latency.p99_ms <= P99_TARGET_MS else 'red'}]{p99}[/]"
    return p99


def _mode(r: WorkloadResult) -> str:
    mode = "EOS" if r.delivery == "exactly-once" else "ALO"
    return f"{mode} {_CLIENT_SHORT.get(r.client, r.client)}".rstrip()


_CLIENT_SHORT = {"kafka-python": "kp", "confluent": "rd"}  # rd: librdkafka


def _loop(r: WorkloadResult) -> str:
    stage, passthrough = r.stage, r.passthrough
    return f"{_us(stage.loop_cpu_s, stage.samples)}|{_us(passthrough.loop_cpu_s, passthrough.samples)}"


def _wide_table(results: Sequence[WorkloadResult]) -> Table:
    t = Table(padding=(0, 1))
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
        t.add_row(
            r.workload.label(),
            _mode(r),
            f"{r.stage.samples_per_s:,.0f}",
            f"{r.stage.mb_per_s:,.1f}",
            f"{r.passthrough.samples_per_s:,.0f}",
            f"{r.passthrough.mb_per_s:,.1f}",
            _ratio(r),
            _ms(r.latency.p50_ms if r.latency else None),
            _p99(r),
            _ms(r.passthrough_latency.p99_ms if r.passthrough_latency else None),
            f"{r.latency.rate:,.0f}" if r.latency else "-",
            _loop(r),
        )
    return t


def _split_tables(results: Sequence[WorkloadResult]) -> Group:
    """The wide table as two (throughput, latency) with one-line headers and a legend: fits 80 columns."""
    rates = Table(padding=(0, 1))
    rate_columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("workload", "left"),
        ("mode", "left"),
        ("stage/s", "right"),
        ("MB/s", "right"),
        ("pass/s", "right"),
        ("MB/s", "right"),
        ("ratio", "right"),
        ("loop µs", "right"),
    )
    for name, justify in rate_columns:
        rates.add_column(name, justify=justify, no_wrap=True)
    latency = Table(padding=(0, 1))
    latency_columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("workload", "left"),
        ("mode", "left"),
        ("p50 ms", "right"),
        ("p99 ms", "right"),
        ("pass p99 ms", "right"),
        ("at /s", "right"),
    )
    for name, justify in latency_columns:
        latency.add_column(name, justify=justify, no_wrap=True)
    for r in results:
        rates.add_row(
            r.workload.label(),
            _mode(r),
            f"{r.stage.samples_per_s:,.0f}",
            f"{r.stage.mb_per_s:,.1f}",
            f"{r.passthrough.samples_per_s:,.0f}",
            f"{r.passthrough.mb_per_s:,.1f}",
            _ratio(r),
            _loop(r),
        )
        latency.add_row(
            r.workload.label(),
            _mode(r),
            _ms(r.latency.p50_ms if r.latency else None),
            _p99(r),
            _ms(r.passthrough_latency.p99_ms if r.passthrough_latency else None),
            f"{r.latency.rate:,.0f}" if r.latency else "-",
        )
    legend = Flow(
        "stage/s, pass/s: samples per second of the stage and of the passthrough, MB/s after each; ratio: "
        "stage / passthrough; loop µs: processing-thread CPU per sample, stage|pass; p50, p99: the stage's "
        "latency offered 'at /s'; pass p99: the passthrough's at the same rate.",
        indent=2,
        style="dim",
    )
    return Group(rates, latency, legend)


def _stacked(results: Sequence[WorkloadResult]) -> Group:
    blocks: list[RenderableType] = []
    for r in results:
        lat = r.latency
        latency = (
            f"latency at {lat.rate:,.0f}/s p50 {_ms(lat.p50_ms)} ms, p99 {_p99(r)} ms "
            f"(passthrough p99 {_ms(r.passthrough_latency.p99_ms if r.passthrough_latency else None)} ms)"
            if lat
            else "latency not measured"
        )
        blocks.append(
            Flow(
                Text.from_markup(
                    f"[bold]{r.workload.label()}[/], {_mode(r)}: stage {r.stage.samples_per_s:,.0f}/s "
                    f"({r.stage.mb_per_s:,.1f} MB/s), passthrough {r.passthrough.samples_per_s:,.0f}/s "
                    f"({r.passthrough.mb_per_s:,.1f} MB/s), ratio {_ratio(r)}; {latency}; loop µs/sample "
                    f"{_loop(r)}"
                ),
                indent=4,
            )
        )
    return Group(*blocks)


def _throughput(results: Sequence[WorkloadResult]) -> Fit:
    return Fit(_wide_table(results), _split_tables(results), _stacked(results))


def _memory(memory: Sequence[MemoryResult]) -> Fit:
    wide = Table()
    narrow = Table()
    for name in ("workload", "open windows", "open MB", "idle RSS MB", "peak RSS MB", "(peak − idle) / open"):
        wide.add_column(name, justify="left" if name == "workload" else "right", no_wrap=True)
    for name in ("workload", "windows", "open MB", "idle MB", "peak MB", "ratio"):
        narrow.add_column(name, justify="left" if name == "workload" else "right", no_wrap=True)
    blocks: list[RenderableType] = []
    for mem in memory:
        cells = (
            mem.workload.label(),
            f"{mem.open_windows:,}",
            f"{mem.open_bytes / 1e6:,.0f}",
            f"{mem.base_rss / 1e6:,.0f}",
            f"{mem.peak_rss / 1e6:,.0f}",
            f"[{'green' if mem.ok else 'red'}]{mem.ratio:.2f}[/]",
        )
        wide.add_row(*cells)
        narrow.add_row(*cells)
        blocks.append(
            Flow(
                Text.from_markup(
                    f"[bold]{cells[0]}[/]: {cells[1]} open windows of {cells[2]} MB; RSS idle {cells[3]} MB, "
                    f"peak {cells[4]} MB; (peak − idle) / open {cells[5]}"
                ),
                indent=4,
            )
        )
    legend = Flow("ratio: (peak RSS − idle RSS) / MB in open windows", indent=2, style="dim")
    return Fit(wide, Group(narrow, legend), Group(*blocks))


def _sweep(points: Sequence[SweepPoint]) -> Fit:
    t = Table(padding=(0, 1))
    for name in ("interval s", "max records", "stage /s", "commits", "p50 ms", "p99 ms", "at /s"):
        t.add_column(name, justify="right", no_wrap=True)
    blocks: list[RenderableType] = []
    for p in points:
        cells = (
            f"{p.commit_interval_s:g}",
            f"{p.commit_max_records:,}",
            f"{p.stage.samples_per_s:,.0f}",
            str(p.stage.commits),
            _ms(p.latency.p50_ms if p.latency else None),
            _ms(p.latency.p99_ms if p.latency else None),
            f"{p.latency.rate:,.0f}" if p.latency else "-",
        )
        t.add_row(*cells)
        blocks.append(
            Flow(
                f"every {cells[0]} s or {cells[1]} records: {cells[2]}/s, {cells[3]} commits; "
                f"p50 {cells[4]} ms, p99 {cells[5]} ms at {cells[6]}/s",
                indent=4,
            )
        )
    return Fit(t, Group(*blocks))


def _not_measured(report: BenchReport, what: str) -> str:
    s = report.settings
    if what == "latency" and not s.at_half_load:
        return f"[yellow]not judged[/] (--latency-rate {s.latency_rate:g}: not half load)"
    if s.quick:
        return "[yellow]not measured[/] (--quick)"
    if what == "memory" and not s.memory:
        return "[yellow]not measured[/] (--no-memory)"
    return "[yellow]not measured[/]"


def targets_view(report: BenchReport) -> Group:
    """One line per target: met, not met, or not measured (a quick run measures no memory)."""
    tg = report.targets()
    verdict = {True: "[green]met[/]", False: "[red]not met[/]"}
    lines = [
        (
            f"stage ≥ {THROUGHPUT_TARGET} × passthrough on (a),(b): "
            + (
                f"{verdict[tg['throughput_ok']]} (min {tg['throughput_ratio_min_ab']})"
                if tg["throughput_ok"] is not None
                else _not_measured(report, "throughput")
            )
        ),
        (
            f"p99 ≤ {P99_TARGET_MS:g} ms at half load: "
            + (
                f"{verdict[tg['p99_ok']]} (max {_ms(tg['p99_ms_max'])} ms)"
                if tg["p99_ok"] is not None
                else _not_measured(report, "latency")
            )
        ),
        (
            f"memory ≤ {MEMORY_TARGET:g} × open + idle: "
            + (
                f"{verdict[tg['memory_ok']]} (max {tg['memory_ratio_max']})"
                if tg["memory_ok"] is not None
                else _not_measured(report, "memory")
            )
        ),
    ]
    rd = tg.get("librdkafka")
    if rd:
        t = LIBRDKAFKA_TARGETS

        def one(label: str, key: str, shown: str, what: str = "librdkafka") -> str:
            if rd.get(key + "_ok") is None:
                return f"{label}: {_not_measured(report, what)}"
            return f"{label}: {verdict[rd[key + '_ok']]} ({shown})"

        lines += [
            one(f"librdkafka stage ≥ {t['ratio_a']:g} × its passthrough on (a) g8", "ratio_a",
                str(rd.get("ratio_a"))),
            one(f"librdkafka stage ≥ {t['ratio_b']:g} × its passthrough on (b) g8", "ratio_b",
                str(rd.get("ratio_b"))),
            one(f"librdkafka stage ≥ {t['vs_kafka_python_a']:g} × the kafka-python stage on (a) g8",
                "vs_kafka_python_a", f"{rd.get('vs_kafka_python_a')} ×"),
            one(f"librdkafka p99 ≤ {t['p99_ms']:g} ms at half load on (a) g8", "p99",
                f"{_ms(rd.get('p99_ms_a'))} ms", "latency"),
        ]
    return Group(Text("Targets:"), *(Flow(Text.from_markup(line), first=2, indent=4) for line in lines))


def _spread(results: Sequence[WorkloadResult]) -> Group | None:
    lines = []
    for r in results:
        parts = []
        if r.spread is not None:
            parts.append("pairs " + ", ".join(f"{x:.2f}" for x in r.pair_ratios))
        outside = [(side, t.appended_per_s) for side, t in (("stage", r.stage), ("pass", r.passthrough))
                   if t.appended_per_s]
        if outside:
            parts.append("broker append rate " + ", ".join(f"{side} {rate:,.0f}/s" for side, rate in outside))
        if parts:
            name = " ".join(filter(None, (r.workload.label(), _CLIENT_SHORT.get(r.client, r.client),
                                          r.delivery)))
            lines.append(f"{name}: " + "; ".join(parts))
    return Group(*(Flow(Text(line), first=2, indent=4) for line in lines)) if lines else None


def render(report: BenchReport, console: Console | None = None) -> None:
    console = console or output_console()
    m = report.machine
    console.print(
        Flow(
            Text.from_markup(
                f"[bold]python -m bench[/] — {m['cpus']} CPUs ({m['cpu_model']}), Python {m['python']}, "
                f"kafka-python {m['kafka_python']}, hot path {m.get('hot_path', '?')}; "
                f"load average {m['load_average_start'][0]} → "
                f"{m.get('load_average_end', ['?'])[0]}; {report.seconds:.0f} s"
            ),
            indent=4,
        )
    )
    console.print(
        titled(
            f"Stage vs passthrough (same clients and delivery: EOS exactly-once, ALO at-least-once); latency "
            f"at half the stage's max rate; commit every {report.settings.commit_interval_s:g} s or "
            f"{report.settings.commit_max_records} records; loop µs/sample: processing thread CPU, "
            "stage|pass",
            _throughput(report.results),
        )
    )
    if report.delivery_compare:
        same = [r for r in report.results if any(r.workload == c.workload for c in report.delivery_compare)]
        console.print(titled("Exactly-once vs at-least-once", _throughput(same + report.delivery_compare)))
    if report.client_compare:
        same = [r for r in report.results if any(r.workload == c.workload for c in report.client_compare)]
        console.print(titled("kafka-python (kp) and confluent-kafka/librdkafka (rd), same broker and run",
                             _throughput(same + report.client_compare)))
    spread = _spread([*report.results, *report.client_compare])
    if spread:
        console.print(titled("Each alternating stage/passthrough pair's ratio (the table keeps each side's "
                             "fastest drain); the same drains' outputs over their broker append timestamps",
                             spread))
    if report.memory:
        console.print(
            titled(
                f"Memory: peak RSS vs bytes in open windows (target ≤ {MEMORY_TARGET:g} × open + idle)",
                _memory(report.memory),
            )
        )
    if report.sweep:
        w = report.sweep_workload
        console.print(
            titled(
                f"Commit cadence ({w.label() if w else ''}, {report.results[0].delivery}): each point's max "
                f"rate, and latency at half of it",
                _sweep(report.sweep),
            )
        )
    console.print(targets_view(report))
    if report.failures:
        console.print(Text("Not measured (the targets above judge only what was):", style="bold red"))
        for failure in report.failures:
            console.print(Flow(Text(failure), first=2, indent=4))
