"""Scale-out on a local cluster: 1, 2 and 3 `rollout-stream run` workers in one group drain the same backlog.

For each workload and worker count: fresh topics (6 partitions, replicated as `topics create` does: 3
replicas, 2 in sync on 3 brokers), the backlog preloaded, then N worker processes started at once. The
group's committed input offsets are sampled every 0.1 s:

    start s     launch → first commit (process start, torch import, group join, first transaction)
    settled s   launch → every worker has restored its partitions (the group is stable)
    rate        samples committed per second from `settled` to the last commit (steady, all N working)
    e2e rate    every sample / (first commit → last commit), rebalances included

    .venv/bin/rollout-stream broker start --nodes 3 --port 19092 --data-dir /tmp/scale-cluster
    .venv/bin/python bench/scripts/scale_out_bench.py \
        --bootstrap-servers 127.0.0.1:19092,127.0.0.1:19093,127.0.0.1:19094

Results: docs/scaling.md. One JSON line per run on stdout, a table on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.workloads import Workload, create_topics, delete_topics, preload
from rollout_stream.clients import Connection
from rollout_stream.kafka import Admin, TopicPartition, client_for

CLI = Path(sys.executable).with_name("rollout-stream")


def committed(admin: Admin, group: str, tps: list[TopicPartition]) -> dict[int, int]:
    try:
        found = admin.group_offsets([group], tps).get(group, {})
    except Exception:  # noqa: BLE001 - coordinator moving during a rebalance: sample again
        return {}
    return {tp.partition: offset for tp, (offset, _meta) in found.items()}


def run_once(conn: Connection, w: Workload, workers: int, partitions: int, timeout: float) -> dict[str, Any]:
    topics = create_topics(conn, partitions, tag="scale")
    logs = Path(tempfile.mkdtemp(prefix="scale-logs-"))
    procs: list[subprocess.Popen[bytes]] = []
    admin = client_for(conn).admin(client_id="scale-bench")
    try:
        pre = preload(conn, topics.names.input, w)
        tps = [TopicPartition(topics.names.input, p) for p in sorted(pre.end_offsets)]
        total = sum(pre.end_offsets.values())
        group = f"scale-{uuid.uuid4().hex[:8]}"
        launched = time.monotonic()
        for i in range(workers):
            log = open(logs / f"w{i + 1}.log", "wb")  # noqa: SIM115 - closed with the process
            procs.append(subprocess.Popen(
                [str(CLI), "run", "--bootstrap-servers", conn.bootstrap_servers,
                 "--input-topic", topics.names.input, "--output-topic", topics.names.output,
                 "--dead-letter-topic", topics.names.dead_letter, "--group-id", group,
                 "--instance-id", f"w{i + 1}", "--group-timeout", "900", "--progress-interval", "3600"],
                stdout=log, stderr=log, env=os.environ.copy()))
        first = settled = done = None
        at_settled = 0
        samples: list[tuple[float, int]] = []
        while time.monotonic() - launched < timeout:
            now = time.monotonic()
            got = committed(admin, group, tps)
            count = sum(got.values())
            samples.append((now, count))
            if first is None and count > 0:
                first = now
            if settled is None and all(
                    "event=partition.restored" in (logs / f"w{i + 1}.log").read_text(errors="replace")
                    for i in range(workers)):
                settled, at_settled = now, count
            if all(got.get(p, 0) >= end for p, end in pre.end_offsets.items()):
                done = now
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a worker exited: {[p.returncode for p in procs]}, logs in {logs}")
            time.sleep(0.1)
        if done is None or first is None:
            raise RuntimeError(f"not drained within {timeout:.0f} s ({samples[-1][1]} of {total}), "
                               f"logs in {logs}")
        settled = settled or done
        steady = (total - at_settled) / (done - settled) if done > settled and total > at_settled else None
        return {
            "workload": w.label(), "workers": workers, "partitions": partitions, "samples": total,
            "input_mb": round(pre.bytes / 1e6, 1), "preload_s": round(pre.seconds, 1),
            "start_s": round(first - launched, 1), "settled_s": round(settled - launched, 1),
            "drain_s": round(done - first, 2), "e2e_rate": round(total / (done - first)),
            "steady_rate": round(steady) if steady else None,
            "steady_share": round((total - at_settled) / total, 2),
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        admin.close()
        delete_topics(conn, topics.all())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--workers", default="1,2,3")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--workloads", default="a,b",
                    help="a: 256-token samples, b: 32K-token samples (groups of 8)")
    ap.add_argument("--scale", type=float, default=1.0, help="backlog size factor")
    ap.add_argument("--timeout", type=float, default=300.0)
    args = ap.parse_args()
    conn = Connection(args.bootstrap_servers, client_id="scale-bench")
    sizes = {"a": Workload("a", 256, 8, 1, int(60_000 * args.scale) // 8),
             "b": Workload("b", 32768, 8, 1, int(1_920 * args.scale) // 8)}
    rows = []
    for name in args.workloads.split(","):
        for _ in range(args.repeats):
            for n in (int(x) for x in args.workers.split(",")):
                row = run_once(conn, sizes[name], n, args.partitions, args.timeout)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("| workload | workers | partitions | samples | start s | settled s | drain s | e2e samples/s "
          "| steady samples/s |", file=sys.stderr)
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|", file=sys.stderr)
    for r in rows:
        print(f"| {r['workload']} | {r['workers']} | {r['partitions']} | {r['samples']:,} | {r['start_s']} | "
              f"{r['settled_s']} | {r['drain_s']} | {r['e2e_rate']:,} | {r['steady_rate'] or '-'} |",
              file=sys.stderr)


if __name__ == "__main__":
    main()
