"""How much Python work per record the consume → produce → commit loop absorbs before its rate drops.

Drains one preloaded backlog of `python -m bench run` workload (a) with the stage, then with the passthrough
with 0, 5, 10 and 15 µs of busy CPU work added per record in its processing thread (`extra_work_us`), in
alternation, `--rounds` times. Where the passthrough plus N µs drains at the stage's rate, N is what the
stage's own work costs that thread: the stage's gap to the passthrough is its own per-record work, or not.

    rollout-stream broker start
    .venv/bin/python bench/scripts/headroom_bench.py [--group-size 8] [--rounds 3] [--work \
        0,5,10,15]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from bench.proc import RunnerProcess
from bench.results import BenchSettings
from bench.suite import DRAIN_TIMEOUT_S, FIRST_RECORD_S, _Bench
from bench.workloads import Workload, create_topics, delete_topics, preload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-servers", default="localhost:9092")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", default="0,5,10,15", help="µs of CPU work per record added to the passthrough")
    args = ap.parse_args()
    works = [float(x) for x in args.work.split(",")]
    bench = _Bench(BenchSettings(bootstrap=args.bootstrap_servers), print)
    w = Workload("a", 256, args.group_size, 1, 24_000 // args.group_size)
    topics = create_topics(bench.conn, bench.s.partitions)
    rates: dict[str, list[float]] = {}
    try:
        pre = preload(bench.conn, topics.names.input, w)
        for _ in range(args.rounds):
            row = []
            for mode, work in [("stage", 0.0), *(("passthrough", x) for x in works)]:
                spec = dataclasses.replace(bench.spec(mode, topics, "exactly-once", pre), extra_work_us=work)
                proc = RunnerProcess(spec)
                try:
                    drained = proc.wait_for("drained", timeout=DRAIN_TIMEOUT_S,
                                            first_record_within=FIRST_RECORD_S)
                    proc.wait_for("result", timeout=60)
                finally:
                    proc.kill()
                tp = bench.throughput(mode, pre, drained)
                label = "stage" if mode == "stage" else f"passthrough +{work:g} µs"
                rates.setdefault(label, []).append(tp.samples_per_s)
                row.append(f"{label} {tp.samples_per_s:,.0f}/s")
            print(" | ".join(row), flush=True)
    finally:
        delete_topics(bench.conn, topics.all())
    print(f"\nmedian samples/s over {args.rounds} rounds, {w.label()}, exactly-once:")
    for label, values in rates.items():
        print(f"  {label:24s} {statistics.median(values):8,.0f}   ({min(values):,.0f}–{max(values):,.0f})")


if __name__ == "__main__":
    main()
