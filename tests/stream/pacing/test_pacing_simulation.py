"""Fast producers, a slow trainer, the worker between them, on the real broker (docs/pacing.md).

Without pacing the producers run ahead and the reader skips the groups that arrive too stale; with
`max_policy_lag` the producers wait instead, the reader skips none, and the trainer waits for data no
longer than IDLE_BOUND_S per batch (after the first, which waits for the pipeline to start).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from rollout_stream.app import app
from rollout_stream.broker.process import free_port
from rollout_stream.clients import Connection
from rollout_stream.codec import Sample
from rollout_stream.config import WorkerConfig
from rollout_stream.names import progress_topic
from rollout_stream.pacing import PacingTimeout, ProgressBoard, WeightsTooOld
from rollout_stream.producer import RolloutProducer
from rollout_stream.reader import TrainDataReader
from rollout_stream.worker.metrics import serve_metrics
from tests.stream.helpers import new_topics, running_worker

# any client: the pacing rule over topics; each client's reader and producer are shown elsewhere
pytestmark = [pytest.mark.kafka(timeout=240), pytest.mark.any_client]

GROUPS_PER_BATCH = 4
ROLLOUTS = 4  # per group
STEPS = 10  # batches the trainer takes
STEP_S = 0.4  # one simulated training step
GENERATE_S = 0.05  # one simulated prompt group: 4 threads make 80 groups/s, 8x what the trainer takes
# Two RolloutProducers (two rollout engines, each its own admission session) driven by two threads each:
# every admission is decided by the admission log, whichever producer asks.
PRODUCERS = 2
THREADS = 2
MAX_GROUPS = 2000  # a bound on an unpaced run's work (it does not get near it)
STALENESS = 1  # the reader's max_weight_staleness, and the producers' max_policy_lag
IDLE_BOUND_S = 2.0


@dataclass
class Outcome:
    paced: bool
    batches: int = 0
    trained_groups: int = 0
    skipped_stale: int = 0
    generated: int = 0
    trainer_idle_max_s: float = 0.0  # the longest wait for a batch, after the first
    trainer_idle_total_s: float = 0.0
    first_batch_s: float = 0.0
    producer_wait_total_s: float = 0.0
    producer_waits: int = 0
    max_lag_trained: int = 0  # the largest trainer version − group version among trained groups
    reloads: int = 0  # admissions refused with WeightsTooOld: the thread loaded newer weights
    metrics: dict[str, float] = field(default_factory=dict)  # the worker's endpoint at the end (paced)
    errors: list[str] = field(default_factory=list)


def simulate(bootstrap: str, *, paced: bool, producers: int = PRODUCERS, threads: int = THREADS) -> Outcome:
    topics = new_topics(bootstrap, partitions=2, prefix="pace")
    config = WorkerConfig(bootstrap_servers=bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          group_timeout_s=30.0, commit_interval_s=0.1)
    trainer_group = f"trainer-{topics.input}"
    out = Outcome(paced=paced)
    version = [0]  # the weights the rollout threads load: the trainer's current version
    stop = threading.Event()
    count_lock = threading.Lock()

    def rollout_thread(producer: RolloutProducer, tag: str) -> None:
        g = 0
        try:
            while not stop.is_set():
                w = version[0]
                if paced:
                    while not stop.is_set():
                        try:
                            producer.admit(w, timeout=1.0)
                            break
                        except PacingTimeout:  # no room within 1 s: look at the stop flag, then wait on
                            continue
                        except WeightsTooOld:  # the trainer moved on while this thread waited
                            with count_lock:
                                out.reloads += 1
                            w = version[0]
                    if stop.is_set():
                        return
                with count_lock:
                    if out.generated >= MAX_GROUPS:
                        return
                    out.generated += 1
                time.sleep(GENERATE_S)
                producer.send_many([Sample(group_index=g, rollout_id=r, reward=float(r % 2),
                                           tokens=[1, 2, 3], response_length=2, weight_versions=[str(w)])
                                    for r in range(ROLLOUTS)], run_id=tag)
                g += 1
        except BaseException as exc:
            out.errors.append(f"{tag}: {type(exc).__name__}: {exc}")

    def pacing() -> dict:
        return {"trainer_group_id": trainer_group, "train_data_topic": topics.output,
                "max_policy_lag": STALENESS, "max_unconsumed_groups": 4 * GROUPS_PER_BATCH} if paced else {}

    with running_worker(config) as worker:
        server = serve_metrics(worker, free_port(), host="127.0.0.1") if paced else None
        reader = TrainDataReader(bootstrap, topics.output, trainer_group, groups_per_batch=GROUPS_PER_BATCH,
                                 max_weight_staleness=STALENESS, start="earliest")
        reader.set_weight_version(0)
        clients = [RolloutProducer(bootstrap, topics.input, producer_id=f"p{i}-{topics.input}", **pacing())
                   for i in range(producers)]
        workers = [threading.Thread(target=rollout_thread, args=(p, f"p{i}t{j}"), daemon=True)
                   for i, p in enumerate(clients) for j in range(threads)]
        started = time.monotonic()
        for t in workers:
            t.start()
        try:
            for step in range(STEPS):
                asked = time.monotonic()
                batch = reader.next_batch(timeout=60)
                assert batch is not None, f"no batch {step} within 60 s: {diagnosis(clients, out, reader)}"
                idle = time.monotonic() - asked
                if step == 0:
                    out.first_batch_s = time.monotonic() - started
                else:
                    out.trainer_idle_max_s = max(out.trainer_idle_max_s, idle)
                    out.trainer_idle_total_s += idle
                out.batches += 1
                out.trained_groups += len(batch.groups)
                out.skipped_stale += batch.skipped_stale
                out.max_lag_trained = max([out.max_lag_trained, *(
                    version[0] - g.oldest_weight_version for g in batch.groups
                    if g.oldest_weight_version is not None)])
                time.sleep(STEP_S)
                version[0] += 1
                reader.set_weight_version(version[0])
                reader.commit()
            for p in clients:  # what the producers waited while the trainer ran
                if p.pacing is not None:
                    out.producer_wait_total_s += p.pacing.wait_s
                    out.producer_waits += p.pacing.waits
            if server is not None:
                out.metrics = pacing_metrics(server.port, trainer_group, out.trained_groups, version[0])
        finally:
            stop.set()
            if server is not None:
                server.stop()
            for t in workers:
                t.join(timeout=30)
            for p in clients:
                p.close(timeout=10)
            reader.close()
    out.trainer_idle_max_s = round(out.trainer_idle_max_s, 3)
    out.trainer_idle_total_s = round(out.trainer_idle_total_s, 3)
    out.first_batch_s = round(out.first_batch_s, 3)
    out.producer_wait_total_s = round(out.producer_wait_total_s, 3)
    return out


def diagnosis(clients: list[RolloutProducer], out: Outcome, reader: TrainDataReader) -> str:
    """What each party knew when the trainer starved (for a failure message)."""
    parts = [f"errors {out.errors}", f"reader {reader.stats}"]
    for p in clients:
        if p.gate is not None:
            parts.append(f"producer {p.gate.producer_id}: {p.gate.progress()}; "
                         f"{p.gate._timeout_message(0.0)}; log {p.gate._follower.snapshot()}")
    return "\n".join(parts)


def pacing_metrics(port: int, trainer_group: str, trained: int, version: int) -> dict[str, float]:
    """The worker's pacing series for `trainer_group`, once its histogram counts every trained group and
    its last weight version arrived."""
    deadline = time.monotonic() + 15
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        found = {s.name + "".join(f"{{{k}={s.labels[k]}}}" for k in ("le", "state") if k in s.labels): s.value
                 for family in text_string_to_metric_families(text) for s in family.samples
                 if s.labels.get("trainer_group") == trainer_group
                 or s.name.startswith(("rollout_stream_producer", "rollout_stream_admission"))}
        counted = found.get("rollout_stream_trainer_group_policy_lag_count")
        latest = found.get("rollout_stream_trainer_weight_version")
        if (counted, latest) == (trained, version) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def test_pacing_turns_discarded_groups_into_producer_waits(kafka_bootstrap, kafka_client):
    unpaced = simulate(kafka_bootstrap, paced=False)
    paced = simulate(kafka_bootstrap, paced=True)
    print("\npacing simulation", kafka_client,
          json.dumps({"unpaced": asdict(unpaced), "paced": asdict(paced)}))
    assert not unpaced.errors and not paced.errors, unpaced.errors + paced.errors
    assert unpaced.batches == paced.batches == STEPS
    # Unpaced, the producers run far ahead: the reader throws much of their work away.
    assert unpaced.skipped_stale >= 2 * GROUPS_PER_BATCH, unpaced
    assert unpaced.producer_wait_total_s == 0
    # Paced: nothing is thrown away, the trainer is kept fed, the producers wait instead.
    assert paced.skipped_stale == 0, paced
    assert paced.max_lag_trained <= STALENESS, paced
    assert paced.trainer_idle_max_s <= IDLE_BOUND_S, paced
    assert paced.producer_waits > 0 and paced.producer_wait_total_s > 0, paced
    assert paced.generated < unpaced.generated, (paced, unpaced)
    # The worker's endpoint shows the same: the trainer's version and a histogram of every trained group.
    m = paced.metrics
    assert m["rollout_stream_trainer_weight_version"] == STEPS, m
    assert m["rollout_stream_trainer_group_policy_lag_count"] == paced.trained_groups, m
    assert m[f"rollout_stream_trainer_group_policy_lag_bucket{{le={float(STALENESS)}}}"] == m[
        "rollout_stream_trainer_group_policy_lag_count"]
    assert m["rollout_stream_trainer_skipped_stale_groups_total"] == 0
    assert m["rollout_stream_trainer_accepted_tokens_per_second"] > 0
    assert m["rollout_stream_producer_wait_seconds_total"] > 0
    # ... and the admission log, folded: both producers renewing, nothing given up on
    assert m["rollout_stream_admission_log_records"] > paced.trained_groups, m
    assert m["rollout_stream_admission_sessions{state=ok}"] == PRODUCERS, m
    assert m["rollout_stream_admission_expired_groups_total"] == 0, m
    assert "rollout_stream_admission_trainer_mark_age_seconds" in m, m


def test_a_producer_whose_trainer_is_gone_times_out_and_says_so(kafka_bootstrap, kafka_client):
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="gone")
    conn = Connection(kafka_bootstrap)
    trainer_group = f"trainer-{topics.input}"
    # A trainer that took one batch' worth of nothing and went away: its progress is there, and old.
    reader = TrainDataReader(kafka_bootstrap, topics.output, trainer_group, groups_per_batch=2,
                             max_weight_staleness=1, start="earliest")
    reader.set_weight_version(3)
    board = ProgressBoard(conn, progress_topic(topics.output))
    try:
        deadline = time.monotonic() + 30
        while board.trainer(trainer_group) is None or board.trainer(trainer_group).weight_version != 3:
            assert time.monotonic() < deadline, "the trainer's progress never arrived"
            board.wait_for_change(board.updates, 0.5)
    finally:
        board.close()
    reader.close()
    with RolloutProducer(kafka_bootstrap, topics.input, trainer_group_id=trainer_group,
                         train_data_topic=topics.output, max_unconsumed_groups=1, max_policy_lag=1,
                         trainer_stale_after_s=1.0) as producer:
        assert producer.can_admit(3)
        producer.admit(3, timeout=10)  # room for one group
        producer.send_many([Sample(group_index=0, rollout_id=r, reward=float(r), tokens=[1, 2],
                                   response_length=1, weight_versions=["3"]) for r in range(2)])
        assert not producer.can_admit(3)
        time.sleep(1.2)  # the trainer's last word is now older than trainer_stale_after_s
        began = time.monotonic()
        with pytest.raises(PacingTimeout, match="stale") as caught:
            producer.admit(3, timeout=1.5)
        assert 1.4 <= time.monotonic() - began < 5
        assert trainer_group in str(caught.value)
        assert producer.pacing is not None and producer.pacing.waits == 1

        # `rollout-stream lag` shows the trainer stale and the producer with its group outstanding.
        args = ["lag", "--bootstrap-servers", kafka_bootstrap, "--input-topic", topics.input,
                "--output-topic", topics.output, "--group-id", f"g-{topics.input}"]
        result = CliRunner().invoke(app, [*args, "--json", "--stale-after", "1"])
        assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
        report = json.loads(result.stdout)
        [trainer] = [t for t in report["trainers"] if t["group_id"] == trainer_group]
        assert trainer["stale"] and trainer["weight_version"] == 3 and trainer["age_s"] >= 1
        [mine] = [p for p in report["producers"] if p["trainer_group"] == trainer_group]
        assert (mine["admitted"], mine["outstanding"], mine["newest_weight_version"]) == (1, 1, 3)
        assert trainer["groups_waiting"] == (0 if mine["stale"] else 1)
        admission = report["admission"]  # the log, folded: the one group holds room, the producer renews
        assert admission["outstanding_groups"] == {trainer_group: 1}, admission
        assert admission["pending_requests"] == 0 and admission["unsent_groups"] == 0, admission
        assert list(admission["sessions"].values()) == ["ok"], admission
        table = CliRunner().invoke(app, [*args, "--stale-after", "1"], env={"COLUMNS": "200"})
        assert table.exit_code == 0, (table.stdout, table.stderr, table.exception)
        [row] = [line for line in table.stdout.splitlines() if line.startswith("│ trainer ")]
        assert row.strip("│ ").split("│")[-1].strip() == "stale"
        assert f"groups holding room: 1 for {trainer_group}" in table.stdout, table.stdout


def test_groups_the_reader_will_skip_stop_counting_before_their_batch_completes(kafka_bootstrap, kafka_client,
                                                                               topic_factory):
    """Stale groups waiting in the reader's buffer must not hold back the fresh groups their batch waits for:
    the trainer reports them as done at once (rollout_stream.core.pacing.doomed_through)."""
    from tests.stream.reader.test_reader import publish, train_sample

    topic = topic_factory(1)
    trainer_group = f"trainer-{topic}"
    stale = [train_sample(g, g * 100 + r, versions=("0",)) for g in (7, 14) for r in range(2)]  # partition 0
    publish(kafka_bootstrap, topic, stale)
    reader = TrainDataReader(kafka_bootstrap, topic, trainer_group, groups_per_batch=2,
                             max_weight_staleness=1, start="earliest", partition_idle_ms=0)
    board = ProgressBoard(Connection(kafka_bootstrap), progress_topic(topic))
    try:
        reader.set_weight_version(5)
        assert reader.next_batch(timeout=3) is None  # both groups are stale, nothing trains yet
        deadline = time.monotonic() + 20
        while True:
            trainer = board.trainer(trainer_group)
            through = {} if trainer is None else trainer.consumed_through.get("rollouts", {})
            if through.get(0) == max(s.source_offset for s in stale):
                break
            assert time.monotonic() < deadline, f"stale groups never reported as done: {trainer}"
            board.wait_for_change(board.updates, 0.5)
        assert trainer is not None and trainer.consumed_groups == 0 and trainer.batch is None
    finally:
        board.close()
        reader.close()


def test_producers_asking_at_the_same_instant_never_take_the_same_room(kafka_bootstrap, kafka_client):
    """Separate producers (separate admission sessions, as separate processes have) all ask at once for
    more room than there is: the log admits exactly as many as fit, and the others wait."""
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="race")
    trainer_group = f"trainer-{topics.input}"
    reader = TrainDataReader(kafka_bootstrap, topics.output, trainer_group, groups_per_batch=2,
                             max_weight_staleness=1, start="earliest")
    reader.set_weight_version(0)
    assert reader.next_batch(timeout=0.5) is None  # resumed: its marks now say where it is
    producers = [RolloutProducer(kafka_bootstrap, topics.input, trainer_group_id=trainer_group,
                                 train_data_topic=topics.output, max_unconsumed_groups=3, producer_id=f"p{i}")
                 for i in range(6)]
    try:
        barrier = threading.Barrier(len(producers))
        outcomes: list[str] = []

        def ask(p: RolloutProducer) -> None:
            barrier.wait()
            try:
                p.admit(0, timeout=3)
                outcomes.append("admitted")
            except PacingTimeout:
                outcomes.append("timed out")

        threads = [threading.Thread(target=ask, args=(p,)) for p in producers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(outcomes) == ["admitted"] * 3 + ["timed out"] * 3, outcomes
        counted = [p.gate.outstanding() for p in producers if p.gate is not None]
        assert sum(counted) == 3, counted  # every producer's fold counts the same three
    finally:
        for p in producers:
            p.close(timeout=10)
        reader.close()
