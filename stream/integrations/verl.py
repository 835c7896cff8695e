"""verl (`pip install 'rollout-stream[verl]'`): prompt groups of the stage as the `RolloutSample`s and
`DataProto` rows verl's fully-async trainer assembles, and verl's generated rows as the stage's samples.

* `data_proto(samples)`: one row per train sample, the tensors `assemble_batch_from_rollout_samples` and
  `compute_advantage` read (`prompts` left-padded, `responses` right-padded, `input_ids`, `attention_mask`,
  `position_ids`, `response_mask` = the loss mask, `rollout_log_probs`, `rm_scores` with the reward on the
  last response token), non-tensor `uid` (the group key: verl's GRPO groups rows by it) and
  `min_global_steps`/`max_global_steps` (the sample's weight versions).
* Advantages, a choice per batch (`rewards=`): `"stage"` puts the stage's processed reward in `rm_scores`
  and the estimator registered as `STAGE_ESTIMATOR` passes it through (bit for bit); `"raw"` puts the raw
  reward there for verl's own estimators. verl's GRPO then differs from the stage's where docs/integrations.md
  says: a group of one row gets r / (1 + 1e-6) (the stage: 0.0), and sibling rows of one rollout count as
  rollouts of their own.
* `StageMessageQueue`: the methods of verl's `MessageQueue` actor, fed by a `TrainDataReader` (one verl
  `RolloutSample` per prompt group, pickled as verl's rollouter pickles them) and, for `put_sample`,
  publishing through a `RolloutProducer`. It never drops: a full queue holds the reader back. Wrap it as verl
  wraps its own: `ray.remote(StageMessageQueue).remote(...)` and `MessageQueueClient(actor)`.
"""

from __future__ import annotations

import asyncio
import pickle
import queue
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from verl import DataProto
from verl.experimental.fully_async_policy.detach_utils import RolloutSample
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from rollout_stream.codec import Array, Sample, TrainSample
from rollout_stream.errors import RuntimeFailure
from rollout_stream.integrations.rows import row_of
from rollout_stream.producer import RolloutProducer
from rollout_stream.reader import BatchPosition, TrainDataReader

__all__ = ["STAGE_ESTIMATOR", "StageMessageQueue", "StageQueueError", "data_proto", "rollout_sample",
           "samples_of", "stage_advantage"]

STAGE_ESTIMATOR = "rollout_stream"
Rewards = Literal["stage", "raw"]


class StageQueueError(RuntimeFailure, RuntimeError):
    """The stage's message queue cannot feed the trainer (its reader failed); the cause is chained."""


