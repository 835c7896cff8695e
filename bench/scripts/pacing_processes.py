#!/usr/bin/env python
"""Reproduce the held-out paced run on a real local broker and measure where the trainer waits.

Setup (one run):
  * a local broker (started here if --bootstrap is not given: `rollout-stream broker start --port 29500
    --data-dir /tmp/pm-kafka`, stopped at the end with `broker stop --data-dir /tmp/pm-kafka`);
  * fresh topics per run via `rollout-stream topics create` (default 3 partitions);
  * the worker as a subprocess: `rollout-stream run ...` with the default cadence (commit-interval 0.1,
    exactly-once), --metrics-port to know when it is ready;
  * one trainer subprocess: TrainDataReader(groups_per_batch=4, max_weight_staleness=1, partition_idle_ms=X,
    everything else default), 1 s per step, weight version +1 per step (set after the step, then commit, as
    tests/stream/pacing/test_pacing_simulation.py does); it publishes its current version to a file;
  * three producer subprocesses: each a RolloutProducer (paced: max_policy_lag=1, max_unconsumed_groups=12);
    loop: read the trainer's current version w from the file, admit(w) (paced; WeightsTooOld -> reread),
    sleep 0.1 s (generation), send_many one group of 4 rollouts.
  All children wait for a common start time (a file handshake once all are ready) and run for --duration s.

Measured (trainer): groups trained, groups skipped stale, per-step wait in next_batch (p50/p90/max, steps
after the first), idle share = sum of waits after the first batch / wall time from the first batch to the
end; plus instrumentation of the reader's merge (a GroupMerger subclass patched into
rollout_stream.reader.fetch in the trainer process only, no repo edit): for every popped group, the time it
sat in the merger (pop − push), the record-timestamp age at push (worker commit + fetch) and at pop, and
whether another partition was empty at pop (the idle path).

Usage (from the checkout, with its virtualenv):
  .venv/bin/python bench/scripts/pacing_processes.py --runs \
      paced:2000,paced:250,paced:0,unpaced:2000 \
      --duration 40 --out /tmp/pacing-runs
Each run's JSON goes to <out>/results.jsonl, child logs to <out>/logs/<run>/.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

MAIN = Path(__file__).resolve().parents[4]  # the checkout
CLI = str(Path(sys.executable).parent / "rollout-stream")
PY = sys.executable
DATA_DIR = "/tmp/pm-kafka"
PORT = 29500

GROUPS_PER_BATCH = 4
ROLLOUTS = 4
STEP_S = 1.0
GENERATE_S = 0.1
STALENESS = 1
MAX_POLICY_LAG = 1
MAX_UNCONSUMED = 12


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return round(s[lo] + (s[hi] - s[lo]) * (k - lo), 4)


def wait_go(rundir: Path, hard_deadline: float) -> float:
    """Block until the orchestrator writes the common start time; returns it (epoch seconds)."""
    go = rundir / "go"
    while not go.exists():
        if time.time() > hard_deadline:
            raise SystemExit("no go signal before the deadline")
        time.sleep(0.05)
    t0 = float(go.read_text())
    while time.time() < t0:
        time.sleep(min(0.01, max(0.0, t0 - time.time())))
    return t0


def arm_deadline(hard_deadline: float) -> None:
    """Every child dies by itself at its hard deadline (SIGALRM → exit), whatever it is blocked on."""
    def die(*_: object) -> None:
        os._exit(124)
    signal.signal(signal.SIGALRM, die)
    signal.alarm(max(1, int(hard_deadline - time.time())))


# ---- child: producer --------------------------------------------------------------------------------------
def producer_main(a: argparse.Namespace) -> int:
    arm_deadline(a.hard_deadline)
    from rollout_stream.codec import Array, Sample
    from rollout_stream.pacing import PacingTimeout, WeightsTooOld
    from rollout_stream.producer import RolloutProducer

    rundir = Path(a.rundir)
    pacing = ({"trainer_group_id": a.trainer_group, "train_data_topic": a.output_topic,
               "max_policy_lag": MAX_POLICY_LAG, "max_unconsumed_groups": MAX_UNCONSUMED} if a.paced else {})
    vfile = rundir / "version"

    def version() -> int:
        while True:
            try:
                return int(vfile.read_text())
            except (FileNotFoundError, ValueError):
                time.sleep(0.01)

    out = {"id": a.producer_id, "generated": 0, "reloads": 0, "admit_timeouts": 0, "admit_wait_s": 0.0,
           "versions": {}, "admit_waits_s": []}
    producer = RolloutProducer(a.bootstrap, a.input_topic, producer_id=a.producer_id, **pacing)
    (rundir / f"ready-{a.producer_id}").write_text("1")
    t0 = wait_go(rundir, a.hard_deadline)
    end = t0 + a.duration
    g = 0
    next_burst = t0 + a.burst_every if a.burst_every else float("inf")
    burst_left = 0
    try:
        while time.time() < end:
            if time.time() >= next_burst:  # every producer at the same instants: a burst of groups at once
                burst_left, next_burst = a.burst_groups, next_burst + a.burst_every
            w = version()
            if a.paced:
                admitted = False
                began = time.monotonic()
                while time.time() < end:
                    try:
                        producer.admit(w, timeout=min(1.0, max(0.05, end - time.time())))
                        admitted = True
                        break
                    except PacingTimeout:
                        out["admit_timeouts"] += 1
                    except WeightsTooOld:
                        out["reloads"] += 1
                        w = version()
                out["admit_wait_s"] += time.monotonic() - began
                if not admitted:
                    break
                out["admit_waits_s"].append(round(time.monotonic() - began, 4))
            if burst_left:
                burst_left -= 1  # a burst's groups are ready at once: no generation time between them
            else:
                time.sleep(GENERATE_S)
            group = [Sample(group_index=g, rollout_id=r, reward=float(r % 2), tokens=Array([1, 2, 3]),
                            response_length=2, weight_versions=[str(w)]) for r in range(ROLLOUTS)]
            if a.die_mid_group_at and time.time() >= t0 + a.die_mid_group_at:
                from rollout_stream.producer import numbered_group

                for sample in numbered_group(group, run_id=a.producer_id)[:ROLLOUTS // 2]:
                    producer.send(sample)  # half a group, then gone without a word (kill -9)
                producer.flush(timeout=10)
                (rundir / f"died-{a.producer_id}").write_text(str(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            producer.send_many(group, run_id=a.producer_id)
            out["generated"] += 1
            out["versions"][str(w)] = out["versions"].get(str(w), 0) + 1
            g += 1
        if producer.pacing is not None:
            p = producer.pacing
            out["pacing"] = {"admitted": p.admitted, "waits": p.waits, "wait_s": round(p.wait_s, 3),
                             "max_wait_s": round(p.max_wait_s, 3)}
    finally:
        producer.flush(timeout=10)
        producer.close(timeout=10)
        out["admit_wait_s"] = round(out["admit_wait_s"], 3)
        (rundir / f"result-{a.producer_id}.json").write_text(json.dumps(out))
    return 0


# ---- child: trainer ---------------------------------------------------------------------------------------
def trainer_main(a: argparse.Namespace) -> int:
    arm_deadline(a.hard_deadline)
    import rollout_stream.reader as R
    import rollout_stream.reader.fetch as fetch_thread
    from rollout_stream.core.assembly import GroupMerger

    merge: dict[str, Any] = {"pops": 0, "idle_path_pops": 0, "hold_ms": [], "hold_ms_idle_path": [],
                             "age_at_push_ms": [], "age_at_pop_ms": []}

    class MeasuredMerger(GroupMerger):
        """GroupMerger with timing of each group: how long it sat here, and why it left."""

        def push(self, group):  # type: ignore[no-untyped-def]
            now = time.time() * 1000
            group_pushed[id(group)] = now
            merge["age_at_push_ms"].append(now - group.merge_key[0])
            super().push(group)

        def pop(self, now_ms, caught_up):  # type: ignore[no-untyped-def]
            empty_other = [p for p, q in self.queues.items() if not q]
            group = super().pop(now_ms, caught_up)
            if group is not None:
                now = time.time() * 1000
                hold = now - group_pushed.pop(id(group), now)
                merge["pops"] += 1
                merge["hold_ms"].append(hold)
                merge["age_at_pop_ms"].append(now - group.merge_key[0])
                if empty_other:
                    merge["idle_path_pops"] += 1
                    merge["hold_ms_idle_path"].append(hold)
            return group

    group_pushed: dict[int, float] = {}
    fetch_thread.GroupMerger = MeasuredMerger  # type: ignore[misc]  # the fetch thread looks it up at run time

    rundir = Path(a.rundir)
    vfile = rundir / "version"

    def set_version(v: int) -> None:
        tmp = rundir / "version.tmp"
        tmp.write_text(str(v))
        os.replace(tmp, vfile)

    idle = None if a.partition_idle_ms == -1 else a.partition_idle_ms
    # -1: None; -2: the reader's default
    kw: dict[str, Any] = {} if idle == -2 else {"partition_idle_ms": idle}
    reader = R.TrainDataReader(a.bootstrap, a.output_topic, a.trainer_group,
                               groups_per_batch=GROUPS_PER_BATCH, max_weight_staleness=STALENESS, **kw)
    restarted = vfile.exists()  # a trainer restarted after a kill: its committed step and version go on
    version = int(vfile.read_text()) if restarted else 0
    reader.set_weight_version(version)
    set_version(version)
    (rundir / f"ready-trainer{a.incarnation or ''}").write_text("1")
    t0 = wait_go(rundir, a.hard_deadline)
    end = t0 + a.duration
    waits: list[float] = []  # completed next_batch waits, in order
    trained = batches = 0
    skipped = []
    lags: dict[str, int] = {}
    first_at = None
    tail_wait = 0.0  # a next_batch cut by the end of the run
    batch_log = []
    while time.time() < end:
        asked = time.monotonic()
        batch = reader.next_batch(timeout=max(0.0, end - time.time()))
        waited = time.monotonic() - asked
        if batch is None:
            tail_wait = waited
            break
        got = time.time()
        waits.append(waited)
        if first_at is None:
            first_at = got
        batches += 1
        trained += len(batch.groups)
        skipped.append(batch.skipped_stale)
        for gi in batch.groups:
            if gi.oldest_weight_version is not None:
                lag = version - gi.oldest_weight_version
                lags[str(lag)] = lags.get(str(lag), 0) + 1
        batch_log.append({"t": round(got - t0, 3), "wait_s": round(waited, 3), "groups": len(batch.groups),
                          "skipped_stale": batch.skipped_stale, "version": version,
                          "partitions": [gi.partition for gi in batch.groups]})
        with (rundir / "batches.jsonl").open("a") as f:  # survives a kill -9 of this trainer
            f.write(json.dumps({**batch_log[-1], "at": got, "incarnation": a.incarnation,
                                "lags": [version - gi.oldest_weight_version for gi in batch.groups
                                         if gi.oldest_weight_version is not None]}) + "\n")
        time.sleep(STEP_S)  # the training step
        version += 1
        reader.set_weight_version(version)
        set_version(version)
        reader.commit()
    wall_end = time.time()
    steady = waits[1:]
    steady_wall = (wall_end - first_at) if first_at is not None else None
    idle_total = sum(steady) + tail_wait
    stats = reader.stats
    out = {
        "partition_idle_ms": idle, "batches": batches, "trained_groups": trained,
        "skipped_stale_in_batches": sum(skipped), "reader_skipped_stale": stats.skipped_stale_groups,
        "reader_groups_merged": stats.groups, "buffered_at_end": len(reader._held.items),
        "first_batch_s": round(first_at - t0, 3) if first_at else None,
        "first_wait_s": round(waits[0], 3) if waits else None,
        "steady_wall_s": round(steady_wall, 3) if steady_wall else None,
        "idle_total_s": round(idle_total, 3), "tail_wait_s": round(tail_wait, 3),
        "idle_share": round(idle_total / steady_wall, 4) if steady_wall else None,
        "wait_p50_s": pct(steady, 0.5), "wait_p90_s": pct(steady, 0.9),
        "wait_max_s": round(max(steady), 3) if steady else None,
        "lag_trained": lags, "final_version": version,
        "merge": {
            "pops": merge["pops"], "idle_path_pops": merge["idle_path_pops"],
            "hold_ms_p50": pct(merge["hold_ms"], 0.5), "hold_ms_p90": pct(merge["hold_ms"], 0.9),
            "hold_ms_max": round(max(merge["hold_ms"]), 1) if merge["hold_ms"] else None,
            "hold_ms_mean": round(statistics.fmean(merge["hold_ms"]), 1) if merge["hold_ms"] else None,
            "idle_path_hold_ms_p50": pct(merge["hold_ms_idle_path"], 0.5),
            "idle_path_hold_ms_p90": pct(merge["hold_ms_idle_path"], 0.9),
            "age_at_push_ms_p50": pct(merge["age_at_push_ms"], 0.5),
            "age_at_push_ms_p90": pct(merge["age_at_push_ms"], 0.9),
            "age_at_pop_ms_p50": pct(merge["age_at_pop_ms"], 0.5),
            "age_at_pop_ms_p90": pct(merge["age_at_pop_ms"], 0.9),
        },
        "batch_log": batch_log,
    }
    (rundir / f"result-trainer{a.incarnation or ''}.json").write_text(json.dumps(out))
    reader.close()
    return 0


# ---- orchestrator -----------------------------------------------------------------------------------------
def sh(cmd: list[str], log: Path | None = None, timeout: float = 120) -> str:
    print("$", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, cwd=MAIN, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "COLUMNS": "200"})
    if log is not None:
        with log.open("a") as f:
            f.write(f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}\nrc {r.returncode}\n")
    if r.returncode != 0:
        raise RuntimeError(f"{cmd} failed rc {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_children(procs: dict[str, subprocess.Popen[bytes]], grace: float = 20.0) -> dict[str, int | None]:
    """Terminate our own children by pid (SIGTERM, then SIGKILL after `grace`)."""
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.time() + grace
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)
    return {k: p.returncode for k, p in procs.items()}


def one_run(a: argparse.Namespace, bootstrap: str, mode: str, idle_ms: int, label: str) -> dict[str, Any]:
    paced = mode == "paced"
    tag = uuid.uuid4().hex[:6]
    rundir = Path(a.out) / "logs" / f"{label}-{tag}"  # fresh: the go/ready files are per run
    rundir.mkdir(parents=True, exist_ok=True)
    names = {"input": f"pm-{tag}-rollouts", "output": f"pm-{tag}-train-data", "dlq": f"pm-{tag}-dlq"}
    group_id = f"pm-{tag}"
    trainer_group = f"pm-{tag}-trainer"
    cmds = rundir / "commands.txt"
    sh([CLI, "topics", "create", "--bootstrap-servers", bootstrap, "--input-topic", names["input"],
        "--output-topic", names["output"], "--dead-letter-topic", names["dlq"],
        "--changelog-group-id", group_id, "--partitions", str(a.partitions)],
       cmds)
    env = {**os.environ, **({"ROLLOUT_STREAM_CLIENT": a.client} if a.client else {})}
    producers = [f"pm-{tag}-p{i}" for i in range(a.producers)]
    metrics_port = free_port()
    setup_budget = 90.0
    hard_deadline = time.time() + setup_budget + a.duration + 30
    procs: dict[str, subprocess.Popen[bytes]] = {}
    files = []

    def spawn(name: str, cmd: list[str]) -> None:
        f = (rundir / f"{name}.log").open("w")
        files.append(f)
        with cmds.open("a") as c:
            c.write("$ " + " ".join(cmd) + "\n")
        print("$", " ".join(cmd), flush=True)
        procs[name] = subprocess.Popen(cmd, cwd=MAIN, stdout=f, stderr=subprocess.STDOUT, env=env)

    load_before = uptime()
    result: dict[str, Any] = {"label": label, "mode": mode, "partition_idle_ms": idle_ms, "tag": tag,
                    "duration_s": a.duration, "uptime_before": load_before}
    spawned_at = time.time()
    try:
        spawn("worker", [CLI, "run", "--bootstrap-servers", bootstrap, "--input-topic", names["input"],
                         "--output-topic", names["output"], "--dead-letter-topic", names["dlq"],
                         "--group-id", group_id, "--metrics-port", str(metrics_port),
                         "--log-level", "warning", "--group-timeout", "10",
                         "--progress-interval", "3600"])
        common = ["--rundir", str(rundir), "--bootstrap", bootstrap, "--input-topic", names["input"],
                  "--output-topic", names["output"], "--trainer-group", trainer_group,
                  "--duration", str(a.duration), "--hard-deadline", str(hard_deadline)]
        trainer_cmd = [PY, str(Path(__file__).resolve()), "trainer", *common,
                       "--partition-idle-ms", str(idle_ms)]
        spawn("trainer", trainer_cmd)
        burst = ["--burst-every", str(a.burst_every), "--burst-groups", str(a.burst_groups)]
        for i, pid in enumerate(producers):
            dies = ["--die-mid-group-at", str(a.kill_producer_at)] if i == 0 and a.kill_producer_at else []
            spawn(f"producer{i}", [PY, str(Path(__file__).resolve()), "producer", *common, "--producer-id",
                                   pid, *(["--paced"] if paced else []), *burst, *dies])
        # ready: the worker's /readyz, and a ready file from every child
        need = ["ready-trainer"] + [f"ready-{pid}" for pid in producers]
        worker_ready = False
        limit = time.time() + setup_budget
        while time.time() < limit:
            for name, p in procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited early rc {p.returncode}; see {rundir}/{name}.log")
            if not worker_ready:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=1) as r:
                        worker_ready = r.status == 200
                except Exception:
                    pass
            if worker_ready and all((rundir / n).exists() for n in need):
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"not ready within {setup_budget}s (worker ready {worker_ready})")
        t0 = time.time() + 1.0
        (rundir / "go.tmp").write_text(repr(t0))
        os.replace(rundir / "go.tmp", rundir / "go")  # whole or absent: a child never reads it half-written
        result["setup_s"] = round(t0 - spawned_at, 1)
        trainer = "trainer"
        if a.restart_trainer_at:
            time.sleep(max(0.0, t0 + a.restart_trainer_at - time.time()))
            procs["trainer"].kill()  # kill -9: no commit, no goodbye
            procs["trainer"].wait(timeout=30)
            result["trainer_killed_at_s"] = round(time.time() - t0, 2)
            trainer = "trainer1"
            spawn(trainer, [*trainer_cmd, "--incarnation", "1"])
        # the children end by themselves at t0 + duration; wait for the trainer and producers
        for name in [trainer] + [f"producer{i}" for i in range(len(producers))]:
            procs[name].wait(timeout=max(1.0, hard_deadline - time.time()))
        result["uptime_after"] = uptime()
        result["trainer"] = json.loads((rundir / f"result-{trainer}.json").read_text())
        result["producers"] = [json.loads((rundir / f"result-{pid}.json").read_text())
                               for pid in producers if (rundir / f"result-{pid}.json").exists()]
        result["producer_died_mid_group"] = [pid for pid in producers if (rundir / f"died-{pid}").exists()]
        result["deployment"] = deployment_summary(rundir, result, t0, a.duration)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result.setdefault("uptime_after", uptime())
    finally:
        result["exit_codes"] = stop_children(procs)
        for f in files:
            f.close()
        try:  # drop the run's topics (best effort)
            sys.path.insert(0, str(MAIN))
            from rollout_stream.clients import Connection
            from rollout_stream.kafka import client_for
            admin = client_for(Connection(bootstrap)).admin(client_id="pacing-bench")
            try:
                admin.delete_topics([names["input"], names["output"], names["dlq"]])
            finally:
                admin.close()
        except Exception as exc:
            result["cleanup_error"] = f"{type(exc).__name__}: {exc}"
    return result


def deployment_summary(rundir: Path, result: dict[str, Any], t0: float, duration: float) -> dict[str, Any]:
    """Over every trainer incarnation (batches.jsonl): trained, skipped stale, the policy-lag histogram and
    the trainer's idle share in steady state (without each incarnation's first batch and 5 s after a
    restart); over every producer: admission waits."""
    lines = [json.loads(x) for x in (rundir / "batches.jsonl").read_text().splitlines()] \
        if (rundir / "batches.jsonl").exists() else []
    killed = result.get("trainer_killed_at_s")
    firsts, steady_waits = set(), []
    for inc in {b["incarnation"] for b in lines}:
        firsts.add(id(min((b for b in lines if b["incarnation"] == inc), key=lambda b: b["at"])))
    for b in lines:
        after_restart = killed is not None and b["incarnation"] > 0 and b["at"] - t0 < killed + 5
        if id(b) not in firsts and not after_restart:
            steady_waits.append(b["wait_s"])
    steady_wall = duration - (lines[0]["at"] - t0 if lines else duration)  # from the first batch on
    if killed is not None:  # the restart's gap and the 5 s after it are not steady state
        restarted = [b["at"] - t0 for b in lines if b["incarnation"] > 0]
        steady_wall -= max(killed + 5, min(restarted, default=killed + 5)) - killed
    lags: dict[str, int] = {}
    for b in lines:
        for lag in b["lags"]:
            lags[str(lag)] = lags.get(str(lag), 0) + 1
    waits = [w for p in result.get("producers", []) for w in p.get("admit_waits_s", [])]
    return {
        "trained": sum(b["groups"] for b in lines), "skipped_stale": sum(b["skipped_stale"] for b in lines),
        "batches": len(lines), "policy_lag": dict(sorted(lags.items(), key=lambda kv: int(kv[0]))),
        "trainer_idle_share": round(sum(steady_waits) / steady_wall, 4) if steady_wall > 0 else None,
        "admission_wait_p50_s": pct(waits, 0.5), "admission_wait_p99_s": pct(waits, 0.99),
        "generated": sum(p["generated"] for p in result.get("producers", [])),
    }


def summary_row(r: dict[str, Any]) -> str:
    t = r.get("trainer")
    if not t:
        return f"| {r['label']} | {r['mode']} | {r['partition_idle_ms']} | ERROR {r.get('error')} |"
    gen = sum(p["generated"] for p in r["producers"])
    m = t["merge"]
    return (f"| {r['label']} | {r['mode']} | {r['partition_idle_ms']} | {t['batches']} | "
            f"{t['trained_groups']} | "
            f"{t['reader_skipped_stale']} | {gen} | {(t['idle_share'] or 0) * 100:.1f} % | "
            f"{t['wait_p50_s']} | "
            f"{t['wait_p90_s']} | {t['wait_max_s']} | {t['first_batch_s']} | "
            f"{m['idle_path_pops']}/{m['pops']} | {m['hold_ms_p50']} / {m['hold_ms_p90']} | "
            f"{m['age_at_push_ms_p50']} |")


HEADER = ("| run | mode | idle_ms | batches | trained | skipped stale | generated | idle share | "
          "wait p50 s | wait p90 s | wait max s | first batch s | idle-path pops | merge hold p50/p90 ms | "
          "age at push p50 ms |\n"
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def orchestrate(a: argparse.Namespace) -> int:
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    started_broker = False
    bootstrap = a.bootstrap
    if not bootstrap:
        bootstrap = sh([CLI, "broker", "start", "--port", str(PORT), "--data-dir", DATA_DIR],
                       out / "logs" / "broker.txt", timeout=180).strip().splitlines()[-1]
        started_broker = True
    print("bootstrap", bootstrap, "|", uptime(), flush=True)
    try:
        for i, spec in enumerate(a.runs.split(",")):
            mode, idle = spec.split(":")
            label = f"{i:02d}-{mode}-{idle}"
            if a.stop_at and time.time() + a.duration + 60 > a.stop_at:
                print("skipping", label, "(would pass --stop-at)", flush=True)
                continue
            print(f"== {label}", flush=True)
            r = one_run(a, bootstrap, mode, int(idle), label)
            with (out / "results.jsonl").open("a") as f:
                f.write(json.dumps(r) + "\n")
            print(HEADER.splitlines()[0])
            print(summary_row(r), flush=True)
            print("  ", r.get("uptime_before"), "->", r.get("uptime_after"), r.get("error", ""), flush=True)
    finally:
        if started_broker and not a.keep_broker:
            sh([CLI, "broker", "stop", "--data-dir", DATA_DIR], out / "logs" / "broker.txt", timeout=120)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", nargs="?", default="orchestrate", choices=["orchestrate", "trainer", "producer"])
    ap.add_argument("--runs", default="paced:2000,paced:250,paced:0,unpaced:2000",
                    help="comma list of mode:partition_idle_ms (mode paced|unpaced; -1 = None)")
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--out", default="pacing-runs", help="results.jsonl and the child logs go here")
    ap.add_argument("--bootstrap", default=None, help="use this broker instead of starting one")
    ap.add_argument("--keep-broker", action="store_true")
    ap.add_argument("--stop-at", type=float, default=0.0, help="epoch: skip runs that would end after it")
    # children
    ap.add_argument("--rundir")
    ap.add_argument("--input-topic")
    ap.add_argument("--output-topic")
    ap.add_argument("--trainer-group")
    ap.add_argument("--hard-deadline", type=float)
    ap.add_argument("--partition-idle-ms", type=int, default=2000)
    ap.add_argument("--producer-id")
    ap.add_argument("--paced", action="store_true")
    ap.add_argument("--incarnation", type=int, default=0, help="the trainer's restarts so far")
    ap.add_argument("--die-mid-group-at", type=float, default=0.0,
                    help="a producer sends half a group this many seconds in, then kills itself (-9)")
    # the deployment's shape (orchestrator; producers get --burst-* too)
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=3, help="of the rollouts and train-data topics")
    ap.add_argument("--client", default=None, help="confluent or kafka-python, for every process")
    ap.add_argument("--burst-every", type=float, default=0.0,
                    help="every producer sends --burst-groups groups back to back every this many seconds")
    ap.add_argument("--burst-groups", type=int, default=5)
    ap.add_argument("--kill-producer-at", type=float, default=0.0,
                    help="the first producer dies mid-group this many seconds in (0: never)")
    ap.add_argument("--restart-trainer-at", type=float, default=0.0,
                    help="kill -9 the trainer this many seconds in and start it again (0: never)")
    a = ap.parse_args()
    if a.role == "trainer":
        return trainer_main(a)
    if a.role == "producer":
        return producer_main(a)
    return orchestrate(a)


if __name__ == "__main__":
    sys.exit(main())
