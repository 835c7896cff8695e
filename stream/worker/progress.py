"""The worker and pacing (docs/pacing.md): it says where the stage is on the progress topic, and its metrics
endpoint exposes where the producers and trainer groups are, from the same topic, and what the admission
log holds.

Both run beside the loop, from the metrics endpoint (`--metrics-port`): `StageProgressPublisher` writes the
loop's published snapshot (open groups, input lag) every few seconds; `ProgressCollector` reads the
progress topic and folds the admission log in threads of their own and shows them at scrape time, as
`rollout-stream lag` does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from rollout_stream.codec.progress import StageProgress
from rollout_stream.core.admission import AdmissionLog
from rollout_stream.core.prompts import PromptLog
from rollout_stream.kafka import KafkaFailure
from rollout_stream.logs import log_event
from rollout_stream.names import admission_topic, progress_topic
from rollout_stream.pacing import AdmissionFollower, ProgressBoard, ProgressWriter, now_ms
from rollout_stream.pacing.checkpoints import newest_fold
from rollout_stream.pacing.positions import producer_row, trainer_row

__all__ = ["LAG_BUCKETS", "ProgressCollector", "StageProgressPublisher"]

log = logging.getLogger("rollout_stream.worker")

PREFIX = "rollout_stream"
LAG_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 16)  # policy lag in weight versions


class StageProgressPublisher:
    """Every `interval_s`, this worker's open groups and input lag as a StageProgress record."""

    def __init__(self, worker: Any, interval_s: float = 5.0) -> None:
        self.worker, self.interval_s = worker, interval_s
        self.topic = progress_topic(worker.config.topics.output)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stage-progress", daemon=True)
        self._thread.start()

    def record(self) -> StageProgress:
        w = self.worker
        snap = w.snapshot
        instance = w.claim.instance_id if getattr(w, "claim", None) is not None else w.conn.client_id
        return StageProgress(group_id=w.config.group_id, instance_id=str(instance),
                             input_topic=w.config.topics.input, open_groups=snap.open_windows,
                             lag_records=sum(snap.lag.values()),
                             groups_published=snap.stats.groups_published, updated_ms=now_ms())

    def _run(self) -> None:
        try:
            writer = ProgressWriter(self.worker.conn, self.topic, heartbeat_s=3600,
                                    client=self.worker.client)
        except KafkaFailure as exc:
            log_event(log, "progress.unavailable", logging.WARNING, topic=self.topic,
                      error=f"{type(exc).__name__}: {exc}",
                      effect="`rollout-stream lag` shows no open groups")
            return
        try:
            while True:
                writer.publish(self.record())
                if self._stop.wait(self.interval_s):
                    break
        except KafkaFailure as exc:
            log_event(log, "progress.write_failed", logging.WARNING, topic=self.topic,
                      error=f"{type(exc).__name__}: {exc}")
        finally:
            writer.close(timeout=5)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