def stage_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config: Any = None,
                    **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's advantage-estimator signature passing the stage's processed reward through: each row's one
    nonzero score (its sum is exact) on every response token it trains."""
    scores = token_level_rewards.sum(dim=-1, keepdim=True) * response_mask
    return scores, scores


if ADV_ESTIMATOR_REGISTRY.get(STAGE_ESTIMATOR) is not stage_advantage:
    register_adv_est(STAGE_ESTIMATOR)(stage_advantage)


def data_proto(samples: Sequence[TrainSample], *, rewards: Rewards = "stage", pad_token_id: int = 0,
               prompt_length: int | None = None, response_length: int | None = None) -> Any:
    """verl's `DataProto` of train samples, one row each, in order (see the module docstring).

    `prompt_length`, `response_length`: the padded widths, verl's `data.max_prompt_length` and
    `data.max_response_length` (verl concatenates the groups of a step, so every group needs the same
    widths; a sample longer is refused with ValueError). None: the longest of these samples."""
    if rewards not in ("stage", "raw"):
        raise ValueError(f"rewards must be 'stage' or 'raw', got {rewards!r}")
    rows = [row_of(s) for s in samples]
    n = len(rows)
    longest_prompt = max((r.prompt_length for r in rows), default=0)
    longest_response = max((len(r.tokens) - r.prompt_length for r in rows), default=0)
    p = longest_prompt if prompt_length is None else prompt_length
    q = longest_response if response_length is None else response_length
    if longest_prompt > p or longest_response > q:
        raise ValueError(f"a sample of {longest_prompt} prompt and {longest_response} response tokens does "
                         f"not fit prompt_length={p}, response_length={q}")
    prompts = torch.full((n, p), pad_token_id, dtype=torch.long)
    responses = torch.full((n, q), pad_token_id, dtype=torch.long)
    attention = torch.zeros((n, p + q), dtype=torch.long)
    response_mask = torch.zeros((n, q), dtype=torch.long)
    log_probs = torch.zeros((n, q), dtype=torch.float32)
    scores = torch.zeros((n, q), dtype=torch.float32)
    for i, (row, train) in enumerate(zip(rows, samples, strict=True)):
        k, m = row.prompt_length, len(row.tokens) - row.prompt_length
        prompts[i, p - k:] = torch.from_numpy(row.tokens[:k])  # left-padded, as verl's rollout writes them
        responses[i, :m] = torch.from_numpy(row.tokens[k:])
        attention[i, p - k:p + m] = 1
        response_mask[i, :m] = torch.from_numpy(row.mask[k:])
        log_probs[i, :m] = torch.from_numpy(row.log_probs[k:])
        if m:
            scores[i, m - 1] = train.reward if rewards == "stage" else train.raw_reward
    versions = [_versions(s) for s in samples]
    tensors = {
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention, "position_ids": (attention.cumsum(dim=1) - 1).clamp(min=0),
        "response_mask": response_mask, "rollout_log_probs": log_probs, "rm_scores": scores,
    }
    non_tensors = {
        "uid": np.array([s.group_key for s in samples], dtype=object),
        "min_global_steps": np.array([v[0] for v in versions], dtype=object),
        "max_global_steps": np.array([v[1] for v in versions], dtype=object),
    }
    # addition_process pops one timing record per row (verl's agent loop writes them)
    meta = {"metrics": [{"generate_sequences": 0.0, "tool_calls": 0.0} for _ in range(n)]}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)


def _versions(train: TrainSample) -> tuple[int, int]:
    try:
        values = [int(v) for v in train.sample.weight_versions]
    except ValueError:
        values = []
    return (min(values), max(values)) if values else (0, 0)


def rollout_sample(group: Sequence[TrainSample], *, epoch: int = 0, rewards: Rewards = "stage",
                   pad_token_id: int = 0, prompt_length: int | None = None,
                   response_length: int | None = None) -> Any:
    """verl's `RolloutSample` of one prompt group (verl's rollouter puts one per prompt, its n rows)."""
    data = data_proto(group, rewards=rewards, pad_token_id=pad_token_id, prompt_length=prompt_length,
                      response_length=response_length)
    return RolloutSample(full_batch=data, sample_id=group[0].group_key if group else "", epoch=epoch,
                         rollout_status={})


def samples_of(data: Any, *, group_index: int, run_id: str | None = None, weight_version: int | None = None,
               reward_key: str = "rm_scores") -> list[Sample]:
    """The stage's samples of verl's generated rows of one prompt (rollout i = row i, one sample each): the
    unpadded prompt and response tokens, `response_mask` as loss mask, `rollout_log_probs` when present, the
    reward the row's `reward_key` scores sum to."""
    batch = data.batch
    prompts, responses = batch["prompts"], batch["responses"]
    p = prompts.shape[1]
    attention = batch["attention_mask"]
    mask = batch["response_mask"] if "response_mask" in batch.keys() else attention[:, p:]
    n = prompts.shape[0]
    out = []
    for i in range(n):
        prompt = prompts[i][attention[i, :p].bool()]
        m = int(attention[i, p:].sum())
        tokens = torch.cat([prompt, responses[i, :m]]).numpy().astype("<i4")
        log_probs = (Array(batch["rollout_log_probs"][i, :m].numpy().astype("<f4"))
                     if "rollout_log_probs" in batch.keys() else None)
        out.append(Sample(
            group_index=group_index, index=group_index * n + i, rollout_id=group_index * n + i,
            tokens=Array(tokens), response_length=m, reward=float(batch[reward_key][i].sum()),
            loss_mask=Array(mask[i, :m].numpy().astype("u1")), rollout_log_probs=log_probs,
            weight_versions=[] if weight_version is None else [str(weight_version)], group_size=n,
            sibling_count=1, sibling_index=0, run_id=run_id))
    return out


