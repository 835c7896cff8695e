"""What each outcome of the window store becomes: the records to write for a published group (to the output
topic, the zero-variance policy's topic, or nowhere) or a dead-lettered one; nothing for a dropped
duplicate. Counts and logs on the way; once the outputs are sent, counts the published group and judges the
dead-letter limit. It returns what to write and never writes it: the processor hands it to the delivery."""

from __future__ import annotations

import logging
from collections.abc import Callable

from rollout_stream.config import WorkerConfig
from rollout_stream.core.config import RewardConfig
from rollout_stream.core.dead_letter_limit import DeadLetterWindow, LimitExceeded
from rollout_stream.core.records import DeadLettered, Outcome, Published
from rollout_stream.errors import PolicyStop
from rollout_stream.logs import log_event
from rollout_stream.worker.heads import PendingHead, plan_head
from rollout_stream.worker.outputs import OutputRecord, chunked, dead_letter_records, train_records
from rollout_stream.worker.stats import OutcomeCounts

__all__ = ["DeadLetterLimitExceeded", "Router"]

log = logging.getLogger("rollout_stream.worker")


class DeadLetterLimitExceeded(PolicyStop, RuntimeError):
    """The worker stopped because too much of its recent input was dead-lettered
    (rollout_stream.core.dead_letter_limit)."""

    def __init__(self, verdict: LimitExceeded, input_topic: str, dead_letter_topic: str) -> None:
        self.verdict = verdict
        super().__init__(
            f"dead-letter limit: {verdict.describe()}; stopped rather than drain {input_topic!r} into "
            f"{dead_letter_topic!r}, with everything before this point committed. Find the cause with "
            "`rollout-stream dlq stats` (a bad producer deploy, a wrong --group-size or --reward-key), "
            "fix it and restart; --max-dead-letter-ratio 1 never stops")


class Router:
    def __init__(self, config: WorkerConfig, reward: RewardConfig, stats: OutcomeCounts) -> None:
        self.config, self.reward, self.stats = config, reward, stats
        self.dead_letters = DeadLetterWindow(config.dead_letter_limit)  # stop when mostly dead-lettering
        self.limit_exceeded: LimitExceeded | None = None
        self.track_published = False  # set when metrics observe the loop: group latency
        self.published_ts: list[int] = []  # per group published since the last commit: newest member's ts
        self.head: PendingHead | None = None  # the head of the group `route` returned last (write_heads)

    def route(self, outcome: Outcome, partition_for: Callable[[str, bytes], int | None]
              ) -> list[OutputRecord]:
        """The records to write for one outcome; none when its records are settled without an output (a
        dropped duplicate, a zero-variance group dropped by policy). `partition_for` is the producer's.
        Then `sent`, once they are. With `write_heads`, `head` is then the published group's pending head."""
        self.head = None
        if isinstance(outcome, Published):
            return self._publish(outcome, partition_for)
        if isinstance(outcome, DeadLettered):
            return self._dead_letter(outcome)
        self.stats.duplicates += 1
        log_event(log, "duplicate.dropped", logging.DEBUG, group=outcome.group_key,
                  partition=outcome.record.partition, offset=outcome.record.offset)
        return []

    def sent(self, outcome: Outcome, outs: list[OutputRecord]) -> None:
        """The outcome's outputs were sent (or it had none): count a published group, and judge the
        dead-letter limit."""
        if isinstance(outcome, Published):
            if outs:
                self.stats.groups_published += 1
                self.stats.samples_published += len(outcome.members)
                if self.track_published:
                    self.published_ts.append(max(m.record.timestamp_ms for m in outcome.members))
            self._judge(self.dead_letters.published(len(outcome.members)))
        elif isinstance(outcome, DeadLettered):
            self._judge(self.dead_letters.dead_lettered_as(outcome.reason.value, len(outcome.records)))

    def _publish(self, group: Published, partition_for: Callable[[str, bytes], int | None]
                 ) -> list[OutputRecord]:
        policy = self.config.zero_variance
        topic = self.config.topics.output
        if group.rewards.zero_variance:
            self.stats.zero_variance_groups += 1
            if policy.mode in ("drop", "refill"):
                # refill: the same for the stage; the prompt source hands out another prompt in its place
                self.stats.zero_variance_dropped += len(group.members)
                log_event(
                    log, "group.zero_variance_dropped", group=group.group_key, samples=len(group.members),
                    policy=policy.mode,
                )
                return []
            if policy.mode == "route":
                assert policy.topic is not None
                topic = policy.topic
        partition = partition_for(topic, group.group_key.encode())
        outs = chunked(train_records(group, self.reward, topic, partition), self.config.chunk_bytes)
        if self.config.write_heads:
            self.head = plan_head(group, outs)
        return outs

    def _dead_letter(self, failure: DeadLettered) -> list[OutputRecord]:
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
        return chunked(dead_letter_records(failure, self.config.topics.dead_letter), self.config.chunk_bytes)

    def _judge(self, verdict: LimitExceeded | None) -> None:
        """Past the dead-letter limit: stop taking records; the shutdown commits what was resolved."""
        if verdict is None or self.limit_exceeded is not None:
            return
        self.limit_exceeded = verdict
        log_event(log, "dead_letter.limit_exceeded", logging.ERROR, dead_lettered=verdict.dead_lettered,
                  resolved=verdict.resolved, max_ratio=verdict.limit.max_ratio,
                  reasons=",".join(f"{r}:{n}" for r, n in verdict.by_reason), action="stopping")
