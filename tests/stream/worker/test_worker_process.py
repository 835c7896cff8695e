"""`rollout-stream run` as a real process: signals, kill -9 and restart, configuration errors, environment.

Every worker here is the installed entry point in a subprocess, against the session's real broker.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import msgspec
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2

from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import Sample, decode_sample, decode_train_sample
from rollout_stream.config import TopicNames
from rollout_stream.core import RewardConfig, post_process_rewards
from rollout_stream.ops.synth import FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from tests.stream.helpers import new_topics, read_topic, train_samples, wait_until

EXE = str(Path(sys.executable).with_name("rollout-stream"))
REASONS = {r.value for r in R}


# ---- a worker process ----------------------------------------------------------------------------
class WorkerProcess:
    """One `rollout-stream run` subprocess; stderr goes to a file the test reads."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._offset = log.stat().st_size if log.exists() else 0
        self._err = open(log, "ab")
        self.proc = subprocess.Popen([EXE, "run", *args], stdout=subprocess.DEVNULL, stderr=self._err,
                                     env={**os.environ, **(env or {})})

    def stderr(self) -> str:
        """What this process wrote (the log file may hold earlier processes' lines too)."""
        with open(self.log, "rb") as f:
            f.seek(self._offset)
            return f.read().decode("utf-8", "replace")

    def events(self, name: str) -> list[dict[str, str]]:
        """Fields of every `event=name` text log line."""
        out = []
        for line in self.stderr().splitlines():
            if f" event={name} " in line + " ":
                out.append(dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line)))
        return out

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        def check() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited ({self.proc.returncode}) while waiting for {what}:\n"
                                     f"{self.stderr()[-3000:]}")
            return predicate()
        try:
            wait_until(check, timeout, what)
        except AssertionError as exc:
            events = [line for line in self.stderr().splitlines() if " event=progress " not in line]
            raise AssertionError(f"{exc}; the worker's last events:\n" + "\n".join(events[-15:])) from None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> tuple[int, float]:
        """Send `sig`; return (exit code, seconds to exit)."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"worker did not exit within {timeout}s of {signal.Signals(sig).name}:\n"
                                 f"{self.stderr()[-3000:]}") from None
        self._err.close()
        return rc, time.monotonic() - started

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._err.close()


def worker_args(bootstrap: str, topics: TopicNames, group_id: str, *extra: str) -> list[str]:
    return ["--bootstrap-servers", bootstrap, "--input-topic", topics.input, "--output-topic", topics.output,
            "--dead-letter-topic", topics.dead_letter, "--group-id", group_id, "--commit-interval", "0.2",
            *extra]


def partition_of(key: bytes, partitions: int) -> int:
    """kafka-python's default partitioner (murmur2 of the key), as the producer helper uses it."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class TopicTail:
    """Reads a topic from the beginning, incrementally (read_committed, like a trainer)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                                      enable_auto_commit=False, max_partition_fetch_bytes=64 << 20,
                                      fetch_max_bytes=64 << 20)
        tps = [TopicPartition(topic, p) for p in sorted(self.consumer.partitions_for_topic(topic) or ())]
        self.consumer.assign(tps)
        self.consumer.seek_to_beginning(*tps)
        self.records: list = []

    def poll(self) -> list:
        got = [r for recs in self.consumer.poll(timeout_ms=200).values() for r in recs]
        self.records += got
        return got

    def count(self) -> int:
        self.poll()
        return len(self.records)

    def close(self) -> None:
        self.consumer.close()


def committed_offsets(bootstrap: str, group_id: str,
                      topic: str) -> tuple[dict[int, int | None], dict[int, int]]:
    """(committed offset, end offset) of every partition of `topic` for `group_id`."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        committed = {tp.partition: consumer.committed(tp) for tp in tps}
        ends = {tp.partition: off for tp, off in consumer.end_offsets(tps).items()}
        return committed, ends
    finally:
        consumer.close()


