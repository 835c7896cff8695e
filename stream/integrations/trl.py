"""TRL (`pip install 'rollout-stream[trl]'`): the stage as the rollout worker of TRL's async GRPO trainer,
and the samples a TRL-side generator publishes to the stage.

* `StageRolloutWorker` implements TRL's `RolloutWorkerProtocol` (`trl.experimental.async_grpo`): a thread
  reads whole prompt groups with a `TrainDataReader` and puts one `RolloutSample` per train sample on
  `rollout_buffer`, its `advantage` the stage's processed reward. The trainer uses that advantage as given,
  so it trains on the stage's rewards bit for bit (TRL packs advantages as float32, the stage's precision).
* `completion_samples` turns one prompt's completions (token ids, log-probs, rewards) into the stage's
  `Sample`s, for a generator outside TRL's own worker (a `rollout_func`, a vLLM server of one's own).

Commits trail training: a batch is committed once all its samples left the queue before the optimizer step
*before* the last `update_model_version`, so a restart repeats at most what was queued or in flight, never
skips a sample.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

from rollout_stream.codec import Array, Sample, TrainSample
from rollout_stream.errors import RuntimeFailure
from rollout_stream.integrations.rows import row_of, weight_version_of
from rollout_stream.reader import Batch, BatchPosition, TrainDataReader

__all__ = ["StageRolloutWorker", "StageWorkerError", "VersionedRolloutSample", "rollout_sample",
           "completion_samples"]


class StageWorkerError(RuntimeFailure, RuntimeError):
    """The stage's rollout worker cannot feed the trainer (its reader failed, or it hung); the cause is
    chained."""


class _CountingQueue(queue.Queue[Any]):
    """A queue that counts what was taken from it: how far the trainer consumed, for commits."""

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self.taken = 0

    def _get(self) -> Any:  # called under the queue's lock
        self.taken += 1
        return super()._get()


@dataclass(slots=True)
class VersionedRolloutSample(RolloutSample):  # type: ignore[misc]  # TRL ships no types
    """TRL's `RolloutSample` (TRL reads it as one) with `token_versions`: aligned with `input_ids`, the weight
    version each completion token was generated under (-1 on prompt positions, or where none is known), for a
    trainer that weights tokens by the policy that produced them (TIS/MIS). TRL's own fields hold one
    `model_version` per sample, its oldest."""

    token_versions: np.ndarray | None = None


def rollout_sample(train: TrainSample, *, group_id: int, model_version: int, now: float | None = None
                   ) -> VersionedRolloutSample:
    """TRL's `RolloutSample` of one train sample: the whole sequence as `input_ids`, the loss mask and the
    rollout log-probs aligned with it, `advantage` = the stage's processed reward, and the version of each
    token (`VersionedRolloutSample`). `model_version`: the sample's oldest weight version (the caller passes
    the trainer's current one when it has none)."""
    row = row_of(train)
    sample = train.sample
    return VersionedRolloutSample(
        prompt=sample.prompt, completion=sample.response, input_ids=row.tokens, completion_mask=row.mask,
        old_log_probs=row.log_probs, advantage=float(train.reward), model_version=model_version,
        group_id=group_id, metrics={"reward": float(train.raw_reward)}, enqueued_at=now,
        token_versions=row.versions)


