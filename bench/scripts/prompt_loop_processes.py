#!/usr/bin/env python
"""The loop at a deployment's shape on a real broker: a dataset trained through crashes of every part
(docs/loop.md, "Through any crash").

One run:
  * a JSONL dataset of --prompts rows, a fifth of them (drawn with the run's seed) "long": their rollouts
    take 5x as long as the others';
  * fresh topics (`rollout-stream topics create`, 3 partitions); the stage as `rollout-stream run`
    (exactly-once, --group-timeout 10);
  * --rollout-processes rollout processes (OS processes): each a `PromptSource` over the dataset (2 epochs
    declared), holding up to IN_FLIGHT prompts at once like an inference engine, asking with TAKERS takes
    at once, each group of ROLLOUTS rollouts published when its rollout time has passed, taken at the
    weight version the trainer last wrote; paced (max_policy_lag = the trainer's staleness bound) unless
    --pacing off;
  * a 2-rank trainer: two processes, each a `TrainDataReader(rank=r, world_size=2, fence=prompt_fence(...))`,
    STEP_S per step, the weight version +1 per step, a commit once both ranks hold the batch (a file
    barrier, as a step's all-reduce); each rank appends every batch it receives to its own file before
    committing, so a batch trained again after a kill is seen twice.
  The trainer stops after one and a half epochs of groups. Along the way, at fractions of that progress:
  a rollout process sends half a group and kills itself (-9) and is started again; one is SIGSTOPped past
  its lease, while two or more of its takes wait in the log for a prompt (the trainer pauses a moment
  first, so that pacing has no room), and resumed; the stage is killed -9 and started again; both trainer
  ranks are killed -9 and started again.

Checked at the end (`verdict`), from the trainer ranks' files, the dead-letter topic and the admission log
folded to its end: every prompt of the first epoch trained exactly once (in one batch index; a batch trained
again after the trainer's kill holds the same groups) or dead-lettered once with its reason; what the log
says trained is what the trainer trained; the long prompts' trained share equals the short ones' within 2
points; every group trained whole, its rollouts split between the two ranks.

Usage (from the checkout, with its virtualenv; a broker is started if --bootstrap is not given):
  .venv/bin/python bench/scripts/prompt_loop_processes.py --runs 10 --client confluent \
      --out /tmp/loop-runs
Each run's JSON goes to <out>/results.jsonl, the children's logs to <out>/logs/<run>/.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

MAIN = Path(__file__).resolve().parents[2]  # the checkout
CLI = str(Path(sys.executable).parent / "rollout-stream")
PY = sys.executable
DATA_DIR = "/tmp/loop-kafka"
PORT = 29600
SOURCE = "loop"

ROLLOUTS = 4  # per group
RESPONSE = 4  # response tokens of a rollout (after 2 prompt tokens)
IN_FLIGHT = 8  # prompts a rollout process holds at once
TAKERS = 3  # a rollout process's takes at once
SHORT_S = 0.04  # a short prompt's rollout time; a long one's is LONG_FACTOR times it
LONG_FACTOR = 5
LONG_SHARE = 0.2
GROUPS_PER_BATCH = 32
STEP_S = 0.03
STALENESS = 4
MAX_UNCONSUMED = 8 * GROUPS_PER_BATCH
EPOCHS = 1.5
FREEZE_S = 7.0  # past the 3 s lease and its margin
# when each fault happens, as a fraction of the trained groups the run aims at
KILL_ROLLOUT_AT, FREEZE_AT, KILL_STAGE_AT, KILL_TRAINER_AT = 0.10, 0.18, 0.45, 0.65


# ---- the children ------------------------------------------------------------------------------------
def arm_deadline(hard_deadline: float) -> None:
    """A child dies by itself at the run's hard deadline, whatever it is blocked on."""
    signal.signal(signal.SIGALRM, lambda *_: os._exit(124))
    signal.alarm(max(1, int(hard_deadline - time.time())))


def read_version(rundir: Path) -> int:
    try:
        return int((rundir / "version").read_text())
    except (FileNotFoundError, ValueError):
        return 0


