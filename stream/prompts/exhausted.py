"""Each exhausted prompt's `prompt_attempts_exhausted` dead-letter record, written once (docs/loop.md).

Who writes: the prompt sources, all of them alike. Exhaustion is decided by the fold at a record nobody
chose (a lease that ended, a batch that skipped the last attempt, the sent expiry), often because the
process holding the attempt died; every prompt source folds the log, so every live one knows. One writer at
a time: a transactional id per source name, shared by every process of the source, so the broker fences all
but the newest. One record per prompt: each transaction holds the dead-letter records and a marker in the
admission log (`Resolved`, reason `prompt_attempts_exhausted`, the keys of the prompts' last attempts), and
the fold takes a prompt off its unrecorded list at the first marker. A writer first initializes the id
(the broker finishes or aborts any earlier transaction of it), then folds the log to its end, and only then
picks what is still unrecorded: a marker committed before is folded, one not committed is aborted. Hence a
prompt's record is in the dead-letter topic once its marker is in the log, and never twice.

The transaction is short (a few records) and its timeout 10 s: an open one holds every read_committed
reader of the admission log at its first record, and a writer killed inside one is aborted by the next
writer's initialization, or by the broker after the timeout.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version

import msgspec

from rollout_stream.clients import Connection
from rollout_stream.codec import DeadLetterReason
from rollout_stream.codec import headers as H
from rollout_stream.codec.admission import Resolved, encode_admission
from rollout_stream.core.prompt_keys import AttemptKey
from rollout_stream.core.prompt_records import Exhausted, attempt_history
from rollout_stream.core.prompts import PromptLog
from rollout_stream.kafka import Client, KafkaFailure, TopicPartition
from rollout_stream.logs import log_event
from rollout_stream.pacing import AdmissionFollower

__all__ = ["TRANSACTION_TIMEOUT_S", "ExhaustedWriter", "exhausted_record", "transactional_id"]

log = logging.getLogger("rollout_stream.prompts")

TRANSACTION_TIMEOUT_S = 10.0
LOOK_AGAIN_S = 60.0  # how often a writer whose dead-letter topic does not exist looks whether it does now
REASON = DeadLetterReason.PROMPT_ATTEMPTS_EXHAUSTED
try:
    STAGE_VERSION = version("rollout-stream")  # as the stage's dead-letter records say it
except PackageNotFoundError:  # pragma: no cover - a source checkout that was never installed
    STAGE_VERSION = "0+unknown"


def transactional_id(admission_topic: str, source: str) -> str:
    """Shared by every process of one source on one log: the broker lets one of them write at a time."""
    return f"{admission_topic}.exhausted.{source}"


def exhausted_record(source: str, x: Exhausted, admission_topic: str,
                     max_attempts: int) -> tuple[bytes, bytes, list[tuple[str, bytes]], str]:
    """(key, value, headers, the last attempt's key) of one exhausted prompt's dead-letter record: keyed by
    the prompt (`SOURCE@EPOCH/ROW`), its attempts as JSON in the value, the dead-letter headers with the
    admission log as where it was decided."""
    last = AttemptKey(source, x.epoch, x.attempts[-1].number if x.attempts else 1, x.prompt)
    ends = ", ".join((a.ended.value if a.ended is not None else "?") + (f" ({a.error})" if a.error else "")
                     for a in x.attempts)
    message = (f"prompt {source}@{x.epoch}/{x.prompt}: {max_attempts} attempt(s) ended without a result: "
               f"{ends}; `rollout-stream prompts show {source}@{x.epoch}/{x.prompt}`")
    value = msgspec.json.encode({"source": source, "epoch": x.epoch, "prompt": x.prompt, "state": "exhausted",
                                 "reason": REASON.value, "attempts": attempt_history(x.attempts)})
    failed_at = dt.datetime.fromtimestamp(x.decided_ms / 1000, dt.UTC).isoformat(timespec="milliseconds")
    headers = [
        (H.REASON, REASON.value.encode()),
        (H.MESSAGE, message.encode()),
        (H.ORIGINAL_TOPIC, admission_topic.encode()),
        (H.ORIGINAL_PARTITION, b"0"),
        (H.ORIGINAL_OFFSET, str(x.offset).encode()),
        (H.ORIGINAL_TIMESTAMP, str(x.decided_ms).encode()),
        (H.GROUP_KEY, str(last).encode()),
        (H.STAGE_VERSION, STAGE_VERSION.encode()),
        (H.FAILED_AT, failed_at.replace("+00:00", "Z").encode()),
    ]
    return f"{source}@{x.epoch}/{x.prompt}".encode(), value, headers, str(last)


class ExhaustedWriter:
    """Writes what the fold of `follower` lists as exhausted and unrecorded for `source`; `write` is cheap
    when there is nothing (no Kafka call)."""

    def __init__(self, conn: Connection, client: Client, follower: AdmissionFollower, *, source: str,
                 admission_topic: str, dead_letter_topic: str,
                 end_offset: Callable[[], int] | None = None) -> None:
        self.conn, self.client, self.follower = conn, client, follower
        self.source, self.admission_topic, self.dead_letter_topic = source, admission_topic, dead_letter_topic
        self._end_offset = end_offset or self._log_end
        self.written = 0  # records this process wrote (the log's markers count every writer's)
        self._topic_missing_until = 0.0  # a send to a missing topic would hang the transaction: look first

    def pending(self) -> list[Exhausted]:
        return list(self.follower.read(lambda f: f.unrecorded(self.source) if isinstance(f, PromptLog)
                                       else []))

    def write(self, timeout_s: float = 30.0) -> int:
        """Write the records of every exhausted prompt still unrecorded once this process is the writer and
        has folded the log to its end; how many it wrote (0: none pending, or another writer has them)."""
        if not self.pending() or not self._topic_exists():
            return 0
        producer = self.client.producer(
            client_id=f"{self.conn.client_id}-exhausted", max_record_bytes=1 << 20,
            transactional_id=transactional_id(self.admission_topic, self.source),
            transaction_timeout_s=TRANSACTION_TIMEOUT_S)
        try:
            producer.init_transactions()  # any earlier writer's transaction is now committed or aborted
            end = self._end_offset()
            if end > 0 and not self.follower.wait_folded(end - 1, timeout_s):
                return 0  # not folded to the end: tried again at the next take
            todo = self.pending()
            if not todo:
                return 0
            max_attempts = self.follower.read(
                lambda f: f.sources[self.source].dataset.max_attempts if isinstance(f, PromptLog) else 0)
            producer.begin_transaction()
            keys = []
            for x in todo:
                key, value, headers, attempt = exhausted_record(self.source, x, self.admission_topic,
                                                                max_attempts)
                producer.send_in_transaction(self.dead_letter_topic, value, key, headers=headers)
                keys.append(attempt)
            producer.send_in_transaction(self.admission_topic,
                                         encode_admission(Resolved(keys=keys, reason=REASON.value)),
                                         partition=0)
            producer.commit_transaction()
            self.written += len(todo)
            for x, attempt in zip(todo, keys, strict=True):
                log_event(log, "prompt.exhausted_dead_lettered", logging.WARNING, source=self.source,
                          prompt=f"{self.source}@{x.epoch}/{x.prompt}", attempt=attempt,
                          topic=self.dead_letter_topic)
            return len(todo)
        except KafkaFailure as exc:  # fenced by a newer writer (it writes them), or the next take retries
            log_event(log, "prompt.exhausted_write_failed", logging.INFO, source=self.source,
                      error=f"{type(exc).__name__}: {exc}", action="written by another writer or retried")
            return 0
        finally:
            producer.close()

    def _topic_exists(self) -> bool:
        now = time.monotonic()
        if now < self._topic_missing_until:
            return False
        admin = self.client.admin(client_id=f"{self.conn.client_id}-exhausted")
        try:
            if self.dead_letter_topic in admin.list_topics():
                return True
        except KafkaFailure:
            return False  # asked again at the next take
        finally:
            admin.close()
        self._topic_missing_until = now + LOOK_AGAIN_S
        log_event(log, "prompt.dead_letter_topic_missing", logging.WARNING, source=self.source,
                  topic=self.dead_letter_topic, effect="exhausted prompts wait for their record",
                  action=f"create it (rollout-stream topics create) or give dead_letter_topic; looking again "
                         f"in {LOOK_AGAIN_S:g}s")
        return False

    def _log_end(self) -> int:
        consumer = self.client.assigned_consumer(client_id=f"{self.conn.client_id}-exhausted",
                                                 max_record_bytes=1 << 20)
        tp = TopicPartition(self.admission_topic, 0)
        try:
            return consumer.end_offsets([tp])[tp]
        finally:
            consumer.close()