class ProgressCollector(Collector):
    """Producers' and trainer groups' positions as gauges, and each trainer group's policy-lag histogram."""

    def __init__(self, worker: Any, stale_after_s: float = 60.0) -> None:
        self.stale_after_s = stale_after_s
        self.board = ProgressBoard(worker.conn, progress_topic(worker.config.topics.output),
                                   client=worker.client)
        topic = admission_topic(worker.config.topics.output)
        # the prompt fold is the admission fold with prompt sources' state: one fold serves both
        self.admission = AdmissionFollower(worker.conn, topic, worker.client, poll_s=0.2,
                                           fold=newest_fold(worker.client, topic))

    def collect(self) -> Iterator[Metric]:
        now = now_ms()
        stale_ms = self.stale_after_s * 1000
        producers = [producer_row(p, now, stale_ms) for p in self.board.producers()]
        trainers = [trainer_row(t, producers, None, now, stale_ms) for t in self.board.trainers()]

        def family(name: str, doc: str, label: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=[label])

        version = family("trainer_weight_version", "The weight version each trainer group trains with.",
                         "trainer_group")
        lag = family("trainer_policy_lag", "A trainer group's version minus the oldest newest version of "
                     "the producers pacing to it.", "trainer_group")
        waiting = family("trainer_groups_waiting", "Groups admitted by live paced producers and not yet "
                         "consumed by this trainer group.", "trainer_group")
        age = family("trainer_progress_age_seconds", "Seconds since a trainer group last published progress.",
                     "trainer_group")
        stale = family("trainer_stale", f"1 when a trainer group's progress is older than "
                       f"{self.stale_after_s:g}s.", "trainer_group")
        rate = family("trainer_accepted_tokens_per_second", "Tokens of the groups a trainer group trained "
                      "on (not skipped), per second over the last minute.", "trainer_group")
        consumed = CounterMetricFamily(f"{PREFIX}_trainer_consumed_groups",
                                       "Groups a trainer group took into batches (trained or skipped).",
                                       labels=["trainer_group"])
        skipped = CounterMetricFamily(f"{PREFIX}_trainer_skipped_stale_groups",
                                      "Groups a trainer group skipped as too stale.",
                                      labels=["trainer_group"])
        stale_rollouts = CounterMetricFamily(
            f"{PREFIX}_trainer_stale_rollouts", "Rollouts staleness by rollout or token left out of groups a "
            "trainer group trained.", labels=["trainer_group"])
        stale_tokens = CounterMetricFamily(
            f"{PREFIX}_trainer_stale_tokens", "Loss tokens staleness by rollout or token left out of groups "
            "a trainer group trained.", labels=["trainer_group"])
        histogram = HistogramMetricFamily(
            f"{PREFIX}_trainer_group_policy_lag",
            "Policy lag of published groups when a trainer group trained on them (weight versions).",
            labels=["trainer_group"])
        for t in trainers:
            labels = [t.group_id]
            if t.weight_version is not None:
                version.add_metric(labels, t.weight_version)
            if t.policy_lag is not None:
                lag.add_metric(labels, t.policy_lag)
            waiting.add_metric(labels, t.groups_waiting)
            age.add_metric(labels, t.age_s)
            stale.add_metric(labels, 1 if t.stale else 0)
            rate.add_metric(labels, t.tokens_per_s)
            consumed.add_metric(labels, t.consumed_groups)
            skipped.add_metric(labels, t.skipped_stale_groups)
            stale_rollouts.add_metric(labels, t.stale_rollouts)
            stale_tokens.add_metric(labels, t.stale_tokens)
            buckets, total = [], 0
            for bound in LAG_BUCKETS:
                buckets.append((str(float(bound)), sum(n for v, n in t.lag_counts.items() if v <= bound)))
            count = sum(t.lag_counts.values())
            total = sum(v * n for v, n in t.lag_counts.items())
            buckets.append(("+Inf", count))
            histogram.add_metric(labels, buckets, total)
        yield from (version, lag, waiting, age, stale, rate, consumed, skipped, stale_rollouts, stale_tokens,
                    histogram)

        p_version = family("producer_weight_version", "The newest weight version a paced producer admitted "
                           "a group at.", "producer")
        p_out = family("producer_outstanding_groups", "A paced producer's groups admitted and not yet "
                       "consumed.", "producer")
        p_wait = family("producer_waiting", "1 while a paced producer waits in admit().", "producer")
        p_wait_s = CounterMetricFamily(f"{PREFIX}_producer_wait_seconds",
                                       "Seconds a paced producer spent waiting in admit().",
                                       labels=["producer"])
        for p in producers:
            if p.stale:
                continue
            labels = [p.producer_id]
            if p.newest_weight_version is not None:
                p_version.add_metric(labels, p.newest_weight_version)
            p_out.add_metric(labels, p.outstanding)
            p_wait.add_metric(labels, 1 if p.waiting else 0)
            p_wait_s.add_metric(labels, p.wait_s)
        yield from (p_version, p_out, p_wait, p_wait_s)
        yield from self._admission()

    def _admission(self) -> Iterator[Metric]:
        """The admission log as folded so far (nothing before its first record)."""
        snap = self.admission.snapshot()
        if snap.folded_through < 0:
            return
        expired, late = self.admission.read(lambda fold: (fold.expired, fold.late_delivered))

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"{PREFIX}_admission_{name}", doc, value=value)

        yield gauge("log_records", "Records of the admission log folded so far.", snap.folded_through + 1)
        yield gauge("pending_requests", "Admission requests waiting for room.", snap.pending)
        if snap.oldest_pending_ms is not None:
            yield gauge("oldest_pending_seconds", "How long the oldest waiting request has waited, by the "
                        "log's clock.", snap.oldest_pending_ms / 1000)
        yield gauge("undelivered_groups", "Admitted groups not yet whole at the stage.", snap.unsent)
        outstanding = GaugeMetricFamily(f"{PREFIX}_admission_outstanding_groups", "Groups holding room "
                                        "behind a trainer group: admitted, not yet consumed or resolved.",
                                        labels=["trainer_group"])
        for trainer, n in sorted(snap.outstanding.items()):
            outstanding.add_metric([trainer], n)
        mark_age = GaugeMetricFamily(f"{PREFIX}_admission_trainer_mark_age_seconds", "Seconds, by the log's "
                                     "clock, since a trainer group's last mark.", labels=["trainer_group"])
        for trainer, ms in sorted(snap.trainer_mark_age_ms.items()):
            mark_age.add_metric([trainer], ms / 1000)
        sessions = GaugeMetricFamily(f"{PREFIX}_admission_sessions", "Paced producers holding a lease, by "
                                     "state (suspected: no renewal for 3 s of log time).", labels=["state"])
        for state in ("ok", "suspected"):
            sessions.add_metric([state], sum(s == state for s in snap.sessions.values()))
        yield from (outstanding, mark_age, sessions)
        yield CounterMetricFamily(f"{PREFIX}_admission_expired_groups", "Sent groups given up on after 15 "
                                  "minutes neither consumed nor resolved.", value=expired)
        yield CounterMetricFamily(f"{PREFIX}_admission_late_delivered_groups", "Groups whole at the stage "
                                  "only after their producer lost its lease (they trained in a place nobody "
                                  "counted).",
                                  value=late)
        yield from self.admission.read(prompt_metrics)

    def close(self) -> None:
        self.board.close()
        self.admission.close()


