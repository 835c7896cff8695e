"""What a rollout process uses to get its prompts: take one (an attempt with a lease), generate, publish.

    >>> with PromptSource("localhost:9092", "gsm8k.jsonl", name="gsm8k", trainer_group_id="trainer") as src:
    ...     while True:
    ...         lease = src.take(weight_version=version, timeout=600)
    ...         src.publish(lease, generate(lease.row, weights=version))

Taking a prompt is a paced admission (docs/pacing.md) whose request names the source: the fold every party
runs (`rollout_stream.core.prompts.PromptLog`) hands it the next prompt, so no two processes get the same one
and a restarted process simply goes on (docs/loop.md). The group goes out through a `RolloutProducer` keyed by
the attempt (`<source>@<epoch>.<attempt>/<row>`), so the stage, the trainer and the log all know which attempt
of which prompt it is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from rollout_stream.clients import Connection, default_client
from rollout_stream.codec import Sample
from rollout_stream.codec.admission import Checkpoint, Dataset
from rollout_stream.core.pacing import PacingLimits
from rollout_stream.core.prompt_keys import AttemptKey, attempt_run_id, valid_source
from rollout_stream.core.prompts import EpochStatus, PromptLog
from rollout_stream.errors import ConfigurationError, RuntimeFailure
from rollout_stream.kafka import Client, KafkaFailure, SendFuture, client_for
from rollout_stream.logs import log_event
from rollout_stream.names import admission_topic, progress_topic
from rollout_stream.pacing import AdmissionGate, PacingTimeout
from rollout_stream.pacing.checkpoints import CHECKPOINT_EVERY, checkpoint_due, newest_fold, take_checkpoint
from rollout_stream.producer import RolloutProducer
from rollout_stream.prompts.dataset import Row, fingerprint, load_rows
from rollout_stream.prompts.exhausted import ExhaustedWriter

__all__ = ["DatasetMismatch", "PromptLease", "PromptSource", "SourceFinished"]

log = logging.getLogger("rollout_stream.prompts")

FINISHED_CHECK_S = 5.0  # how often a waiting take looks whether the source has finished
EXHAUSTED_RETRY_S = 1.0  # how often a process tries to write exhausted prompts' dead letters, while due


class DatasetMismatch(ConfigurationError):
    """The log already has a source of this name over other rows (or other seed, epochs, attempts)."""


class SourceFinished(RuntimeFailure):
    """Every epoch of the source has handed out every prompt and none is waiting to be handed out again."""


@dataclass(frozen=True, slots=True)
class PromptLease:
    """One attempt of one prompt: generate its group from `row` and `publish` it while the lease holds."""

    key: AttemptKey
    request: int  # the admitting request's offset in the admission log
    row: Row

    @property
    def run_id(self) -> str:
        return attempt_run_id(self.key.source, self.key.epoch, self.key.attempt)

    @property
    def group_index(self) -> int:
        return self.key.prompt


class PromptSource:
    def __init__(self, bootstrap_servers: str | Connection, dataset: str | Path | Sequence[Row], *, name: str,
                 trainer_group_id: str, topic: str = "rollouts", train_data_topic: str = "train-data",
                 seed: int = 0, epochs: int | None = None, max_attempts: int = 3,
                 max_policy_lag: int | None = None, max_unconsumed_groups: int | None = None,
                 versions_per_batch: int = 1, producer_id: str | None = None, check: bool = True,
                 kafka_client: Client | None = None, checkpoint_every: int = CHECKPOINT_EVERY,
                 dead_letter_topic: str = "rollouts-dlq") -> None:
        """`dataset`: a path (`rollout_stream.prompts.dataset.load_rows`) or the rows themselves; `name` the
        source's name in the log (letters, digits, `_ . : -`); `seed` orders each epoch; `epochs` None:
        endless;
        `max_attempts` attempts end without a result before a prompt is exhausted. Pacing as
        `RolloutProducer` (`max_policy_lag`, `max_unconsumed_groups`; both None: every take is granted at
        once). `kafka_client`: the seam's client (tests: the in-memory cluster). `dead_letter_topic`: where
        an exhausted prompt's `prompt_attempts_exhausted` record goes (the stage's `--dead-letter-topic`)."""
        if not valid_source(name):
            raise ConfigurationError(f"prompt source name {name!r}: letters, digits and _ . : - only")
        self.rows = load_rows(dataset) if isinstance(dataset, str | Path) else list(dataset)
        self.name, self.checkpoint_every = name, checkpoint_every
        self.declared = Dataset(source=name, prompts=len(self.rows), fingerprint=fingerprint(self.rows),
                                seed=seed, epochs=epochs, max_attempts=max_attempts)
        conn = (bootstrap_servers if isinstance(bootstrap_servers, Connection)
                else Connection(bootstrap_servers, client=default_client()))
        client = kafka_client or client_for(conn)
        self.producer = RolloutProducer(conn, topic=topic, check=check, kafka_client=kafka_client)
        try:
            log_topic = admission_topic(train_data_topic)
            self.gate = AdmissionGate(
                conn, topic=topic, admission_topic=log_topic, progress_topic=progress_topic(train_data_topic),
                trainer_group=trainer_group_id, client=client, producer_id=producer_id, source=name,
                limits=PacingLimits(max_policy_lag, max_unconsumed_groups, versions_per_batch),
                fold=newest_fold(client, log_topic))
            # its groups are named in the log like any paced producer's (Sent, Delivered)
            self.producer.gate = self.gate
            self.gate.append(self.declared)
            self.exhausted = ExhaustedWriter(conn, client, self.gate.follower, source=name,
                                             admission_topic=log_topic, dead_letter_topic=dead_letter_topic)
            self._exhausted_next = 0.0
            first = self.gate.follower.read(lambda f: _declared(f, name))
            if first != self.declared:
                raise DatasetMismatch(f"prompt source {name!r} on {log_topic} was declared over other data: "
                                      f"{first} (this process: {self.declared})")
        except BaseException:
            self.producer.close()
            raise

    def take(self, weight_version: int = 0, timeout: float | None = None) -> PromptLease:
        """The next prompt, as an attempt this process holds: waits like `RolloutProducer.admit` (and while
        no prompt is free: every one in flight elsewhere, any of which may come back). Raises SourceFinished
        once every prompt of every epoch is settled, PacingTimeout after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._write_exhausted()
            if self.finished():
                raise SourceFinished(f"prompt source {self.name!r}: every prompt of every epoch is settled")
            # in slices, so a take waiting at the end of a run learns that nothing will come back
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                admission = self.gate.admit(int(weight_version), FINISHED_CHECK_S if left is None
                                            else min(left, FINISHED_CHECK_S))
            except PacingTimeout:
                if self.finished():
                    continue
                if left is not None and left <= FINISHED_CHECK_S:
                    raise
                continue
            assert admission.request is not None
            request = admission.request
            key, ended = self.gate.follower.read(partial(_attempt, request=request))
            if key is not None:
                break
            if ended is None:
                raise RuntimeFailure(f"request {request} was admitted without a prompt of {self.name!r} "
                                     f"(is another fold version writing to the log?)")
            # this process paused inside the take past its lease: the prompt is waiting again, take anew
            self.gate.give_back(request)
            log_event(log, "prompt.take_lapsed", logging.WARNING, source=self.name, attempt=str(ended),
                      request=request)
        self._checkpoint_if_due()
        return PromptLease(key, request, self.rows[key.prompt])

    def publish(self, lease: PromptLease, samples: Iterable[Any]) -> list[SendFuture]:
        """Send the lease's group: `samples` (`Sample`s or miles-like) get its run_id and group index."""
        group = [s if isinstance(s, Sample) else Sample.from_miles(s) for s in samples]
        group = [msgspec.structs.replace(s, group_index=lease.group_index, run_id=lease.run_id)
                 for s in group]
        self.gate.bind(str(lease.key), lease.request)
        futures = self.producer.send_many(group)
        self.producer.flush()
        return futures

    def give_back(self, lease: PromptLease) -> None:
        """A lease this process will not publish: its prompt goes back to the front, no attempt counted."""
        self.gate.give_back(lease.request)

    def finished(self) -> bool:
        """No prompt is waiting to be handed out, none will be (epochs done) and none is in flight."""
        def look(fold: Any) -> bool:
            src = fold.sources.get(self.name) if isinstance(fold, PromptLog) else None
            if src is None or src.retry:
                return False
            if src.dataset.epochs is None or len(src.epochs) < src.dataset.epochs:
                return False
            last = src.epochs[-1]
            return (last.cursor >= src.dataset.prompts
                    and all(s.in_flight == 0 for s in fold.status(self.name)))
        return bool(self.gate.follower.read(look))

    def status(self) -> list[EpochStatus]:
        return list(self.gate.follower.read(
            lambda f: f.status(self.name) if isinstance(f, PromptLog) else []))

    def _checkpoint_if_due(self) -> None:
        def due(fold: Any) -> Checkpoint | None:
            if isinstance(fold, PromptLog) and checkpoint_due(fold, self.checkpoint_every):
                return take_checkpoint(fold)
            return None
        record = self.gate.follower.read(due)
        if record is None:
            return
        try:
            self.gate.append(record)
        except KafkaFailure as exc:  # another party's checkpoint serves as well; the next take tries again
            log_event(log, "checkpoint.write_failed", logging.WARNING, topic=self.gate.admission_topic,
                      bytes=len(record.state), error=f"{type(exc).__name__}: {exc}")

    def _write_exhausted(self) -> None:
        """Exhausted prompts' dead-letter records not written yet: this process writes them if no other has
        (rollout_stream.prompts.exhausted); at most once a second, and only when the fold lists some."""
        now = time.monotonic()
        if now < self._exhausted_next or not self.exhausted.pending():
            return
        self._exhausted_next = now + EXHAUSTED_RETRY_S
        self.exhausted.write()

    def close(self) -> None:
        try:
            self._exhausted_next = 0.0
            self._write_exhausted()  # the last process standing writes what is left
        except Exception as exc:  # closing must not fail on it: another process, or the next run, writes them
            log_event(log, "prompt.exhausted_write_failed", logging.WARNING, source=self.name,
                      error=f"{type(exc).__name__}: {exc}")
        self.producer.close()

    def __enter__(self) -> PromptSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _attempt(fold: Any, request: int) -> tuple[AttemptKey | None, AttemptKey | None]:
    """The live attempt an admitted request carries, else the attempt it carried if that has ended."""
    if not isinstance(fold, PromptLog):
        return None, None
    key = fold.attempt_of(request)
    return key, None if key is not None else fold.ended_attempt(request)


def _declared(fold: Any, name: str) -> Dataset | None:
    src = fold.sources.get(name) if isinstance(fold, PromptLog) else None
    return None if src is None else src.dataset
