"""What a rollout process uses to get its prompts: take one (an attempt with a lease), generate, publish.

    >>> with PromptSource("localhost:9092", "gsm8k.jsonl", name="gsm8k", trainer_group_id="trainer") as src:
    ...     while True:
    ...         lease = src.take(weight_version=version, timeout=600)
    ...         try:
    ...             src.publish(lease, generate(lease.row, weights=version))
    ...         except AdmissionRevoked:  # the log ended the lease first: the prompt is handed out again
    ...             continue

An exception that leaves the `with` block while this process holds leases (taken, nothing of them
published) ends those attempts as failed, with the exception in the log: they count toward `max_attempts`,
so a row that makes every process raise is exhausted and dead-lettered instead of crash-looping the run.
`fail(lease, exc)` does the same for one lease, `give_back(lease)` returns one free.

Taking a prompt is a paced admission (docs/pacing.md) whose request names the source: the fold every party
runs (`rollout_stream.core.prompts.PromptLog`) hands it the next prompt, so no two processes get the same one
and a restarted process simply goes on (docs/loop.md). The group goes out through a `RolloutProducer` keyed by
the attempt (`<source>@<epoch>.<attempt>/<row>`), so the stage, the trainer and the log all know which attempt
of which prompt it is.
"""

from __future__ import annotations

import logging
import threading
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
from rollout_stream.pacing import AdmissionGate, AdmissionRevoked, PacingTimeout
from rollout_stream.pacing.checkpoints import CHECKPOINT_EVERY, checkpoint_due, newest_fold, take_checkpoint
from rollout_stream.producer import RolloutProducer
from rollout_stream.prompts.dataset import DatasetError, Row, fingerprint, load_rows
from rollout_stream.prompts.errors import (
    ERROR_CHARS,
    DatasetMismatch,
    LogNotFolded,
    NothingToTake,
    SourceFinished,
    describe_error,
)
from rollout_stream.prompts.exhausted import ExhaustedWriter

__all__ = ["PromptLease", "PromptSource"]

log = logging.getLogger("rollout_stream.prompts")