class StageRolloutWorker:
    """TRL's `RolloutWorkerProtocol` fed by a `TrainDataReader` (which it owns and closes on `stop`).

    `update_model_version(v)` becomes the reader's `set_weight_version(v)` (its staleness bound and the
    progress paced producers wait on). `check_health(stale_after_s)` raises `StageWorkerError` when the
    reader failed or the feeding thread has not come round for `stale_after_s`; a stage without data is not a
    failure unless `max_idle_s` is set (then no batch for that long is). `queue_maxsize` bounds the samples
    read ahead of the trainer (0: no bound; the reader's own prefetch still bounds what it holds).
    """

    def __init__(self, reader: TrainDataReader, *, queue_maxsize: int = 0, poll_s: float = 0.5,
                 max_idle_s: float | None = None) -> None:
        self.reader = reader
        self.rollout_buffer: _CountingQueue = _CountingQueue(queue_maxsize)
        # TRL's trainer drains this in log(): a dict per item, gauges as floats.
        self.metrics_queue: queue.Queue[dict[str, float]] = queue.Queue(maxsize=1024)
        self.poll_s = poll_s
        self.max_idle_s = max_idle_s
        self._version: int | None = None
        self._applied: int | None = None
        self._trained_through = 0  # samples taken before the previous version update: trained
        self._taken_at_update = 0
        self._put = 0
        self._positions: deque[tuple[int, BatchPosition]] = deque()  # (samples put through it, position)
        self._groups = 0
        self._heartbeat = time.monotonic()
        self._last_batch = time.monotonic()
        self._failure: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ---- RolloutWorkerProtocol -----------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._heartbeat = self._last_batch = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rollout-stream-trl-feeder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._failure is None:
            self._apply_version()  # the commit the last version update allows (the thread is gone)
        self.reader.close()

    def update_model_version(self, model_version: int) -> None:
        with self._lock:
            # What the trainer had taken at the previous update went into the step that just ended; what it
            # took since may still wait in a micro-batch of the next one.
            self._trained_through = self._taken_at_update
            self._taken_at_update = self.rollout_buffer.taken
            self._version = int(model_version)

    def check_health(self, stale_after_s: float) -> None:
        if self._failure is not None:
            raise StageWorkerError(f"the stage's reader failed: {type(self._failure).__name__}: "
                                   f"{self._failure}") from self._failure
        now = time.monotonic()
        if self._thread is not None and now - self._heartbeat > stale_after_s:
            raise StageWorkerError(f"the stage's feeding thread has not come round for "
                                   f"{now - self._heartbeat:.0f}s > {stale_after_s:.0f}s")
        if self.max_idle_s is not None and now - self._last_batch > self.max_idle_s:
            raise StageWorkerError(f"no batch from {self.reader.topic} for {now - self._last_batch:.0f}s "
                                   f"(max_idle_s={self.max_idle_s:.0f})")

    # ---- the feeding thread --------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._heartbeat = time.monotonic()
                self._apply_version()
                batch = self.reader.next_batch(timeout=self.poll_s)
                if batch is not None:
                    self._last_batch = time.monotonic()
                    self._feed(batch)
        except BaseException as exc:  # surfaced to the trainer by check_health
            self._failure = exc

    def _apply_version(self) -> None:
        """Version and commit where the reader lives (its thread): the reader is not shared across threads."""
        with self._lock:
            version, trained = self._version, self._trained_through
        if version is not None and version != self._applied:
            self.reader.set_weight_version(version)
            self._applied = version
        done = None
        while self._positions and self._positions[0][0] <= trained:
            done = self._positions.popleft()[1]
        if done is not None:
            self.reader.commit(done)

    def _feed(self, batch: Batch) -> None:
        ids = {g.key: self._groups + i for i, g in enumerate(batch.groups)}
        self._groups += len(batch.groups)
        version = self._applied if self._applied is not None else 0
        for train in batch.samples:
            oldest = weight_version_of(train)
            item = rollout_sample(train, group_id=ids[train.group_key],
                                  model_version=version if oldest is None else oldest, now=time.time())
            while not self._stop.is_set():
                try:
                    self.rollout_buffer.put(item, timeout=self.poll_s)
                    break
                except queue.Full:  # the trainer is behind: back-pressure, still alive
                    self._heartbeat = time.monotonic()
                    self._apply_version()
            self._put += 1
        position = self.reader.position
        if position is not None:
            self._positions.append((self._put, position))
        try:
            self.metrics_queue.put_nowait({
                "stage/skipped_stale_groups": float(self.reader.stats.skipped_stale_groups),
                "stage/batches": float(self.reader.stats.batches)})
        except queue.Full:  # a trainer that stops draining metrics must not stop the data
            pass


def completion_samples(prompt_ids: Sequence[int], completions: Sequence[Sequence[int]],
                       rewards: Sequence[float], *, group_index: int, run_id: str | None = None,
                       log_probs: Sequence[Sequence[float]] | None = None, weight_version: int | None = None,
                       prompt: str = "", responses: Sequence[str] | None = None) -> list[Sample]:
    """One prompt's completions as a prompt group of the stage: rollout i is completion i (one sample each,
    `rollout_id` = group_index * len(completions) + i), its reward `rewards[i]`."""
    n = len(completions)
    if len(rewards) != n or (log_probs is not None and len(log_probs) != n):
        raise ValueError(f"{n} completions need {n} rewards (and log-prob lists), got {len(rewards)}")
    out = []
    for i, completion in enumerate(completions):
        tokens = Array(np.asarray([*prompt_ids, *completion], dtype="<i4"))
        out.append(Sample(
            group_index=group_index, index=group_index * n + i, rollout_id=group_index * n + i, prompt=prompt,
            response=responses[i] if responses is not None else "", tokens=tokens,
            response_length=len(completion), reward=float(rewards[i]),
            loss_mask=Array(np.ones(len(completion), dtype="u1")),
            rollout_log_probs=(None if log_probs is None else Array(np.asarray(log_probs[i], dtype="<f4"))),
            weight_versions=[] if weight_version is None else [str(weight_version)],
            group_size=n, sibling_count=1, sibling_index=0, run_id=run_id))
    return out