def send_samples(bootstrap: str, topic: str, samples: Iterable[Sample]) -> list[tuple[int, int]]:
    with RolloutProducer(bootstrap, topic=topic) as p:
        futures = [p.send(s) for s in samples]
        p.flush()
        return [(f.get(10).partition, f.get(10).offset) for f in futures]


def sample(gi: int, rid: int, reward: float, *, size: int | None, run: str, sc: int = 1,
           si: int = 0) -> Sample:
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=size, sibling_count=sc,
                  sibling_index=si, run_id=run, tokens=[7, 8, 9, rid], response_length=2, loss_mask=[1, 1],
                  rollout_log_probs=[-0.5, -0.25])


class _RawTrain(msgspec.Struct, tag="train_sample", tag_field="type"):
    """A train sample with its embedded rollout sample left as raw bytes."""

    sample: msgspec.Raw


def assert_exact(members, cfg: RewardConfig) -> None:
    """One published copy of a group equals core's batch API on the same samples."""
    raw, values = post_process_rewards([m.sample for m in members], cfg, prompt_group_sizes=[len(members)])
    assert [m.raw_reward for m in members] == raw, members[0].group_key
    assert [m.reward for m in members] == values, members[0].group_key


# ---- SIGTERM / SIGINT ----------------------------------------------------------------------------
@pytest.mark.kafka(timeout=120)
@pytest.mark.parametrize("sig,delivery", [(signal.SIGTERM, "at-least-once"), (signal.SIGINT, "exactly-once")],
                         ids=["SIGTERM-at-least-once", "SIGINT-exactly-once"])
