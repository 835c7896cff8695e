"""Chunked samples on a real broker: the stage against a passthrough, chunked against unchunked, and the
worker's peak memory, for MoE samples of 32K and 128K tokens with their routing replay.

    .venv/bin/python bench/scripts/chunked_bench.py                  # all three cases
    .venv/bin/python bench/scripts/chunked_bench.py --cases 32k-chunked --groups-32k 1 --json

The samples: `--tokens-32k` (32,768) or `--tokens-128k` (131,072) int32 tokens, half of them response
(float32 log-probs, uint8 loss mask), and `rollout_routed_experts` of shape (tokens − 1, 48 layers, top-8)
int32: about 50 MB (32K) and 201 MB (128K) encoded. The cases:

  32k-chunked    `--groups-32k` groups of `--group-size-32k`; topics at the default 1 MiB max.message.bytes,
                 input sent by RolloutProducer in 900 KiB chunks, the worker at its default --chunk-kib;
  32k-unchunked  the same samples as single records: topics at 64 MiB, producer and worker chunk_bytes
                 64 MiB (above the sample);
  128k-chunked   `--groups-128k` groups of `--group-size-128k` (a 128K sample cannot travel unchunked: its
                 201 MB are over the 64 MiB the broker takes).

Method, per case: fresh topics (`--partitions`; outputs stamped by the broker, LogAppendTime); the input is
produced before anything is timed. Then, `--repeats` times, on fresh output topics, in alternating order:
  stage        `rollout-stream run` as a subprocess (exactly-once, default settings but --group-timeout
               3600, so a group preloaded minutes earlier is not expired), timed from its /readyz turning 200
               (partitions assigned and restored: it starts on the backlog at once) to its group's committed
               offsets reaching the input's end (polled every 50 ms from here); its VmHWM (/proc/<pid>/status)
               is read before it is stopped;
  passthrough  bench/passthrough.py in the bench runner process (consume → produce the same
               records, headers included, exactly-once with the worker's commit cadence), timed from its first
               record to its last commit.
Both are also checked from outside: the span between the first and the last output record's broker
timestamp (LogAppendTime), read back after the drain. The span starts at the first output, so for the stage
it leaves out the reading of the first group. Topics are deleted after each case.

Without --bootstrap the script starts its own broker (LocalBroker) in a temporary data dir under --tmp.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.proc import RunnerProcess
from bench.runner import RunSpec
from bench.workloads import delete_topics, end_offsets
from rollout_stream.broker.local import LocalBroker
from rollout_stream.broker.process import free_port
from rollout_stream.clients import MAX_RECORD_BYTES, Connection
from rollout_stream.codec import Array, Sample, ShapedArray, encode_sample
from rollout_stream.codec.chunks import DEFAULT_CHUNK_BYTES
from rollout_stream.kafka import TopicPartition, TopicSpec, client_for
from rollout_stream.producer import RolloutProducer

LAYERS, TOP_K, EXPERTS = 48, 8, 128
DEFAULT_TOPIC_BYTES = 1_048_588  # Kafka's default message.max.bytes (1 MiB + record batch overhead)
MB = 1e6
MiB = 1 << 20


@dataclass(frozen=True)
class Case:
    name: str
    tokens: int
    group_size: int
    groups: int
    chunked: bool

    @property
    def samples(self) -> int:
        return self.groups * self.group_size

    @property
    def topic_bytes(self) -> int:
        return DEFAULT_TOPIC_BYTES if self.chunked else MAX_RECORD_BYTES

    @property
    def chunk_bytes(self) -> int:
        return DEFAULT_CHUNK_BYTES if self.chunked else MAX_RECORD_BYTES


def moe_sample(tokens: int, group_index: int, rollout: int, group_size: int, run_id: str,
               rng: np.random.Generator) -> Sample:
    """One rollout of `tokens` tokens with its MoE routing replay, (tokens − 1, LAYERS, TOP_K) int32."""
    resp = max(1, tokens // 2)
    experts = rng.integers(0, EXPERTS, (max(0, tokens - 1), LAYERS, TOP_K), dtype=np.int32)
    return Sample(
        group_index=group_index, index=rollout, rollout_id=rollout, run_id=run_id, group_size=group_size,
        tokens=Array(rng.integers(0, 32000, tokens, dtype="<i4")), response_length=resp,
        reward=float(rollout % 4) / 4, loss_mask=Array(np.ones(resp, dtype="u1")),
        rollout_log_probs=Array(rng.random(resp, dtype="<f4") * -2.0), weight_versions=["1"],
        prompt=f"prompt {group_index}", rollout_routed_experts=ShapedArray.of(experts),
    )


def create_topics(conn: Connection, names: list[str], partitions: int, max_bytes: int, *,
                  log_append: bool) -> None:
    configs = {"max.message.bytes": str(max_bytes),
               **({"message.timestamp.type": "LogAppendTime"} if log_append else {})}
    admin = client_for(conn).admin(client_id=conn.client_id)
    try:
        for error in admin.create_topics([TopicSpec(n, partitions, 1, configs) for n in names]).values():
            if error is not None:
                raise error
    finally:
        admin.close()


def preload(conn: Connection, topic: str, case: Case, seed: int) -> dict[str, Any]:
    """Send the case's groups (one sample built at a time, a flush per group); the input's size and time."""
    rng = np.random.default_rng(seed)
    run_id = f"chunk-bench-{uuid.uuid4().hex[:6]}"
    producer = RolloutProducer(conn, topic, check=False, chunk_bytes=case.chunk_bytes)
    started, sample_bytes = time.monotonic(), 0
    try:
        for gi in range(case.groups):
            futures = []
            for r in range(case.group_size):
                sample = moe_sample(case.tokens, gi, r, case.group_size, run_id, rng)
                sample_bytes += len(encode_sample(sample))
                futures.append(producer.send(sample))
            producer.flush(timeout=600)
            failed = [e for f in futures if (e := f.exception()) is not None or not f.done()]
            if failed:
                raise RuntimeError(f"preloading {topic}: {failed[0] or 'not acknowledged'}")
    finally:
        producer.close(timeout=60)
    ends = {p: n for p, n in end_offsets(conn, topic).items() if n}
    return {"sample_bytes": sample_bytes, "records": sum(ends.values()), "end_offsets": ends,
            "seconds": time.monotonic() - started}


def read_back(conn: Connection, topic: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Committed records of `topic`: count, bytes, and the first and last broker timestamps (ms)."""
    ends = {p: n for p, n in end_offsets(conn, topic).items() if n}
    consumer = client_for(conn).assigned_consumer(client_id=conn.client_id, max_record_bytes=MAX_RECORD_BYTES)
    count = nbytes = 0
    first: int | None = None
    last: int | None = None
    try:
        tps = [TopicPartition(topic, p) for p in ends]
        consumer.assign(tps)
        consumer.seek_to_beginning(tps)
        deadline = time.monotonic() + timeout_s
        while tps and any(consumer.position(tp) < ends[tp.partition] for tp in tps):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} back took over {timeout_s:.0f} s")
            for records in consumer.poll(0.5).values():
                for rec in records:
                    count += 1
                    nbytes += len(rec.value or b"")
                    first = rec.timestamp if first is None else min(first, rec.timestamp)
                    last = rec.timestamp if last is None else max(last, rec.timestamp)
    finally:
        consumer.close()
    span = (last - first) / 1000 if first is not None and last is not None else 0.0
    return {"records": count, "bytes": nbytes, "span_s": span}


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^rollout_stream_{name}(?:_total)? (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def run_stage(conn: Connection, case: Case, topics: dict[str, str], ends: dict[int, int], max_open_mib: int,
              timeout_s: float) -> dict[str, Any]:
    """`rollout-stream run` on the input until its group has committed the whole of it."""
    group = f"chunk-bench-{uuid.uuid4().hex[:8]}"
    port = free_port()
    exe = Path(sys.executable).with_name("rollout-stream")
    cmd = [str(exe), "run", "--bootstrap-servers", conn.bootstrap_servers, "--input-topic", topics["input"],
           "--output-topic", topics["output"], "--dead-letter-topic", topics["dlq"], "--group-id", group,
           "--instance-id", group, "--chunk-kib", str(case.chunk_bytes >> 10),
           "--max-open-mib", str(max_open_mib), "--metrics-port", str(port), "--group-timeout", "3600"]
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def failed(what: str) -> RuntimeError:
        log.seek(0)
        tail = " | ".join(log.read().decode(errors="replace").strip().splitlines()[-8:])
        return RuntimeError(f"stage {what}; worker log: {tail}")

    admin = client_for(conn).admin(client_id=conn.client_id)
    tps = [TopicPartition(topics["input"], p) for p in ends]
    try:
        deadline = time.monotonic() + timeout_s
        while _http(port, "/readyz")[0] != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise failed("never became ready")
            time.sleep(0.02)
        ready, cpu0, rss0 = time.monotonic(), _cpu_s(proc.pid), _status_kib(proc.pid, "VmRSS") << 10
        while True:
            committed = admin.group_offsets([group], tps).get(group, {})
            if all(committed.get(tp, (-1, ""))[0] >= ends[tp.partition] for tp in tps):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise failed(f"did not commit the input ({committed})")
            time.sleep(0.05)
        seconds = time.monotonic() - ready
        cpu = _cpu_s(proc.pid) - cpu0
        hwm = _status_kib(proc.pid, "VmHWM") << 10
        for _ in range(100):  # the counters are the loop's snapshot, published at its next tick
            metrics = _http(port, "/metrics")[1]
            published = int(_metric(metrics, "samples_published"))
            if published >= case.samples:
                break
            time.sleep(0.05)
        dead = int(sum(float(v) for v in re.findall(r"^rollout_stream_dead_letters_total\{.*\} (\S+)$",
                                                     metrics, re.M)))
    finally:
        admin.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return {"seconds": seconds, "cpu_s": cpu, "vm_hwm": hwm, "rss_at_ready": rss0,
            "samples_published": published, "dead_letters": dead}


def run_passthrough(conn: Connection, topics: dict[str, str], ends: dict[int, int],
                    timeout_s: float) -> dict[str, Any]:
    spec = RunSpec(mode="passthrough", bootstrap=conn.bootstrap_servers, input_topic=topics["input"],
                   output_topic=topics["copy"], dead_letter_topic=topics["dlq"],
                   group_id=f"chunk-bench-copy-{uuid.uuid4().hex[:8]}", end_offsets=ends, timeout_s=timeout_s)
    proc = RunnerProcess(spec)
    try:
        drained = proc.wait_for("drained", timeout=timeout_s, first_record_within=120)
    finally:
        proc.kill()
    return {"seconds": drained["seconds"], "cpu_s": drained["cpu_s"], "vm_hwm": drained["peak_rss"]}


def run_case(conn: Connection, case: Case, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"chunk-bench-{case.name}-{uuid.uuid4().hex[:6]}"
    base = {"input": f"{prefix}-rollouts", "dlq": f"{prefix}-dlq"}
    create_topics(conn, list(base.values()), args.partitions, case.topic_bytes, log_append=False)
    made = list(base.values())
    out: dict[str, Any] = {"case": case.name, "tokens": case.tokens, "group_size": case.group_size,
                           "groups": case.groups, "samples": case.samples, "chunked": case.chunked,
                           "topic_max_message_bytes": case.topic_bytes, "chunk_bytes": case.chunk_bytes,
                           "max_open_mib": args.max_open_mib, "pairs": []}
    try:
        pre = preload(conn, base["input"], case, seed=case.tokens)
        out["preload"] = {k: v for k, v in pre.items() if k != "end_offsets"}
        group_bytes = pre["sample_bytes"] / case.groups
        out["group_bytes"] = group_bytes
        print(f"{case.name}: preloaded {case.samples} samples, {pre['sample_bytes'] / MB:,.0f} MB in "
              f"{pre['records']} records ({pre['seconds']:.0f} s)", file=sys.stderr, flush=True)
        for rep in range(args.repeats):
            topics = {**base, "output": f"{prefix}-train-{rep}", "copy": f"{prefix}-copy-{rep}"}
            create_topics(conn, [topics["output"], topics["copy"]], args.partitions, case.topic_bytes,
                          log_append=True)
            made += [topics["output"], topics["copy"]]
            pair: dict[str, Any] = {"order": "stage first" if rep % 2 == 0 else "passthrough first"}
            for side in (("stage", "passthrough") if rep % 2 == 0 else ("passthrough", "stage")):
                if side == "stage":
                    r = run_stage(conn, case, topics, pre["end_offsets"], args.max_open_mib, args.timeout)
                    r["output"] = read_back(conn, topics["output"])
                else:
                    r = run_passthrough(conn, topics, pre["end_offsets"], args.timeout)
                    r["output"] = read_back(conn, topics["copy"])
                r["samples_per_s"] = case.samples / r["seconds"]
                r["mb_per_s"] = pre["sample_bytes"] / MB / r["seconds"]
                span = r["output"]["span_s"]
                r["span_mb_per_s"] = pre["sample_bytes"] / MB / span if span else None
                pair[side] = r
                print(f"  {side}: {r['seconds']:.1f} s, {r['mb_per_s']:.0f} MB/s, span {span:.1f} s, "
                      f"VmHWM {r['vm_hwm'] / MiB:,.0f} MiB", file=sys.stderr, flush=True)
            pair["ratio"] = pair["passthrough"]["seconds"] / pair["stage"]["seconds"]
            st = pair["stage"]
            if st["samples_published"] != case.samples or st["dead_letters"]:
                pair["warning"] = (f"stage published {st['samples_published']} of {case.samples} samples, "
                                   f"{st['dead_letters']} dead letters")
                print(f"  WARNING: {pair['warning']}", file=sys.stderr, flush=True)
            out["pairs"].append(pair)
    finally:
        delete_topics(conn, made)
    return out


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    mem = next((int(line.split()[1]) << 10 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")), 0)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except OSError:
        commit = ""
    return {"cpu_model": model, "cpus": os.cpu_count(), "mem_bytes": mem, "python": platform.python_version(),
            "loadavg": os.getloadavg(), "commit": commit, "started": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                  time.gmtime())}


def cases(args: argparse.Namespace) -> list[Case]:
    known = {
        "32k-chunked": Case("32k-chunked", args.tokens_32k, args.group_size_32k, args.groups_32k, True),
        "32k-unchunked": Case("32k-unchunked", args.tokens_32k, args.group_size_32k, args.groups_32k, False),
        "128k-chunked": Case("128k-chunked", args.tokens_128k, args.group_size_128k, args.groups_128k, True),
    }
    return [known[name] for name in args.cases.split(",")]


def table(report: dict[str, Any]) -> str:
    rows = ["| case | samples (groups × size) | stage samples/s | stage MB/s | passthrough MB/s | "
            "stage / passthrough | stage span s (MB/s) | passthrough span s | "
            "worker VmHWM MiB (above ready) | "
            "group MB |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in report["cases"]:
        for p in c["pairs"]:
            st, pt = p["stage"], p["passthrough"]
            rows.append(
                f"| {c['case']} | {c['samples']} ({c['groups']} × {c['group_size']}) | "
                f"{st['samples_per_s']:.2f} | {st['mb_per_s']:.0f} | {pt['mb_per_s']:.0f} | "
                f"{p['ratio']:.2f} | {st['output']['span_s']:.1f} ({st['span_mb_per_s'] or 0:.0f}) | "
                f"{pt['output']['span_s']:.1f} | "
                f"{st['vm_hwm'] / MiB:,.0f} ({(st['vm_hwm'] - st['rss_at_ready']) / MiB:,.0f}) | "
                f"{c['group_bytes'] / MB:.0f} |")
    return "\n".join(rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--bootstrap", help="an address of a running broker (default: start one)")
    ap.add_argument("--cases", default="32k-chunked,32k-unchunked,128k-chunked")
    ap.add_argument("--tokens-32k", type=int, default=32_768)
    ap.add_argument("--group-size-32k", type=int, default=8)
    ap.add_argument("--groups-32k", type=int, default=4)
    ap.add_argument("--tokens-128k", type=int, default=131_072)
    ap.add_argument("--group-size-128k", type=int, default=2)
    ap.add_argument("--groups-128k", type=int, default=1)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="stage/passthrough pairs per case")
    ap.add_argument("--max-open-mib", type=int, default=1024, 
                    help="the worker's --max-open-mib (its default)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds for one drain")
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where an own broker keeps its data")
    ap.add_argument("--json", action="store_true", 
                    help="print the JSON report on stdout, the table on stderr")
    args = ap.parse_args(argv)
    unknown = set(args.cases.split(",")) - {"32k-chunked", "32k-unchunked", "128k-chunked"}
    if unknown:
        ap.error(f"unknown case(s): {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    todo = cases(args)
    report: dict[str, Any] = {"machine": machine(), "cases": []}
    with tempfile.TemporaryDirectory(prefix="chunked-bench-", dir=args.tmp) as tmp:
        # Per case on disk: the input, the stage's output and the passthrough's copy per repeat.
        need = max(c.samples * c.tokens * 1600 * (1 + 2 * args.repeats) for c in todo)
        free = shutil.disk_usage(tmp).free
        if not args.bootstrap and free < need:
            print(f"{tmp}: {free / 1e9:.0f} GB free, a case needs about {need / 1e9:.0f} GB", file=sys.stderr)
            return 2
        broker = None if args.bootstrap else LocalBroker(port=free_port(), data_dir=Path(tmp) / "kafka")
        conn = Connection(args.bootstrap if broker is None else broker.start(timeout=180))
        try:
            for case in todo:
                report["cases"].append(run_case(conn, case, args))
        finally:
            if broker is not None:
                broker.stop(timeout=60)
    report["machine"]["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = table(report)
    if args.json:
        print(json.dumps(report, indent=2))
        print(text, file=sys.stderr)
    else:
        print(f"{report['machine']['cpu_model']}, {report['machine']['cpus']} CPUs")
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