FINISHED_CHECK_S = 5.0  # how often a waiting take looks whether the source has finished
EXHAUSTED_RETRY_S = 1.0  # how often a process tries to write exhausted prompts' dead letters, while due
FOLD_STALL_S = 30.0  # a newcomer waits for its declaration while the fold moves; this long still: refused


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
    """A dataset handed out through the admission log: `take` an attempt, `publish` its group, or `fail` or
    `give_back` it (see the module docstring); a context manager that closes, failing what an exception
    leaves held."""

    def __init__(self, bootstrap_servers: str | Connection, dataset: str | Path | Sequence[Row], *, name: str,
                 trainer_group_id: str, topic: str = "rollouts", train_data_topic: str = "train-data",
                 seed: int = 0, epochs: int | None = None, max_attempts: int = 3,
                 max_policy_lag: int | None = None, max_unconsumed_groups: int | None = None,
                 versions_per_batch: int = 1, producer_id: str | None = None, check: bool = True,
                 kafka_client: Client | None = None, checkpoint_every: int = CHECKPOINT_EVERY,
                 dead_letter_topic: str = "rollouts-dlq") -> None:
        """`dataset`: a path (`rollout_stream.prompts.dataset.load_rows`) or the rows themselves; `name` the
        source's name in the log (letters, digits, `_ . : -`); `seed` orders each epoch; `epochs` None:
        endless; `max_attempts` attempts end without a result (a lease that ended, a failure, a timeout, a
        stale skip) before a prompt is exhausted. Pacing as `RolloutProducer` (`max_policy_lag`,
        `max_unconsumed_groups`; both None: every take is granted at once). `kafka_client`: the seam's client
        (tests: the in-memory cluster). `dead_letter_topic`: where an exhausted prompt's
        `prompt_attempts_exhausted` record goes (the stage's `--dead-letter-topic`).

        Settings and rows are checked before anything is written to the log (ConfigurationError,
        DatasetError); DatasetMismatch: the log has this name over other rows or settings; LogNotFolded:
        the log could not be folded up to this process's declaration."""
        if not valid_source(name):
            raise ConfigurationError(f"prompt source name {name!r}: letters, digits and _ . : - only")
        if epochs is not None and epochs < 1:
            raise ConfigurationError(f"prompt source {name!r}: epochs must be at least 1 (None: endless), "
                                     f"not {epochs}")
        if max_attempts < 1:
            raise ConfigurationError(f"prompt source {name!r}: max_attempts must be at least 1, "
                                     f"not {max_attempts}")
        try:
            limits = PacingLimits(max_policy_lag, max_unconsumed_groups, versions_per_batch)
        except ValueError as exc:
            raise ConfigurationError(f"prompt source {name!r}: {exc}") from exc
        self.rows = load_rows(dataset) if isinstance(dataset, str | Path) else list(dataset)
        if not self.rows:
            where = f"dataset {dataset}" if isinstance(dataset, str | Path) else "dataset (the rows given)"
            raise DatasetError(f"{where}: no rows; a prompt source needs at least one")
        self.name, self.checkpoint_every = name, checkpoint_every
        self.declared = Dataset(source=name, prompts=len(self.rows), fingerprint=fingerprint(self.rows),
                                seed=seed, epochs=epochs, max_attempts=max_attempts)
        self._held: dict[int, PromptLease] = {}  # taken, nothing of them published, by request
        self._held_lock = threading.Lock()
        conn = (bootstrap_servers if isinstance(bootstrap_servers, Connection)
                else Connection(bootstrap_servers, client=default_client()))
        client = kafka_client or client_for(conn)
        self.producer = RolloutProducer(conn, topic=topic, check=check, kafka_client=kafka_client)
        try:
            log_topic = admission_topic(train_data_topic)
            self.gate = AdmissionGate(
                conn, topic=topic, admission_topic=log_topic, progress_topic=progress_topic(train_data_topic),
                trainer_group=trainer_group_id, client=client, producer_id=producer_id, source=name,
                limits=limits, fold=newest_fold(client, log_topic))
            # its groups are named in the log like any paced producer's (Sent, Delivered)
            self.producer.gate = self.gate
            self._wait_folded(self.gate.append(self.declared, timeout=0.0), "this process's declaration")
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

    def _wait_folded(self, offset: int, what: str) -> None:
        """Wait until the fold has the record at `offset`, for as long as the fold moves (a log long past
        its newest checkpoint takes a while); LogNotFolded once it has not moved for FOLD_STALL_S."""
        follower = self.gate.follower
        started = moved = time.monotonic()
        at = follower.read(lambda f: f.next_offset)
        while not follower.wait_folded(offset, 1.0):
            if follower.error is not None:
                raise LogNotFolded(f"prompt source {self.name!r}: reading {self.gate.admission_topic} failed "
                                   f"before {what} (offset {offset}): {describe_error(follower.error)}")
            now, was = time.monotonic(), at
            at = follower.read(lambda f: f.next_offset)
            if at != was:
                moved = now
            elif now - moved >= FOLD_STALL_S:
                raise LogNotFolded(
                    f"prompt source {self.name!r}: {self.gate.admission_topic} was not folded up to {what} "
                    f"(offset {offset}) within {now - started:.0f}s: folded through offset {at - 1}, and no "
                    f"further for {FOLD_STALL_S:g}s (is the log readable? a source writes a checkpoint "
                    f"every {self.checkpoint_every} records, which a newcomer starts from)")

    def take(self, weight_version: int = 0, timeout: float | None = None) -> PromptLease:
        """The next prompt, as an attempt this process holds: waits like `RolloutProducer.admit` (and while
        no prompt is free: every one in flight elsewhere, any of which may come back). Raises SourceFinished
        once every prompt of every epoch is settled; after `timeout` seconds NothingToTake (every prompt in
        flight elsewhere) or PacingTimeout (no room behind the trainer)."""
        started = time.monotonic()
        deadline = None if timeout is None else started + timeout
        while True:
            self._write_exhausted()
            if self.finished():
                raise SourceFinished(f"prompt source {self.name!r}: every prompt of every epoch is settled")
            # in slices, so a take waiting at the end of a run learns that nothing will come back
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                admission = self.gate.admit(int(weight_version), FINISHED_CHECK_S if left is None
                                            else min(left, FINISHED_CHECK_S))
            except PacingTimeout as exc:
                if self.finished():
                    continue
                if left is not None and left <= FINISHED_CHECK_S:
                    raise self._take_timeout(exc, time.monotonic() - started) from None
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
        lease = PromptLease(key, request, self.rows[key.prompt])
        with self._held_lock:
            self._held[request] = lease
        return lease

    def _take_timeout(self, exc: PacingTimeout, waited: float) -> PacingTimeout:
        """Why a take found nothing: every prompt in flight elsewhere, or the trainer (the gate's message)."""
        def look(fold: Any) -> tuple[bool, int, int, int | None]:
            src = fold.sources.get(self.name) if isinstance(fold, PromptLog) else None
            if src is None:
                return False, 0, 0, None
            last = src.epochs[-1] if src.epochs else None
            spent = (not src.retry and last is not None and last.cursor >= src.dataset.prompts
                     and src.dataset.epochs is not None and len(src.epochs) >= src.dataset.epochs)
            flying = sum(s.in_flight for s in fold.status(self.name))
            return spent, flying, len(src.epochs), src.dataset.epochs
        spent, flying, epochs, declared = self.gate.follower.read(look)
        if spent:
            return NothingToTake(
                f"take of prompt source {self.name!r} waited {waited:.1f}s: no prompt is free, every one "
                f"left ({flying}) is in flight in a process of the source (epoch {epochs} of {declared} "
                f"handed out); one comes back if its attempt ends without a result, else the source finishes")
        if not self.gate.limits.active:
            return PacingTimeout(
                f"take of prompt source {self.name!r} waited {waited:.1f}s without a prompt, pacing off "
                f"(is the source declared on {self.gate.admission_topic}, and is the log readable?)")
        return exc

    def publish(self, lease: PromptLease, samples: Iterable[Any], *,
                group_size: int | None = None) -> list[SendFuture]:
        """Send the lease's group, or a part of it (call again with the rest): `samples` (`Sample`s or
        miles-like) get its run_id and group index; each keeps the `group_size` it carries, else
        `group_size`, else counts the rollouts given. The futures' `.get(timeout)` say where each record was
        written (raising if it failed); this returns once they are flushed."""
        group = [s if isinstance(s, Sample) else Sample.from_miles(s) for s in samples]
        group = [msgspec.structs.replace(s, group_index=lease.group_index, run_id=lease.run_id)
                 for s in group]
        self.gate.bind(str(lease.key), lease.request)
        try:
            futures = self.producer.send_many(group, group_size=group_size)
        except AdmissionRevoked:  # the log ended the attempt already: nothing of it is this process's
            with self._held_lock:
                self._held.pop(lease.request, None)
            raise
        with self._held_lock:  # sent: the attempt is the log's now (its group's fate ends it)
            self._held.pop(lease.request, None)
        self.producer.flush()
        return futures

    def give_back(self, lease: PromptLease) -> None:
        """A lease this process will not publish: its prompt goes back to the front, no attempt counted."""
        with self._held_lock:
            self._held.pop(lease.request, None)
        self.gate.give_back(lease.request)

    def fail(self, lease: PromptLease, error: BaseException | str) -> bool:
        """This process cannot make the lease's group (its row made it raise, say): the attempt ends as failed
        with `error` in the log and counts toward `max_attempts`; its prompt is handed out again, or
        exhausted. False: the lease was not held (published, given back, or ended already)."""
        with self._held_lock:
            self._held.pop(lease.request, None)
        text = error if isinstance(error, str) else describe_error(error)
        failed = self.gate.give_back(lease.request, error=text[:ERROR_CHARS])
        if failed:
            log_event(log, "prompt.attempt_failed", logging.WARNING, source=self.name, attempt=str(lease.key),
                      error=text)
        return failed

    def held(self) -> list[PromptLease]:
        """Leases taken and nothing of them published, given back or failed yet."""
        with self._held_lock:
            return list(self._held.values())

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
        def due(fold: Any) -> list[Checkpoint]:
            if isinstance(fold, PromptLog) and checkpoint_due(fold, self.checkpoint_every):
                return take_checkpoint(fold)
            return []
        records = self.gate.follower.read(due)
        try:
            for record in records:  # its parts, in order
                self.gate.append(record)
        except KafkaFailure as exc:  # another party's checkpoint serves as well; the next take tries again
            log_event(log, "checkpoint.write_failed", logging.WARNING, topic=self.gate.admission_topic,
                      bytes=sum(len(r.state) for r in records), error=f"{type(exc).__name__}: {exc}")

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

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: object) -> None:
        # an error of the process's own ends what it holds as failed; an operator's stop (KeyboardInterrupt,
        # SystemExit) gives it back free, as a close does
        if isinstance(exc, Exception):
            for lease in self.held():
                try:
                    self.fail(lease, exc)
                except KafkaFailure as write_failed:  # the session's release below, or its lease, ends it
                    log_event(log, "prompt.fail_write_failed", logging.WARNING, source=self.name,
                              attempt=str(lease.key), error=describe_error(write_failed))
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