def test_signal_stops_cleanly_commits_only_resolved_offsets_and_a_restart_completes_open_groups(
        kafka_bootstrap, tmp_path, sig, delivery):
    parts = 3
    topics = new_topics(kafka_bootstrap, partitions=parts, prefix="sig")
    group_id = f"g-{topics.input}"
    run = f"sig{uuid.uuid4().hex[:6]}"
    # A long timeout: the open groups stay open through the restart (their deadline is not reset).
    args = worker_args(kafka_bootstrap, topics, group_id, "--group-timeout", "90",
                       "--progress-interval", "0.3", "--delivery", delivery)
    # Open groups only in partitions 0 and 1, so partition 2 holds nothing but resolved records.
    open_gis = [g for g in range(1000, 1200) if partition_of(f"{run}/{g}".encode(), parts) in (0, 1)][:4]
    # Four complete groups in every partition.
    by_partition = defaultdict(list)
    for g in range(300):
        by_partition[partition_of(f"{run}/{g}".encode(), parts)].append(g)
    done_gis = [g for p in range(parts) for g in by_partition[p][:4]]
    complete = [sample(g, r, float(r + g % 3), size=2, run=run) for g in done_gis for r in range(2)]
    # Each open group lacks its last member: rollout 2, or rollout 1's second sibling.
    opened = {g: [sample(g, 0, 1.0, size=3, run=run), sample(g, 1, 0.0, size=3, run=run, sc=2, si=0),
                  sample(g, 1, 0.0, size=3, run=run, sc=2, si=1), sample(g, 2, 0.5, size=3, run=run)]
              for g in open_gis}
    held_back = {g: members.pop(2 if i % 2 else 3) for i, (g, members) in enumerate(opened.items())}

    log = tmp_path / "worker.log"
    w1 = WorkerProcess(args, log)
    try:
        open_coords = send_samples(kafka_bootstrap, topics.input, [m for ms in opened.values() for m in ms])
        done_coords = send_samples(kafka_bootstrap, topics.input, complete)
        assert {p for p, _ in open_coords} <= {0, 1} and {p for p, _ in done_coords} == {0, 1, 2}

        def progressed() -> bool:
            lines = w1.events("progress")
            return bool(lines) and lines[-1]["groups_published"] == "12" and lines[-1]["open_windows"] == "4"
        w1.wait_for(progressed, 60, "12 groups published and 4 open")
        rc, seconds = w1.stop(sig)
    finally:
        w1.kill()
    err = w1.stderr()
    assert rc == 0, err[-3000:]
    assert seconds < 30
    assert "event=worker.stopping" in err and "event=worker.stopped" in err
    assert f"signal={sig.name}" in err

    committed, ends = committed_offsets(kafka_bootstrap, group_id, topics.input)
    open_by_partition = defaultdict(list)
    for p, o in open_coords:
        open_by_partition[p].append(o)
    for p in range(parts):
        position = committed[p] or 0
        if open_by_partition[p]:
            # At or below every record of an open window (they must be read again), and not needlessly lower:
            # everything below the first open record is resolved.
            assert position <= min(open_by_partition[p]), (p, committed, open_by_partition)
            assert position == min(open_by_partition[p]), (p, committed, open_by_partition)
        else:
            assert position == ends[p], (p, committed, ends)

    first = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=24))
    assert {t.group_key for t in first} == {f"{run}/{g}" for g in done_gis}

    # Restart, then send the missing members: every open group completes, nothing is lost.
    w2 = WorkerProcess(args, log)
    try:
        w2.wait_for(lambda: w2.events("partitions.assigned"), 60, "assignment after restart")
        late_coords = send_samples(kafka_bootstrap, topics.input, held_back.values())
        tail = TopicTail(kafka_bootstrap, topics.output)
        try:
            def all_open_groups_published() -> bool:
                tail.poll()
                keys = [decode_train_sample(r.value).group_key for r in tail.records]
                return all(keys.count(f"{run}/{g}") >= 4 for g in open_gis)
            w2.wait_for(all_open_groups_published, 60, "the open groups published after the restart")
        finally:
            tail.close()
        rc2, _ = w2.stop(signal.SIGTERM)
    finally:
        w2.kill()
    assert rc2 == 0, w2.stderr()[-3000:]

    train = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=40))
    assert read_topic(kafka_bootstrap, topics.dead_letter, settle=0.5) == []
    published = {(t.source_partition, t.source_offset) for t in train}
    assert set(open_coords) | set(done_coords) | set(late_coords) <= published  # nothing lost
    by_group = defaultdict(list)
    for t in train:
        by_group[t.group_key].append(t)
    for g in open_gis:
        members = by_group[f"{run}/{g}"]
        assert len(members) == 4 and {m.sample.rollout_id for m in members} == {0, 1, 2}
        assert_exact(members, RewardConfig())


# ---- kill -9 -------------------------------------------------------------------------------------
def _split_copies(records: list) -> list[list]:
    """A group's train records in log order → its published copies (a copy restarts at a repeated source)."""
    copies: list[list] = []
    seen: set[tuple[int, int]] = set()
    for t in records:
        src = (t.source_partition, t.source_offset)
        if not copies or src in seen:
            copies.append([])
            seen = set()
        copies[-1].append(t)
        seen.add(src)
    return copies


