"""`python -m bench run`: throughput against the passthrough ceiling, latency, memory, delivery, cadence."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from rollout_stream.clients import CLIENT_ENV
from rollout_stream.commands.connection import (
    NO_SECURITY_OPTIONS,
    SecurityOptions,
    connection_from_options,
)
from rollout_stream.commands.local import running_local_broker
from rollout_stream.commands.options import Bootstrap, fail, grouped_options
from rollout_stream.config import INT32_MAX, WorkerConfig, check_count, check_rate, check_seconds
from rollout_stream.errors import described
from rollout_stream.kafka import KafkaFailure

if TYPE_CHECKING:
    from bench.workloads import Workload

DELIVERIES = {
    "exactly-once": ("exactly-once",),
    "at-least-once": ("at-least-once",),
    "both": ("exactly-once", "at-least-once"),
}


@grouped_options
def bench(
    bootstrap_servers: Bootstrap = None,
    json_output: Annotated[
        bool, typer.Option("--json", help="Print the report as one JSON object on stdout.")
    ] = False,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick",
            help="Tiny workloads (a) and (b) only, no memory, delivery comparison or "
            "cadence sweep: a smoke test that takes well under a minute.",
        ),
    ] = False,
    delivery: Annotated[
        str,
        typer.Option(
            help="exactly-once, at-least-once, or both (the table for each; "
            "with one, (a) and (b) at g8 are also run with the other)."
        ),
    ] = "exactly-once",
    partitions: Annotated[int, typer.Option(help="Partitions of the benchmark's topics.")] = 3,
    commit_interval: Annotated[
        float,
        typer.Option(help="Worker and passthrough commit interval (s), as the worker's --commit-interval"),
    ] = 0.1,
    commit_max_records: Annotated[
        int, typer.Option(help="Also commit after this many input records.")
    ] = 5000,
    latency_seconds: Annotated[
        float, typer.Option(help="Seconds of paced load per latency measurement.")
    ] = 4.0,
    latency_rate: Annotated[
        float | None,
        typer.Option(help="Offer this many samples/s in every latency phase, stage and passthrough alike, "
                     "instead of half the stage's measured maximum: both sides at one load. The p99 targets "
                     "(at half load) are then not judged.", show_default=False),
    ] = None,
    workload: Annotated[
        list[str] | None,
        typer.Option("--workload", help="Run only these workloads, e.g. --workload a-g8 --workload b-g8 "
                     "(a, b, c with g8 or g16; default: all six).", show_default=False),
    ] = None,
    compare_delivery: Annotated[
        bool,
        typer.Option(help="Also run (a) and (b) at g8 with the other delivery guarantee."),
    ] = True,
    repeats: Annotated[
        int,
        typer.Option(help="Throughput drains per side and workload, alternating stage and passthrough; the "
                     "fastest of each is reported (a shared machine slows single drains)."),
    ] = 2,
    sweep: Annotated[
        bool, typer.Option(help="Commit cadence sweep (interval x max records) on (a) g8.")
    ] = True,
    memory: Annotated[bool, typer.Option(help="Peak RSS against bytes held in open windows.")] = True,
    compare_clients: Annotated[
        bool,
        typer.Option(help="Also run (a) and (b) at g8 on the other Kafka client (confluent / kafka-python): "
                     "the two side by side, and the librdkafka targets."),
    ] = True,
    profile_dir: Annotated[
        str | None,
        typer.Option(
            help="Write cProfile files of every stage and passthrough process here.", show_default=False
        ),
    ] = None,
    write_heads: Annotated[
        bool,
        typer.Option("--write-heads", help="The stage also writes group heads, as `run --write-heads` (what "
                     "rank-local fetch costs the stage); the passthrough is unchanged."),
    ] = False,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Benchmark the stage against a passthrough (consume → produce → commit, same clients and delivery)
    on the real broker: samples/s and MB/s, end-to-end latency p50/p99 at half the measured maximum rate,
    peak RSS against open-window bytes, exactly-once vs at-least-once, and a commit cadence sweep.

    Creates and deletes its own topics. The full run takes about ten minutes on 2 cores.
    """
    from bench.results import BenchSettings
    from bench.suite import run_bench

    if delivery not in DELIVERIES:
        fail(f"--delivery must be exactly-once, at-least-once or both, got {delivery!r}")
    check_count("--partitions", partitions, 1, INT32_MAX)
    check_count("--repeats", repeats, 1)
    check_count("--commit-max-records", commit_max_records, 1)
    check_seconds("--commit-interval", commit_interval)
    if delivery != "at-least-once" or compare_delivery:  # exactly-once runs: the worker's own rule applies
        WorkerConfig(commit_interval_s=commit_interval, commit_max_records=commit_max_records)
    check_seconds("--latency-seconds", latency_seconds)
    if latency_rate is not None:
        check_rate("--latency-rate", latency_rate, unlimited=False)
    workloads = _chosen_workloads(workload or [], quick)
    if profile_dir:
        os.makedirs(profile_dir, exist_ok=True)
    conn = connection_from_options(bootstrap_servers, security, client_id="rollout-stream-bench",
                                   local=running_local_broker)
    settings = BenchSettings(
        bootstrap=conn.bootstrap_servers,
        deliveries=DELIVERIES[delivery],
        quick=quick,
        partitions=partitions,
        commit_interval_s=commit_interval,
        commit_max_records=commit_max_records,
        latency_s=min(latency_seconds, 1.0) if quick else latency_seconds,
        repeats=1 if quick else repeats,
        memory=memory,
        sweep=sweep,
        profile_dir=profile_dir,
        compare_clients=compare_clients,
        compare_delivery=compare_delivery,
        latency_rate=latency_rate,
        workloads=workloads,
        write_heads=write_heads,
    )

    def progress(line: str) -> None:
        print(f"bench: {line}", file=sys.stderr, flush=True)

    # Every process of the bench (runners, preload, observer) and its report use the client chosen.
    os.environ[CLIENT_ENV] = conn.client
    # A measurement that fails (RunnerFailed, PreloadFailed) is reported and the run goes on; a Kafka error
    # outside one (creating topics, the broker gone) stops the run: exit 1.
    with described(KafkaFailure, "Kafka error"):
        report = run_bench(settings, progress, security=conn.security)
    if json_output:
        print(json.dumps(report.to_json(), indent=2))
    else:
        from bench.report import render

        render(report)
    if report.failures:
        # The report above is whole for what it measured; the exit says the run was not.
        print(f"bench: {len(report.failures)} measurement(s) failed: see 'Not measured' ('failures' in the "
              "JSON)", file=sys.stderr)
        raise typer.Exit(1)


def _chosen_workloads(names: list[str], quick: bool) -> tuple[Workload, ...] | None:
    """The standard workloads named like `a-g8`, in the standard order; None for all of them."""
    from bench.workloads import standard_workloads  # numpy and the codec: not for --help

    if not names:
        return None
    standard = {w.key: w for w in standard_workloads(quick)}
    unknown = [n for n in names if n not in standard]
    if unknown:
        fail(f"--workload {', '.join(unknown)}: not a workload of this run; "
             f"choose from {', '.join(standard)}")
    return tuple(w for key, w in standard.items() if key in names)
