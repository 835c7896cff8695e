"""`rollout-stream demo`: the whole stage on the local broker, driven by synthetic rollouts, with a
summary."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Annotated

import typer
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from rollout_stream.commands.connection import (
    NO_SECURITY_OPTIONS,
    SecurityOptions,
    connection_from_options,
)
from rollout_stream.commands.local import started_local_broker
from rollout_stream.commands.options import DemoBootstrap, fail, grouped_options
from rollout_stream.config import TopicNames, WorkerConfig, check_count, check_rate, check_seconds
from rollout_stream.core.validate import MAX_GROUP_SIZE, MAX_SIBLING_COUNT
from rollout_stream.layout import Flow, output_console, titled
from rollout_stream.logs import configure_logging
from rollout_stream.ops.synth import Expected, FaultRates, RateLimiter, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from rollout_stream.topics import TopicSettings, ensure_topics
from rollout_stream.worker import Worker
from rollout_stream.worker.allocator import reuse_freed_buffers


def _table(expected: Expected, worker: Worker, sent: int, title: str) -> Group:
    st = worker.stats
    table = Table()
    table.add_column("outcome")
    table.add_column("expected", justify="right")
    table.add_column("stage", justify="right")
    table.add_row("records sent", str(expected.records), str(sent))
    table.add_row("published groups", str(expected.published_groups), str(st.groups_published))
    table.add_row("published samples", str(expected.published_samples), str(st.samples_published))
    for reason in sorted(set(expected.dead_letters) | set(st.dead_lettered)):
        table.add_row(f"dead-letter: {reason}", str(expected.dead_letters.get(reason, 0)),
                      str(st.dead_lettered.get(reason, 0)))
    table.add_row("identical duplicates dropped", str(expected.duplicates), str(st.duplicates))
    table.add_row("open windows", "0", str(worker.store.open_count()))
    return titled(Text(title, style="bold"), table)


class _FinalOnly:
    """Live's stand-in when the output is not a terminal: no frames, the last one printed once (rich's Live
    leaves its last frame without a line end, so the next line would start on the table's bottom border)."""

    def __init__(self, console: Console, renderable: RenderableType) -> None:
        self.console, self.renderable = console, renderable

    def update(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __enter__(self) -> _FinalOnly:
        return self

    def __exit__(self, *exc: object) -> None:
        self.console.print(self.renderable)


def _accounted(expected: Expected, worker: Worker) -> bool:
    st = worker.stats
    return (st.samples_published == expected.published_samples
            and sum(st.dead_lettered.values()) == sum(expected.dead_letters.values())
            and st.duplicates == expected.duplicates and worker.store.open_count() == 0)


@grouped_options
def demo(
    bootstrap_servers: DemoBootstrap = None,
    groups: Annotated[int, typer.Option(help="Prompt groups to send.")] = 300,
    group_size: Annotated[int, typer.Option(help="Rollouts per prompt group.")] = 4,
    max_siblings: Annotated[int, typer.Option(help="Samples per rollout drawn from 1..N.")] = 3,
    fault_rate: Annotated[float, typer.Option(help="Per-group probability of each kind of fault.")] = 0.03,
    rate: Annotated[float, typer.Option(help="Samples per second sent by the synthetic producer.")] = 1000.0,
    group_timeout: Annotated[float, typer.Option(help="Worker --group-timeout in seconds.")] = 5.0,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Start the local broker, the worker and a synthetic producer; show live progress and a final summary."""
    check_count("--groups", groups, 0)
    check_count("--group-size", group_size, 1, MAX_GROUP_SIZE)
    check_count("--max-siblings", max_siblings, 1, MAX_SIBLING_COUNT)
    kinds = len(FaultRates.__slots__)
    if not 0 <= fault_rate <= 1 / kinds:  # each kind of fault gets this share: at most one per group
        fail(f"--fault-rate must be between 0 and 1/{kinds} ({1 / kinds:.4f}): each of the {kinds} kinds of "
             f"fault gets that share of groups, at most one per group; got {fault_rate:g}")
    check_rate("--rate", rate)
    check_seconds("--group-timeout", group_timeout)
    console = output_console(stderr=True)
    conn = connection_from_options(bootstrap_servers, security, local=started_local_broker)
    tag = uuid.uuid4().hex[:6]
    topics = TopicNames(f"demo-{tag}-rollouts", f"demo-{tag}-train-data", f"demo-{tag}-rollouts-dlq")
    ensure_topics(conn, data_topics=[topics.input, topics.output], dead_letter_topics=[topics.dead_letter],
                  settings=TopicSettings(partitions=3))
    where = (f"[bold]broker[/] {conn.bootstrap_servers}   [bold]topics[/] {topics.input} → {topics.output} "
             f"(dead-letter {topics.dead_letter})")
    console.print(Flow(Text.from_markup(where), indent=4))
    configure_logging("text", "error")
    config = WorkerConfig(bootstrap_servers=conn.bootstrap_servers, topics=topics, group_id=f"demo-{tag}",
                          group_timeout_s=group_timeout, progress_interval_s=3600)
    reuse_freed_buffers()
    worker = Worker(config, conn)
    thread = threading.Thread(target=worker.run, name="worker", daemon=True)
    thread.start()
    plan = SynthPlan(group_size=group_size, max_siblings=max_siblings, faults=FaultRates.uniform(fault_rate),
                     seed=0, run_id=f"demo-{tag}")
    expected = Expected()
    sent = 0
    limiter = RateLimiter(rate)
    started = time.monotonic()
    try:
        first = _table(expected, worker, sent, "rollout-stream demo: sending")
        display = (Live(first, console=console, refresh_per_second=4) if console.is_terminal
                   else _FinalOnly(console, first))
        with display as live, RolloutProducer(conn, topic=topics.input) as producer:
            for records, exp in plan_groups(plan, groups):
                for r in records:
                    limiter.wait()
                    producer.send_raw(r.key, r.value)
                    sent += 1
                expected.add(exp)
                live.update(_table(expected, worker, sent, "rollout-stream demo: sending"))
            producer.flush()
            deadline = time.monotonic() + group_timeout + 60
            while not _accounted(expected, worker) and time.monotonic() < deadline and thread.is_alive():
                live.update(_table(expected, worker, sent, "rollout-stream demo: waiting for the worker "
                                   f"(incomplete groups time out after {group_timeout:g}s)"))
                time.sleep(0.25)
            live.update(_table(expected, worker, sent, "rollout-stream demo: summary"))
    finally:
        worker.request_stop()
        thread.join(timeout=60)
    elapsed = time.monotonic() - started
    ok = _accounted(expected, worker)
    console.print(Flow(Text.from_markup(f"{sent} records in {elapsed:.1f}s; every record accounted for: "
                                        f"{'[green]yes[/]' if ok else '[red]NO[/]'}"), indent=4))
    console.print(Flow(f"Inspect: kafka consumers on {topics.output} (train samples) and "
                       f"{topics.dead_letter} (headers x-dlq-reason, x-dlq-message, …).", indent=4))
    if not ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)