@pytest.mark.kafka(timeout=150)
def test_kill_9_at_random_moments_and_restart_loses_nothing(kafka_bootstrap, tmp_path):
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    kills = 2
    topics = new_topics(kafka_bootstrap, partitions=3, prefix="k9")
    group_id = f"g-{topics.input}"
    faults = FaultRates(malformed=0.05, invalid=0.05, shared_reward=0.05, conflicting_duplicate=0.05,
                        late=0.05)
    plan = SynthPlan(group_size=4, max_siblings=3, tokens=16, faults=faults, seed=seed, run_id=f"k9-{seed}")
    groups = list(plan_groups(plan, 300))
    records = [r for recs, _ in groups for r in recs]
    # A short session timeout, so a restarted worker does not wait 45 s for the killed one to be evicted.
    args = worker_args(kafka_bootstrap, topics, group_id, "--group-timeout", "3",
                       "--progress-interval", "0.2", "--delivery", "at-least-once", "--session-timeout", "6")
    coords: list[tuple[int, int]] = []
    produce_error: list[BaseException] = []

    def produce() -> None:
        try:
            with RolloutProducer(kafka_bootstrap, topic=topics.input) as p:
                futures = []
                for i, (recs, _) in enumerate(groups):
                    futures += [p.send_raw(r.key, r.value) for r in recs]
                    if i % 20 == 19:
                        time.sleep(1.0)  # ~15 s of input, spread over the kills
                p.flush()
                coords.extend((f.get(10).partition, f.get(10).offset) for f in futures)
        except BaseException as exc:
            produce_error.append(exc)

    log = tmp_path / "workers.log"
    producer = threading.Thread(target=produce, daemon=True)
    worker = WorkerProcess(args, log)
    producer.start()
    try:
        for _ in range(kills):
            # Kill while it works: after it has published something in this life.
            def progressed(w: WorkerProcess = worker) -> bool:
                return any(int(e["groups_published"]) > 0 for e in w.events("progress"))
            worker.wait_for(progressed, 60, "progress before the kill")
            time.sleep(rng.uniform(0.0, 1.5))
            worker.proc.send_signal(signal.SIGKILL)
            worker.proc.wait(10)
            worker.kill()
            worker = WorkerProcess(args, log)
        # The last worker must be running (signal handlers installed) before it is asked to stop.
        worker.wait_for(lambda: worker.events("partitions.assigned"), 60, "the last worker's assignment")
        producer.join(60)
        assert not producer.is_alive() and not produce_error, produce_error
        assert len(coords) == len(records)
        inputs = dict(zip(coords, records, strict=True))

        train_tail, dlq_tail = TopicTail(kafka_bootstrap, topics.output), TopicTail(kafka_bootstrap,
                                                                                    topics.dead_letter)
        covered: set[tuple[int, int]] = set()
        try:
            def all_accounted() -> bool:
                for r in train_tail.poll():
                    t = decode_train_sample(r.value)
                    covered.add((t.source_partition, t.source_offset))
                for r in dlq_tail.poll():
                    h = {k: v.decode() for k, v in r.headers}
                    covered.add((int(h["x-original-partition"]), int(h["x-original-offset"])))
                return covered >= inputs.keys()
            worker.wait_for(all_accounted, 90, f"every input in train-data or dead-letter (seed {seed})")
        finally:
            train_tail.close()
            dlq_tail.close()
        rc, _ = worker.stop(signal.SIGTERM)
        assert rc == 0
    finally:
        worker.kill()

    train_reads = read_topic(kafka_bootstrap, topics.output, min_count=len(train_tail.records))
    dlq = read_topic(kafka_bootstrap, topics.dead_letter, min_count=len(dlq_tail.records))
    # Dead-letters: the original bytes of an input, a known reason.
    for r in dlq:
        src = (int(r.headers["x-original-partition"]), int(r.headers["x-original-offset"]))
        assert (r.key, r.value) == (inputs[src].key, inputs[src].value), src
        assert r.headers["x-dlq-reason"] in REASONS and r.headers["x-dlq-message"]
    # Published: the embedded sample is the input's bytes; groups whole per copy; values equal core's.
    planned_members: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for src, rec in inputs.items():
        try:
            s = decode_sample(rec.value)
        except Exception:
            continue  # the malformed record of a group
        gi = s.group_index
        if isinstance(s.rollout_id, int) and s.rollout_id < gi * 1000 + plan.group_size:  # not a late extra
            planned_members[rec.group].add(src)
    by_group = defaultdict(list)
    for r in train_reads:
        t = decode_train_sample(r.value)
        raw = msgspec.msgpack.decode(r.value, type=_RawTrain).sample
        assert bytes(raw) == inputs[(t.source_partition, t.source_offset)].value
        by_group[t.group_key].append(t)
    publishable = {recs[0].group for recs, exp in groups if exp.published_groups}
    assert set(by_group) <= publishable, set(by_group) - publishable
    cfg = RewardConfig()
    torn = 0
    for key, members in by_group.items():
        copies = _split_copies(members)
        whole = [c for c in copies
                 if {(m.source_partition, m.source_offset) for m in c} == planned_members[key]]
        assert whole, key
        for c in whole:
            assert len(c) == c[0].group_sample_count
            assert_exact(c, cfg)
        for c in copies:
            if not any(c is w for w in whole):  # cut short by SIGKILL: a prefix of a whole copy, same values
                torn += 1
                assert any([(m.source_offset, m.reward) for m in w[:len(c)]] ==
                           [(m.source_offset, m.reward) for m in c] for w in whole), key
    assert torn <= kills, f"{torn} partial copies for {kills} kills (seed {seed})"