def prompt_metrics(fold: AdmissionLog) -> list[Metric]:
    """Each prompt source (docs/loop.md): its newest epoch's prompts by state, and over every epoch the
    prompts settled by state and the attempts handed out again. Labels stay few: the newest epoch only."""
    if not isinstance(fold, PromptLog) or not fold.sources:
        return []
    epoch = GaugeMetricFamily(f"{PREFIX}_prompt_epoch", "The newest epoch a prompt source hands out.",
                              labels=["source"])
    now = GaugeMetricFamily(f"{PREFIX}_prompts", "Prompts of the newest epoch, by state.",
                            labels=["source", "state"])
    settled = CounterMetricFamily(f"{PREFIX}_prompts_settled", "Prompts settled over every epoch, by final "
                                  "state.", labels=["source", "state"])
    reissued = CounterMetricFamily(f"{PREFIX}_prompts_reissued", "Attempts that ended without a result and "
                                   "were handed out again, over every epoch.", labels=["source"])
    refills = CounterMetricFamily(f"{PREFIX}_prompt_refills", "Zero-variance prompts filtered and replaced "
                                  "by another prompt, over every epoch.", labels=["source"])
    batches = CounterMetricFamily(f"{PREFIX}_prompt_batches", "Committed trainer batches that trained a "
                                  "group of the source (refills per batch: refills over these).",
                                  labels=["source"])
    for name in sorted(fold.sources):
        status = fold.status(name)
        if not status:
            continue
        newest = status[-1]
        epoch.add_metric([name], newest.epoch)
        for state, n in (("waiting", newest.waiting), ("in_flight", newest.in_flight),
                         ("trained", newest.trained), ("dead_lettered", sum(newest.dead_lettered.values())),
                         ("filtered", newest.filtered), ("exhausted", newest.exhausted)):
            now.add_metric([name, state], n)
        settled.add_metric([name, "trained"], sum(s.trained for s in status))
        settled.add_metric([name, "dead_lettered"], sum(sum(s.dead_lettered.values()) for s in status))
        settled.add_metric([name, "filtered"], sum(s.filtered for s in status))
        settled.add_metric([name, "exhausted"], sum(s.exhausted for s in status))
        reissued.add_metric([name], sum(s.reissued for s in status))
        src = fold.sources[name]
        refills.add_metric([name], src.refills)
        batches.add_metric([name], sum(src.batch_refills.values()))
    return [epoch, now, settled, reissued, refills, batches]