def make_group(taken: int, now: int) -> list[Any]:
    """A group of ROLLOUTS rollouts of RESPONSE tokens each, taken at weight version `taken`. With the trainer
    at `now` > `taken` when they finish, generation was interrupted by the update: rollout 0 finished under
    `taken`, the last one started only after the update (all at `now`), and each one between is a partial
    rollout, its last i tokens generated under `now`."""
    from rollout_stream.codec import Array, Sample

    out = []
    for i in range(ROLLOUTS):
        spans: dict[str, Any] = {"weight_versions": [str(taken)]}
        if now > taken and i == ROLLOUTS - 1:
            spans = {"weight_versions": [str(now)]}
        elif now > taken and i > 0:
            spans = {"weight_versions": [str(taken), str(now)], "weight_version_offsets": [0, RESPONSE - i]}
        out.append(Sample(group_index=0, index=i, rollout_id=i, reward=float(i % 2),
                          tokens=Array(list(range(1, 3 + RESPONSE))), response_length=RESPONSE, **spans))
    return out


def rollout_main(a: argparse.Namespace) -> int:
    """Take prompts (TAKERS threads at once, as an engine's free slots ask), generate (sleep the prompt's
    rollout time), publish; until the stop file appears. Every 20 ms the process writes down how many of
    its takes have been waiting for a prompt for 0.2 s or more (`takes-<producer>.json`): the orchestrator
    freezes it only while two or more wait."""
    arm_deadline(a.hard_deadline)
    import threading

    import msgspec

    from rollout_stream.pacing import AdmissionRevoked, PacingTimeout, WeightsTooOld
    from rollout_stream.prompts import NothingToTake, PromptSource, SourceFinished

    rundir = Path(a.rundir)
    paced = a.pacing == "on"
    source = PromptSource(a.bootstrap, rundir / "prompts.jsonl", name=SOURCE,
                          trainer_group_id=a.trainer_group,
                          topic=a.input_topic, train_data_topic=a.output_topic, epochs=a.declared_epochs,
                          seed=a.seed,
                          producer_id=a.producer_id, dead_letter_topic=a.dlq_topic,
                          max_policy_lag=a.policy_lag if paced else None,
                          max_unconsumed_groups=MAX_UNCONSUMED if paced else None)
    (rundir / f"ready-{a.producer_id}").touch()
    out = Counter[str]()
    lock = threading.Lock()
    inflight: list[tuple[float, int, Any, int]] = []  # (due, tie, lease, weight version)
    taking: dict[int, float] = {}  # taker thread -> when its current take began (monotonic)
    failed: list[BaseException] = []
    stop = rundir / "stop"
    die = rundir / f"die-{a.producer_id}"
    takes_file = rundir / f"takes-{a.producer_id}.json"

    def taker(slot: int) -> None:
        try:
            while not stop.exists():
                with lock:
                    full = len(inflight) >= IN_FLIGHT
                if full:
                    time.sleep(0.01)
                    continue
                version = read_version(rundir)
                with lock:
                    taking[slot] = time.monotonic()
                try:
                    lease = source.take(weight_version=version, timeout=2.0)
                except (PacingTimeout, NothingToTake):
                    with lock:
                        out["take_timeouts"] += 1
                    continue
                except WeightsTooOld:
                    with lock:
                        out["too_old"] += 1
                    continue
                except SourceFinished:
                    time.sleep(0.2)
                    continue
                finally:
                    with lock:
                        taking.pop(slot, None)
                long = bool(lease.row["long"])
                rollout_s = SHORT_S * (LONG_FACTOR if long else 1)
                with lock:
                    heapq.heappush(inflight, (time.monotonic() + rollout_s, lease.request, lease, version))
                    out["taken"] += 1
                    out["taken_long" if long else "taken_short"] += 1
        except BaseException as exc:  # the main thread ends the process with it
            failed.append(exc)

    takers = [threading.Thread(target=taker, args=(i,), daemon=True) for i in range(TAKERS)]
    for t in takers:
        t.start()
    try:
        reported = 0.0
        while not stop.exists():
            if failed:
                raise failed[0]
            now = time.monotonic()
            if now - reported >= 0.02:
                reported = now
                with lock:
                    waiting = sum(now - began >= 0.2 for began in taking.values())
                takes_file.with_suffix(".tmp").write_text(json.dumps({"at": time.time(), "waiting": waiting}))
                os.replace(takes_file.with_suffix(".tmp"), takes_file)
            with lock:
                due = heapq.heappop(inflight) if inflight and inflight[0][0] <= now else None
            if due is None:
                time.sleep(0.005)
                continue
            _, _, lease, version = due
            group = make_group(version, read_version(rundir) if a.spans == "on" else version)
            if die.exists():  # half a group, then gone without a word
                source.gate.bind(str(lease.key), lease.request)
                for sample in group[:ROLLOUTS // 2]:
                    source.producer.send(msgspec.structs.replace(
                        sample, group_index=lease.group_index, run_id=lease.run_id, group_size=ROLLOUTS,
                        sibling_count=1, sibling_index=0))
                source.producer.flush()
                (rundir / f"died-{a.producer_id}").write_text(str(lease.key))
                os.kill(os.getpid(), signal.SIGKILL)
            try:
                source.publish(lease, group)
                with lock:
                    out["published"] += 1
            except AdmissionRevoked:  # frozen past its lease: the prompt was handed out again
                with lock:
                    out["revoked"] += 1
    finally:
        for t in takers:
            t.join(timeout=10)
        source.close()
        (rundir / f"result-{a.producer_id}-{os.getpid()}.json").write_text(json.dumps(out))
    return 0


def stop_at(rundir: Path) -> int:
    """The batch count both ranks stop at, once the orchestrator has set it (`--until-settled`)."""
    try:
        return int((rundir / "stop-at").read_text())
    except (FileNotFoundError, ValueError):
        return sys.maxsize


def barrier(rundir: Path, incarnation: int, index: int, rank: int, hard_deadline: float) -> None:
    """Wait until both ranks hold batch `index` (this incarnation of the trainer)."""
    (rundir / "barrier" / f"{incarnation}-{index}-{rank}").touch()
    while not all((rundir / "barrier" / f"{incarnation}-{index}-{r}").exists() for r in range(2)):
        if time.time() > hard_deadline:
            os._exit(124)
        time.sleep(0.005)


def trainer_main(a: argparse.Namespace) -> int:
    """One rank: read batches, train (sleep), write down what it trained, wait for the other rank, commit."""
    arm_deadline(a.hard_deadline)
    import logging

    from rollout_stream.clients import Connection
    from rollout_stream.logs import configure_logging
    from rollout_stream.prompts import prompt_fence
    from rollout_stream.reader import TrainDataReader

    configure_logging(level="warning")
    logging.getLogger("rollout_stream.reader").setLevel(logging.INFO)  # its resume and stale skips

    rundir = Path(a.rundir)
    (rundir / "barrier").mkdir(exist_ok=True)
    reader = TrainDataReader(a.bootstrap, a.output_topic, a.trainer_group, groups_per_batch=GROUPS_PER_BATCH,
                             rank=a.rank, world_size=2, max_weight_staleness=STALENESS, staleness=a.staleness,
                             fence=prompt_fence(Connection(a.bootstrap), a.output_topic))
    version = read_version(rundir)
    reader.set_weight_version(version)
    (rundir / f"ready-trainer{a.rank}-{a.incarnation}").touch()
    log = (rundir / f"rank{a.rank}.jsonl").open("a")
    try:
        while True:
            batch = reader.next_batch(timeout=60)
            if batch is None:
                sys.exit("no batch within 60 s")
            log.write(json.dumps({
                "batch": batch.index, "incarnation": a.incarnation, "at": time.time(),
                "groups": [g.key for g in batch.groups],
                "samples": [[s.group_key, s.sample.rollout_id] for s in batch.samples],
                "skipped_stale": batch.skipped_stale, "skipped_superseded": batch.skipped_superseded,
                "stale_rollouts": batch.stale_rollouts, "stale_tokens": batch.stale_tokens,
                "loss_tokens": batch.global_loss_tokens}) + "\n")
            log.flush()
            time.sleep(a.step_s)
            version = batch.index + 1
            reader.set_weight_version(version)
            barrier(rundir, a.incarnation, batch.index, a.rank, a.hard_deadline)
            reader.commit()
            if a.rank == 0:  # the weights the rollout processes load; a restarted trainer goes on from them
                (rundir / "version.tmp").write_text(str(version))
                os.replace(rundir / "version.tmp", rundir / "version")
            if batch.index + 1 >= a.batches or batch.index + 1 >= stop_at(rundir):
                break
        (rundir / f"stats-trainer{a.rank}-{a.incarnation}.json").write_text(json.dumps(vars(reader.stats)))
    finally:
        log.close()
        reader.close()
    return 0


# ---- the orchestrator -------------------------------------------------------------------------------
def sh(cmd: list[str], log: Path, timeout: float = 180) -> str:
    r = subprocess.run(cmd, cwd=MAIN, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "COLUMNS": "200"})
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n{r.stdout}{r.stderr}\nrc {r.returncode}\n")
    if r.returncode != 0:
        raise RuntimeError(f"{cmd} failed rc {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_dataset(path: Path, prompts: int, seed: int) -> set[int]:
    long = set(random.Random(seed).sample(range(prompts), round(prompts * LONG_SHARE)))
    with path.open("w") as f:
        for i in range(prompts):
            f.write(json.dumps({"prompt": f"q{i}", "long": i in long}) + "\n")
    return long


def trained_groups(rundir: Path) -> int:
    """Groups in batches rank 0 has received so far (batch indices, not lines: a replay counts once)."""
    path = rundir / "rank0.jsonl"
    if not path.exists():
        return 0
    seen = set()
    for line in path.read_text().splitlines():
        try:
            seen.add(json.loads(line)["batch"])
        except (ValueError, KeyError):
            continue  # a line cut by a kill
    return len(seen) * GROUPS_PER_BATCH


def settle(rundir: Path, bootstrap: str, output_topic: str, client: str, hard_deadline: float) -> None:
    """Wait until the log says every prompt of the first epoch is settled, then have the trainer stop two
    batches on (the ranks stop at the same batch: `stop_at`)."""
    sys.path.insert(0, str(MAIN))
    from rollout_stream.clients import Connection
    from rollout_stream.prompts.fence import fold_admission_log

    while time.time() < hard_deadline:
        _, fold = fold_admission_log(Connection(bootstrap, client=client), output_topic)
        status = fold.status(SOURCE) if fold is not None else []
        if status and status[0].waiting == 0 and status[0].in_flight == 0:
            (rundir / "stop-at.tmp").write_text(str(trained_groups(rundir) // GROUPS_PER_BATCH + 2))
            os.replace(rundir / "stop-at.tmp", rundir / "stop-at")
            return
        time.sleep(1.0)
    raise TimeoutError("the first epoch did not settle before the deadline")


def freeze_while_taking(proc: subprocess.Popen[bytes], takes: Path, least: int = 2,
                        within_s: float = 8.0) -> int:
    """SIGSTOP `proc` at a moment when `least` of its takes have been waiting for a prompt, by the report
    it writes every 20 ms (read once it is stopped, so it is the state it froze in); the number waiting."""
    give_up = time.monotonic() + within_s
    while True:
        proc.send_signal(signal.SIGSTOP)
        time.sleep(0.05)
        try:
            report = json.loads(takes.read_text())
        except (OSError, ValueError):
            report = {"at": 0.0, "waiting": 0}
        if report["waiting"] >= least and time.time() - report["at"] < 0.25:
            return int(report["waiting"])
        proc.send_signal(signal.SIGCONT)
        if time.monotonic() > give_up:
            raise TimeoutError(f"the process to freeze never had {least} takes waiting within {within_s:g}s "
                               f"(last report {report})")
        time.sleep(0.1)


def one_run(a: argparse.Namespace, bootstrap: str, label: str) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:6]
    rundir = Path(a.out) / "logs" / f"{label}-{tag}"
    rundir.mkdir(parents=True, exist_ok=True)
    names = {"input": f"lp-{tag}-rollouts", "output": f"lp-{tag}-train-data", "dlq": f"lp-{tag}-dlq"}
    seed = int(tag, 16)
    long = write_dataset(rundir / "prompts.jsonl", a.prompts, seed)
    target_groups = math.ceil(a.prompts * a.train_epochs)
    batches = math.ceil(target_groups / GROUPS_PER_BATCH)
    cmds = rundir / "commands.txt"
    sh([CLI, "topics", "create", "--bootstrap-servers", bootstrap, "--input-topic", names["input"],
        "--output-topic", names["output"], "--dead-letter-topic", names["dlq"], "--changelog-group-id",
        f"lp-{tag}", "--partitions", "3"], cmds)
    env = {**os.environ, "ROLLOUT_STREAM_CLIENT": a.client}
    hard_deadline = time.time() + a.timeout
    procs: dict[str, subprocess.Popen[bytes]] = {}
    files = []

    def spawn(name: str, cmd: list[str]) -> None:
        f = (rundir / f"{name}.log").open("a")
        files.append(f)
        with cmds.open("a") as c:
            c.write("$ " + " ".join(cmd) + "\n")
        procs[name] = subprocess.Popen(cmd, cwd=MAIN, stdout=f, stderr=subprocess.STDOUT, env=env)

    stage_cmd = [CLI, "run", "--bootstrap-servers", bootstrap, "--input-topic", names["input"],
                 "--output-topic", names["output"], "--dead-letter-topic", names["dlq"], "--group-id",
                 f"lp-{tag}", "--group-timeout", "10", "--log-level", "warning",
                 "--progress-interval", "3600"]
    common = ["--rundir", str(rundir), "--bootstrap", bootstrap, "--input-topic", names["input"],
              "--output-topic", names["output"], "--dlq-topic", names["dlq"],
              "--trainer-group", f"lp-{tag}-trainer",
              "--hard-deadline", str(hard_deadline), "--seed", str(seed), "--pacing", a.pacing,
              "--staleness", a.staleness, "--spans", a.spans, "--policy-lag", str(a.policy_lag),
              "--step-s", str(a.step_s), "--declared-epochs", str(a.declared_epochs)]
    me = str(Path(__file__).resolve())
    rollout_ids = [f"lp-{tag}-r{i}" for i in range(a.rollout_processes)]

    def rollout_cmd(i: int) -> list[str]:
        return [PY, me, "rollout", *common, "--producer-id", rollout_ids[i]]

    def trainer_cmd(rank: int, incarnation: int) -> list[str]:
        return [PY, me, "trainer", *common, "--rank", str(rank), "--incarnation", str(incarnation),
                "--batches", str(batches)]

    result: dict[str, Any] = {"label": label, "tag": tag, "client": a.client, "pacing": a.pacing,
                              "staleness": a.staleness, "spans": a.spans, "faults": a.faults,
                              "prompts": a.prompts, "long_prompts": len(long), "target_groups": target_groups,
                              "cpu": cpu_model(), "load_before": os.getloadavg()[0], "events": {}}
    started = time.time()

    def at(fraction: float) -> None:
        while trained_groups(rundir) < fraction * target_groups:
            for name, p in procs.items():
                if p.poll() is not None and not name.startswith(("dead-", "done-")):
                    raise RuntimeError(f"{name} exited rc {p.returncode}; see {rundir}/{name}.log")
            if time.time() > hard_deadline:
                raise TimeoutError(f"{trained_groups(rundir)} of {target_groups} groups trained at the "
                                   f"deadline")
            time.sleep(0.05)

    def event(name: str) -> None:
        result["events"][name] = {"s": round(time.time() - started, 2),
                                  "trained_groups": trained_groups(rundir)}

    def retire(name: str, why: str) -> None:
        procs[f"{why}-{name}-{len(procs)}"] = procs.pop(name)

    try:
        spawn("stage", stage_cmd)
        for rank in range(2):
            spawn(f"trainer{rank}", trainer_cmd(rank, 0))
        for i in range(a.rollout_processes):
            spawn(f"rollout{i}", rollout_cmd(i))
        if a.faults == "on":
            # 1. a rollout process sends half a group and kills itself; started again
            at(KILL_ROLLOUT_AT)
            (rundir / f"die-{rollout_ids[0]}").touch()
            procs["rollout0"].wait(timeout=max(1.0, hard_deadline - time.time()))
            (rundir / f"die-{rollout_ids[0]}").unlink()
            result["rollout_died_mid_group"] = (rundir / f"died-{rollout_ids[0]}").read_text()
            assert procs["rollout0"].returncode == -signal.SIGKILL, procs["rollout0"].returncode
            retire("rollout0", "dead")
            spawn("rollout0", rollout_cmd(0))
            event("rollout_killed")
            # 2. one frozen past its lease while two or more of its takes wait in the log, then resumed: the
            #    trainer pauses first (a long step), so that pacing has no room and takes wait
            at(FREEZE_AT)
            frozen = procs[f"rollout{1 % a.rollout_processes}"]
            trainers = [procs[f"trainer{rank}"] for rank in range(2)]
            for p in trainers:
                p.send_signal(signal.SIGSTOP)
            event("trainer_paused")
            try:
                result["frozen_waiting_takes"] = freeze_while_taking(
                    frozen, rundir / f"takes-{rollout_ids[1 % a.rollout_processes]}.json")
            finally:
                for p in trainers:
                    p.send_signal(signal.SIGCONT)
            event("rollout_stopped")
            time.sleep(FREEZE_S)
            frozen.send_signal(signal.SIGCONT)
            event("rollout_resumed")
            # 3. the stage killed -9, started again
            at(KILL_STAGE_AT)
            procs["stage"].kill()
            procs["stage"].wait(timeout=30)
            retire("stage", "dead")
            spawn("stage", stage_cmd)
            event("stage_killed")
            # 4. the trainer (both ranks) killed -9, started again
            at(KILL_TRAINER_AT)
            for rank in range(2):
                procs[f"trainer{rank}"].kill()
            for rank in range(2):
                procs[f"trainer{rank}"].wait(timeout=30)
                retire(f"trainer{rank}", "dead")
            event("trainer_killed")
            for rank in range(2):
                spawn(f"trainer{rank}", trainer_cmd(rank, 1))
        if a.until_settled:
            settle(rundir, bootstrap, names["output"], a.client, hard_deadline)
            event("first_epoch_settled")
        for rank in range(2):
            code = procs[f"trainer{rank}"].wait(timeout=max(1.0, hard_deadline - time.time()))
            if code != 0:
                raise RuntimeError(f"trainer rank {rank} exited rc {code}; see {rundir}/trainer{rank}.log")
            retire(f"trainer{rank}", "done")
        event("trainer_done")
        result["run_s"] = round(time.time() - started, 1)
        (rundir / "stop").touch()
        for i in range(a.rollout_processes):
            procs[f"rollout{i}"].wait(timeout=60)
        result["load_after"] = os.getloadavg()[0]
        rollouts: Counter[str] = Counter()
        for path in rundir.glob("result-*.json"):
            rollouts.update(json.loads(path.read_text()))
        result["rollouts"] = dict(rollouts)  # over every process, killed ones' up to their last exit
        result.update(verdict(rundir, bootstrap, names, long, a.prompts, a.client, a.faults == "on"))
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["ok"] = False
    finally:
        (rundir / "stop").touch()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        for f in files:
            f.close()
        try:
            sys.path.insert(0, str(MAIN))
            from rollout_stream.clients import Connection
            from rollout_stream.kafka import client_for
            from rollout_stream.names import admission_topic, progress_topic
            admin = client_for(Connection(bootstrap)).admin(client_id="loop-bench")
            try:
                admin.delete_topics([*names.values(), admission_topic(names["output"]),
                                     progress_topic(names["output"])])
            finally:
                admin.close()
        except Exception as exc:
            result["cleanup_error"] = f"{type(exc).__name__}: {exc}"
    return result


def verdict(rundir: Path, bootstrap: str, names: dict[str, str], long: set[int], prompts: int,
            client: str, equal_shares: bool = True) -> dict[str, Any]:
    """What the trainer trained, what the log says and what was dead-lettered, for the first epoch;
    `equal_shares`: the long prompts' trained share must be the short ones' (the crashes cost nothing; a
    run of stale skips, without faults, reports the shares staleness leaves)."""
    sys.path.insert(0, str(MAIN))
    from rollout_stream.clients import Connection
    from rollout_stream.core.prompt_keys import parse_attempt_key
    from rollout_stream.core.prompts import PromptState
    from rollout_stream.prompts.fence import fold_admission_log

    problems: list[str] = []
    # the trainer's side: per batch index, the groups (the same in every copy and on both ranks)
    by_index: dict[int, list[str]] = {}
    samples: dict[int, dict[int, list[list[Any]]]] = defaultdict(dict)
    parts: dict[int, tuple[int, int, int]] = {}  # batch -> rollouts, tokens left out; loss tokens trained
    replayed = stale = superseded = reordered = 0
    for rank in range(2):
        for line in (rundir / f"rank{rank}.jsonl").read_text().splitlines():
            b = json.loads(line)
            known = by_index.setdefault(b["batch"], b["groups"])
            if sorted(known) != sorted(b["groups"]):
                problems.append(f"batch {b['batch']} held other groups on rank {rank} (incarnation "
                                f"{b['incarnation']})")
            elif known != b["groups"]:
                # the same groups in another order: the default partition_idle_ms orders by record time,
                # exact while a record is readable within 500 ms of its timestamp (docs/reader.md); the
                # ranks' samples below must still be the batch's rollouts, each once
                reordered += 1
            if b["batch"] in samples[rank]:
                replayed += rank == 0
            else:
                stale += b["skipped_stale"] if rank == 0 else 0
                superseded += b["skipped_superseded"] if rank == 0 else 0
            samples[rank][b["batch"]] = b["samples"]
            parts[b["batch"]] = (b.get("stale_rollouts", 0), b.get("stale_tokens", 0),
                                 b.get("loss_tokens", 0))
    # every group whole (less what staleness left out of it), its rollouts split between the ranks
    for index, groups in by_index.items():
        rows = [tuple(s) for rank in range(2) for s in samples[rank].get(index, [])]
        whole = {(g, r) for g in groups for r in range(ROLLOUTS)}
        if len(rows) != len(set(rows)) or not set(rows) <= whole or \
                len(whole) - len(rows) != parts.get(index, (0, 0, 0))[0]:
            problems.append(f"batch {index}: the ranks' samples are not the batch's groups (less the "
                            f"rollouts staleness left out), each once")
    trained_in: dict[int, set[int]] = defaultdict(set)  # epoch-0 prompt -> batch indices that trained it
    first_try = set()  # epoch-0 prompts whose first attempt trained: what would train without re-issue
    for index, groups in by_index.items():
        for key in groups:
            parsed = parse_attempt_key(key)
            assert parsed is not None, key
            if parsed.epoch == 0:
                trained_in[parsed.prompt].add(index)
                if parsed.attempt == 1:
                    first_try.add(parsed.prompt)
    twice = {p: sorted(b) for p, b in trained_in.items() if len(b) > 1}
    if twice:
        problems.append(f"{len(twice)} prompt(s) trained in more than one batch: "
                        f"{dict(list(twice.items())[:5])}")
    # the log's side
    _, fold = fold_admission_log(Connection(bootstrap, client=client), names["output"])
    assert fold is not None
    states: dict[int, PromptState] = {}
    reasons: dict[int, str | None] = {}
    for p in range(prompts):
        rec = fold.prompt(SOURCE, 0, p)
        states[p] = rec.state if rec is not None else PromptState.WAITING
        reasons[p] = rec.reason if rec is not None else None
    unsettled = [p for p, s in states.items() if not s.final]
    if unsettled:
        problems.append(f"{len(unsettled)} prompt(s) of the first epoch not settled: {unsettled[:10]}")
    log_trained = {p for p, s in states.items() if s is PromptState.TRAINED}
    if log_trained != set(trained_in):
        problems.append(f"the log and the trainer disagree: trained by the log only "
                        f"{sorted(log_trained - set(trained_in))[:10]}, by the trainer only "
                        f"{sorted(set(trained_in) - log_trained)[:10]}")
    if fold.duplicates:
        problems.append(f"the log counts {fold.duplicates} second training(s)")
    # the dead letters: one per prompt dead-lettered for a reason of its own
    listed = sh([CLI, "dlq", "list", "--bootstrap-servers", bootstrap, "--dead-letter-topic", names["dlq"],
                 "--client", client, "--limit", "0", "--json"], rundir / "commands.txt")
    dead = [json.loads(line) for line in listed.splitlines() if line.strip()]
    by_reason = Counter(r["reason"] for r in dead)
    exhausted_records: Counter[str] = Counter()
    for r in dead:
        parsed = parse_attempt_key(r["group_key"] or "")
        if r["reason"] == "prompt_attempts_exhausted" and parsed is not None:
            exhausted_records[f"{parsed.source}@{parsed.epoch}/{parsed.prompt}"] += 1
    trained_keys = {key for groups in by_index.values() for key in groups}
    both = sorted(r["group_key"] for r in dead if r["group_key"] in trained_keys)
    if both:
        problems.append(f"group(s) both dead-lettered and trained: {both[:10]}")
    not_trained = {p: (states[p].value, reasons[p]) for p in range(prompts)
                   if states[p] is not PromptState.TRAINED}
    for p, (state, _) in not_trained.items():
        records = exhausted_records[f"{SOURCE}@0/{p}"]
        if state == "exhausted" and records != 1:
            problems.append(f"exhausted prompt {p} has {records} dead-letter records")
    short = set(range(prompts)) - long
    share_long = len(log_trained & long) / len(long)
    share_short = len(log_trained & short) / len(short)
    if equal_shares and abs(share_long - share_short) > 0.02:
        problems.append(f"trained share: long {share_long:.4f}, short {share_short:.4f}")
    status = fold.status(SOURCE)
    return {
        "ok": not problems, "problems": problems,
        "epoch0": {"trained": len(log_trained),
                   "not_trained": Counter(f"{s}:{r}" for s, r in not_trained.values()),
                   "reissued": status[0].reissued, "reissued_by": getattr(status[0], "reissued_by", None)},
        "trained_share": {"long": round(share_long, 4), "short": round(share_short, 4)},
        # the same had nothing been handed out again: the prompts in flight at a crash are the long ones
        "first_attempt_share": {"long": round(len(first_try & long) / len(long), 4),
                                "short": round(len(first_try & short) / len(short), 4)},
        "batches": len(by_index), "batches_trained_twice": replayed, "batches_reordered": reordered,
        # what the staleness grain did: groups skipped whole, rollouts and loss tokens left out of groups that
        # trained, loss tokens trained; and the attempts re-issued because a committed batch skipped them
        "grain": {"groups_trained": sum(len(g) for g in by_index.values()), "groups_skipped_stale": stale,
                  "rollouts_left_out": sum(p[0] for p in parts.values()),
                  "tokens_left_out": sum(p[1] for p in parts.values()),
                  "loss_tokens_trained": sum(p[2] for p in parts.values()),
                  "regenerated": sum(s.reissued_by.get("skipped", 0) for s in status)},
        "skipped_stale": stale,
        "skipped_superseded": superseded, "dead_letters": dict(by_reason),
        "dead_letter_groups": sorted(f"{r['reason']} {r['group_key']}" for r in dead)[:20],
        "epochs": [{"epoch": s.epoch, "trained": s.trained, "in_flight": s.in_flight, "waiting": s.waiting,
                    "reissued": s.reissued} for s in status],
    }


def orchestrate(a: argparse.Namespace) -> int:
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    bootstrap = a.bootstrap
    if not bootstrap:
        bootstrap = sh([CLI, "broker", "start", "--port", str(PORT), "--data-dir", DATA_DIR],
                       out / "logs" / "broker.txt").strip().splitlines()[-1]
    failed = 0
    try:
        for i in range(a.runs):
            label = f"{i:02d}-{a.client}-{a.pacing}"
            r = one_run(a, bootstrap, label)
            with (out / "results.jsonl").open("a") as f:
                f.write(json.dumps(r) + "\n")
            failed += not r.get("ok")
            shown = ("label", "ok", "run_s", "error", "problems", "frozen_waiting_takes", "epoch0",
                     "trained_share", "grain", "rollouts",
                     "batches_trained_twice", "skipped_stale", "skipped_superseded", "dead_letters", "events")
            print(json.dumps({k: r.get(k) for k in shown}), flush=True)
    finally:
        if not a.bootstrap and not a.keep_broker:
            sh([CLI, "broker", "stop", "--data-dir", DATA_DIR], out / "logs" / "broker.txt")
    print(f"{a.runs - failed} of {a.runs} runs passed", flush=True)
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("role", nargs="?", default="orchestrate", choices=["orchestrate", "rollout", "trainer"])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--client", default="confluent", choices=["confluent", "kafka-python"])
    ap.add_argument("--pacing", default="on", choices=["on", "off"])
    ap.add_argument("--faults", default="on", choices=["on", "off"],
                    help="kill and freeze the parts along the way (off: a run without faults)")
    ap.add_argument("--staleness", default="group", choices=["group", "rollout", "token"],
                    help="the trainer's staleness grain (TrainDataReader(staleness=...))")
    ap.add_argument("--spans", default="off", choices=["on", "off"],
                    help="rollouts updated mid-generation carry version spans")
    ap.add_argument("--policy-lag", type=int, default=STALENESS,
                    help="the rollout processes' max_policy_lag (above the trainer's bound: stale groups)")
    ap.add_argument("--step-s", type=float, default=STEP_S, help="the trainer's time per step")
    ap.add_argument("--train-epochs", type=float, default=EPOCHS,
                    help="epochs of groups the trainer trains before it stops")
    ap.add_argument("--until-settled", action="store_true",
                    help="the trainer stops 2 batches after the first epoch settles (within --train-epochs)")
    ap.add_argument("--declared-epochs", type=int, default=2,
                    help="epochs the source declares (more than trained: the first one has time to settle)")
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--rollout-processes", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600.0, help="a run's hard limit, seconds")
    ap.add_argument("--out", default="loop-runs")
    ap.add_argument("--bootstrap", default=None, help="use this broker instead of starting one")
    ap.add_argument("--keep-broker", action="store_true")
    # children
    for name in ("--rundir", "--input-topic", "--output-topic", "--dlq-topic", "--trainer-group",
                 "--producer-id"):
        ap.add_argument(name)
    ap.add_argument("--hard-deadline", type=float)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--incarnation", type=int, default=0)
    ap.add_argument("--batches", type=int, default=0)
    a = ap.parse_args()
    if a.role == "rollout":
        return rollout_main(a)
    if a.role == "trainer":
        return trainer_main(a)
    return orchestrate(a)


if __name__ == "__main__":
    sys.exit(main())