# ---- configuration errors ------------------------------------------------------------------------
CONFIG_ERRORS = {
    "advantage-estimator": (["--advantage-estimator", "bogus"], {}),
    "group-size-0": (["--group-size", "0"], {}),
    "group-timeout-negative": (["--group-timeout", "-1"], {}),
    "zero-variance-bogus": (["--zero-variance", "bogus"], {}),
    "zero-variance-empty-route": (["--zero-variance", "route:"], {}),
    "invalid-topic-name": (["--input-topic", "bad topic!"], {}),
    "input-is-output": (["--input-topic", "{same}", "--output-topic", "{same}"], {}),
    "log-format": (["--log-format", "xml"], {}),
    "group-size-from-env": ([], {"ROLLOUT_STREAM_GROUP_SIZE": "0"}),
}


def _run_cli(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    started = time.monotonic()
    try:
        done = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=60,
                              env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"`rollout-stream {' '.join(args)}` still running after 60 s") from exc
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


@pytest.fixture(scope="module")
def config_error_runs(kafka_bootstrap) -> dict[str, tuple[int, str, str, float]]:
    """Every bad configuration against the reachable broker, two processes at a time (each is a fresh
    interpreter and pays the import of torch): name → (exit code, stdout, stderr, seconds)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(name: str) -> tuple[int, str, str, float]:
        extra, env = CONFIG_ERRORS[name]
        tag = uuid.uuid4().hex[:8]
        topics = TopicNames(f"cfg-{tag}-in", f"cfg-{tag}-out", f"cfg-{tag}-dlq")
        args = worker_args(kafka_bootstrap, topics, f"g-cfg-{tag}")
        args += [a.format(same=topics.input) for a in extra]
        return _run_cli(["run", *args], env)

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(CONFIG_ERRORS, pool.map(one, CONFIG_ERRORS), strict=True))


@pytest.mark.any_client  # the configuration is checked before a client is made
@pytest.mark.parametrize("name", list(CONFIG_ERRORS))
def test_bad_configuration_stops_it_at_start_with_one_error_line(config_error_runs, name):
    rc, stdout, stderr, _ = config_error_runs[name]
    lines = stderr.strip().splitlines()
    assert rc == 2, stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert stdout == ""


def test_unreachable_broker_stops_it_fast_with_one_error_line():
    rc, _, stderr, seconds = _run_cli(["run", "--bootstrap-servers", "127.0.0.1:1",
                                       "--group-id", f"g-{uuid.uuid4().hex[:8]}"])
    lines = stderr.strip().splitlines()
    assert rc == 1, stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and "127.0.0.1:1" in lines[0], stderr
    assert seconds < 10


RUN_OPTIONS = {  # every option of `run` and its environment variable, as `--help` must show them
    "--bootstrap-servers": "KAFKA_BOOTSTRAP_SERVERS",
    "--input-topic": "ROLLOUT_STREAM_INPUT_TOPIC",
    "--output-topic": "ROLLOUT_STREAM_OUTPUT_TOPIC",
    "--dead-letter-topic": "ROLLOUT_STREAM_DEAD_LETTER_TOPIC",
    "--group-id": "ROLLOUT_STREAM_GROUP_ID",
    "--group-size": "ROLLOUT_STREAM_GROUP_SIZE",
    "--group-timeout": "ROLLOUT_STREAM_GROUP_TIMEOUT",
    "--advantage-estimator": "ROLLOUT_STREAM_ADVANTAGE_ESTIMATOR",
    "--no-rewards-normalization": "ROLLOUT_STREAM_NO_REWARDS_NORMALIZATION",
    "--no-std-normalization": "ROLLOUT_STREAM_NO_STD_NORMALIZATION",
    "--reward-key": "ROLLOUT_STREAM_REWARD_KEY",
    "--zero-variance": "ROLLOUT_STREAM_ZERO_VARIANCE",
}


def _help_blocks(columns: int) -> dict[str, str]:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    done = subprocess.run([EXE, "run", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    blocks: dict[str, str] = {}
    current = None
    for line in done.stdout.splitlines():
        m = re.match(r"^\W*(--[a-z-]+)\b", line)
        if m:
            current = m.group(1)
        if current:
            blocks[current] = blocks.get(current, "") + " " + line.strip(" │")
    return {k: re.sub(r"\s+", " ", v) for k, v in blocks.items()}


@pytest.mark.parametrize("columns", [200, 80])
def test_help_lists_every_option_with_its_environment_variable(columns):
    blocks = _help_blocks(columns)
    for option, envvar in RUN_OPTIONS.items():
        assert option in blocks, option
        assert f"env var: {envvar}]" in blocks[option], (option, blocks[option])


# ---- environment variables -----------------------------------------------------------------------
@pytest.mark.any_client  # one configuration model, whatever the client
@pytest.mark.kafka(timeout=90)
def test_environment_variables_fill_the_options(kafka_bootstrap, tmp_path):
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="env")
    run = f"env{uuid.uuid4().hex[:6]}"
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "ROLLOUT_STREAM_INPUT_TOPIC": topics.input,
        "ROLLOUT_STREAM_OUTPUT_TOPIC": topics.output,
        "ROLLOUT_STREAM_DEAD_LETTER_TOPIC": topics.dead_letter,
        "ROLLOUT_STREAM_GROUP_ID": f"g-{topics.input}",
        "ROLLOUT_STREAM_GROUP_SIZE": "3",
        "ROLLOUT_STREAM_GROUP_TIMEOUT": "30",
        "ROLLOUT_STREAM_NO_STD_NORMALIZATION": "1",
        "ROLLOUT_STREAM_COMMIT_INTERVAL": "0.2",
        "ROLLOUT_STREAM_LOG_FORMAT": "json",
    }
    worker = WorkerProcess([], tmp_path / "worker.log", env=env)  # no flags at all
    try:
        send_samples(kafka_bootstrap, topics.input, [sample(5, r, float(r * r), size=None, run=run)
                                                     for r in range(3)])
        tail = TopicTail(kafka_bootstrap, topics.output)
        try:
            worker.wait_for(lambda: tail.count() >= 3, 90, "3 published samples")
        finally:
            tail.close()
        train = [decode_train_sample(r.value) for r in tail.records]
        rc, _ = worker.stop(signal.SIGTERM)
    finally:
        worker.kill()
    assert rc == 0
    assert len(train) == 3
    assert [t.group_rollout_count for t in train] == [3, 3, 3]  # ROLLOUT_STREAM_GROUP_SIZE
    assert all(t.grpo_std_normalization is False for t in train)  # ROLLOUT_STREAM_NO_STD_NORMALIZATION
    assert_exact(train, RewardConfig(grpo_std_normalization=False))
    assert [t.reward for t in train] != post_process_rewards([t.sample for t in train], RewardConfig(),
                                                             prompt_group_sizes=[3])[1]
    events = [json.loads(line) for line in worker.stderr().splitlines()]  # ROLLOUT_STREAM_LOG_FORMAT=json
    started = next(e for e in events if e["event"] == "worker.started")
    assert started["group_size"] == 3 and started["group_timeout_s"] == 30.0
    assert started["input_topic"] == topics.input
