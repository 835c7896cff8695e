"""Where each outcome of the window store goes: published groups (or the zero-variance policy's topic, or
nowhere), dead-letters, counted duplicates. Counts, logs, and judges the dead-letter limit on the way."""

from __future__ import annotations

import logging
from collections.abc import Callable

from core.config import RewardConfig
from core.dead_letter_limit import DeadLetterWindow, LimitExceeded
from core.offsets import OffsetLedger
from core.records import DeadLettered, DuplicateDropped, Outcome, Published
from stream.config import WorkerConfig
from stream.errors import PolicyStop
from stream.logs import log_event
from stream.worker.outputs import OutputRecord, dead_letter_records, train_records
from stream.worker.stats import OutcomeCounts

__all__ = ["DeadLetterLimitExceeded", "Router"]

log = logging.getLogger("rollout_stream.worker")


class DeadLetterLimitExceeded(PolicyStop, RuntimeError):
    """The worker stopped because too much of its recent input was dead-lettered (core.dead_letter_limit)."""

    def __init__(self, verdict: LimitExceeded, input_topic: str, dead_letter_topic: str) -> None:
        self.verdict = verdict
        super().__init__(
            f"dead-letter limit: {verdict.describe()}; stopped rather than drain {input_topic!r} into "
            f"{dead_letter_topic!r}, with everything before this point committed. Find the cause with "
            "`rollout-stream dlq stats` (a bad producer deploy, a wrong --group-size or --reward-key), "
            "fix it and restart; --max-dead-letter-ratio 1 never stops")


class Router:
    def __init__(
        self,
        config: WorkerConfig,
        reward: RewardConfig,
        stats: OutcomeCounts,
        ledger: OffsetLedger,
        send: Callable[[list[OutputRecord]], None],
        partition_for: Callable[[str, bytes], int | None],
    ) -> None:
        self.config, self.reward, self.stats, self.ledger = config, reward, stats, ledger
        self.send, self.partition_for = send, partition_for
        self.dead_letters = DeadLetterWindow(config.dead_letter_limit)  # stop when mostly dead-lettering
        self.limit_exceeded: LimitExceeded | None = None
        self.track_published = False  # set when metrics observe the loop: group latency
        self.published_ts: list[int] = []  # per group published since the last commit: newest member's ts

    def route(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Published):
                self._publish(outcome)
                self._judge(self.dead_letters.published(len(outcome.members)))
            elif isinstance(outcome, DeadLettered):
                self._dead_letter(outcome)
                self._judge(self.dead_letters.dead_lettered_as(outcome.reason.value, len(outcome.records)))
            elif isinstance(outcome, DuplicateDropped):
                self.stats.duplicates += 1
                self.ledger.resolve(outcome.record.partition, (outcome.record.offset,))
                log_event(log, "duplicate.dropped", logging.DEBUG, group=outcome.group_key,
                          partition=outcome.record.partition, offset=outcome.record.offset)

    def _publish(self, group: Published) -> None:
        policy = self.config.zero_variance
        topic = self.config.topics.output
        if group.rewards.zero_variance:
            self.stats.zero_variance_groups += 1
            if policy.mode == "drop":
                self.stats.zero_variance_dropped += len(group.members)
                for m in group.members:
                    self.ledger.resolve(m.record.partition, (m.record.offset,))
                log_event(
                    log, "group.zero_variance_dropped", group=group.group_key, samples=len(group.members)
                )
                return
            if policy.mode == "route":
                assert policy.topic is not None
                topic = policy.topic
        partition = self.partition_for(topic, group.group_key.encode())
        self.send(train_records(group, self.reward, topic, partition))
        self.stats.groups_published += 1
        self.stats.samples_published += len(group.members)
        if self.track_published:
            self.published_ts.append(max(m.record.timestamp_ms for m in group.members))

    def _dead_letter(self, failure: DeadLettered) -> None:
        reason = failure.reason.value
        self.stats.dead_lettered[reason] += len(failure.records)
        first = failure.records[0]
        if failure.straggler:  # its group was counted and logged when it was rejected
            log_event(log, "dead_letter.straggler", logging.DEBUG, reason=reason, group=failure.group_key,
                      partition=first.partition, offset=first.offset)
        else:
            self.stats.dead_letter_groups[reason] += 1
            log_event(log, "dead_letter", logging.WARNING, reason=reason, group=failure.group_key,
                      records=len(failure.records), partition=first.partition, offset=first.offset,
                      message=failure.message[:500])
        self.send(dead_letter_records(failure, self.config.topics.dead_letter))

    def _judge(self, verdict: LimitExceeded | None) -> None:
        """Past the dead-letter limit: stop taking records; the shutdown commits what was resolved."""
        if verdict is None or self.limit_exceeded is not None:
            return
        self.limit_exceeded = verdict
        log_event(log, "dead_letter.limit_exceeded", logging.ERROR, dead_lettered=verdict.dead_lettered,
                  resolved=verdict.resolved, max_ratio=verdict.limit.max_ratio,
                  reasons=",".join(f"{r}:{n}" for r, n in verdict.by_reason), action="stopping")