class StageMessageQueue:
    """verl's `MessageQueue` methods on the stage (see the module docstring).

    `reader`: the trainer side, read by a thread of this object (it owns the reader and closes it on
    `shutdown`); set its `groups_per_batch` to the prompts per training step of verl's trainer
    (`required_samples`): a batch is committed when the first group of the batch after the next one is
    asked for, by which time the step that took it is done (verl's trainer takes its samples, then trains).
    `producer`: the rollouter side, where `put_sample` publishes a pickled verl `RolloutSample`'s rows.
    `prompt_length`, `response_length`: verl's `data.max_prompt_length` and `data.max_response_length`
    (see `data_proto`); without them only groups of equal widths can be batched together.
    """

    def __init__(self, reader: TrainDataReader | None = None, producer: RolloutProducer | None = None, *,
                 max_queue_size: int = 64, rewards: Rewards = "stage", pad_token_id: int = 0,
                 run_id: str | None = None, poll_s: float = 0.5, prompt_length: int | None = None,
                 response_length: int | None = None) -> None:
        self.reader, self.producer = reader, producer
        self.prompt_length, self.response_length = prompt_length, response_length
        self.max_queue_size = max_queue_size
        self.rewards, self.pad_token_id, self.run_id, self.poll_s = rewards, pad_token_id, run_id, poll_s
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=max_queue_size)
        self._val: deque[Any] = deque()
        self.total_produced = 0
        self.total_consumed = 0
        self._published_groups = 0
        self._positions: deque[tuple[int, BatchPosition]] = deque()  # (groups put through it, position)
        self._commit_through = 0  # groups handed out before the step that is now running
        self._lock = threading.Lock()
        self._running = True
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        if reader is not None:
            self._thread = threading.Thread(target=self._run, name="rollout-stream-verl-feeder", daemon=True)
            self._thread.start()

    # ---- verl's MessageQueue ------------------------------------------------------------------------
    async def put_sample(self, sample: Any) -> bool:
        """Publish a (pickled) verl `RolloutSample`: its rows as one prompt group of the stage."""
        if self.producer is None:
            raise StageQueueError("this queue has no producer: it only feeds a trainer")
        if sample is None:  # verl's rollouter says it is done; the stage's stream has no end
            return True
        rollout = pickle.loads(sample) if isinstance(sample, bytes) else sample
        steps = rollout.full_batch.non_tensor_batch.get("max_global_steps")
        version = int(max(steps)) if steps is not None and len(steps) else None
        group = samples_of(rollout.full_batch, group_index=self._published_groups, run_id=self.run_id,
                           weight_version=version)
        self._published_groups += 1
        await asyncio.to_thread(self._publish, self.producer, group)
        self.total_produced += 1
        return True

    @staticmethod
    def _publish(producer: RolloutProducer, group: list[Sample]) -> None:
        for future in producer.send_group(group):
            future.get(60)

    async def get_sample(self) -> tuple[bytes, int] | None:
        """The next prompt group as a pickled verl `RolloutSample` and the queue length after it; None once
        shut down."""
        while True:
            if self._failure is not None:
                raise StageQueueError(f"the stage's reader failed: {type(self._failure).__name__}: "
                                      f"{self._failure}") from self._failure
            if not self._running and self._queue.empty():
                return None
            try:
                item = await asyncio.to_thread(self._queue.get, True, self.poll_s)
            except queue.Empty:
                continue
            with self._lock:
                self.total_consumed += 1
                groups = self.reader.groups_per_batch if self.reader is not None else 1
                # the first group of a batch: the step before it is trained, so is every group before it
                if (self.total_consumed - 1) % groups == 0:
                    self._commit_through = self.total_consumed - 1 - groups
            return item, self._queue.qsize()

    async def get_queue_size(self) -> int:
        return self._queue.qsize()

    async def get_statistics(self) -> dict[str, Any]:
        return {"queue_size": self._queue.qsize(), "total_produced": self.total_produced,
                "total_consumed": self.total_consumed, "dropped_samples": 0,
                "max_queue_size": self.max_queue_size}

    async def clear_queue(self) -> None:
        """Empty the local queue (its groups are read again after a restart: they were not committed)."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    async def shutdown(self) -> None:
        self._running = False
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
        if self.reader is not None:
            self.reader.close()

    async def get_memory_usage(self) -> dict[str, Any]:
        return {"queue_samples": self._queue.qsize(), "estimated_memory_bytes": 0, "estimated_memory_mb": 0.0}

    async def put_validate(self, data: Any) -> None:
        self._val.append(data)

    async def get_validate(self) -> Any | None:
        return self._val.popleft() if self._val else None

    # ---- the feeding thread -------------------------------------------------------------------------
    def _run(self) -> None:
        assert self.reader is not None
        put = 0
        try:
            while self._running:
                self._commit()
                batch = self.reader.next_batch(timeout=self.poll_s)
                if batch is None:
                    continue
                by_key: dict[str, list[TrainSample]] = {}
                for train in batch.samples:
                    by_key.setdefault(train.group_key, []).append(train)
                for info in batch.groups:
                    if info.key not in by_key:  # another rank's share
                        continue
                    item = pickle.dumps(rollout_sample(
                        by_key[info.key], rewards=self.rewards, pad_token_id=self.pad_token_id,
                        prompt_length=self.prompt_length, response_length=self.response_length))
                    while self._running:  # back-pressure, never a drop
                        try:
                            self._queue.put(item, timeout=self.poll_s)
                            put += 1
                            break
                        except queue.Full:
                            self._commit()
                if (position := self.reader.position) is not None:
                    self._positions.append((put, position))
        except BaseException as exc:  # surfaced to the trainer by get_sample
            self._failure = exc

    def _commit(self) -> None:
        with self._lock:
            through = self._commit_through
        done = None
        while self._positions and self._positions[0][0] <= through:
            done = self._positions.popleft()[1]
        if done is not None and self.reader is not None:
            self.reader.commit(done)
