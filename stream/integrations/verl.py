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
* verl's `MessageQueue` actor on the stage: `rollout_stream.integrations.verl_queue`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from verl import DataProto
from verl.experimental.fully_async_policy.detach_utils import RolloutSample
from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

from rollout_stream.codec import Array, Sample, TrainSample
from rollout_stream.integrations.rows import row_of

__all__ = ["STAGE_ESTIMATOR", "Rewards", "data_proto", "register_estimator", "rollout_sample", "samples_of",
           "stage_advantage"]

STAGE_ESTIMATOR = "rollout_stream"
Rewards = Literal["stage", "raw"]


def stage_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config: Any = None,
                    **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's advantage-estimator signature passing the stage's processed reward through: each row's one
    nonzero score (its sum is exact) on every response token it trains."""
    scores = token_level_rewards.sum(dim=-1, keepdim=True) * response_mask
    return scores, scores


def register_estimator() -> None:
    """Register `stage_advantage` as verl's `STAGE_ESTIMATOR` in this process (importing this module does);
    verl computes advantages in its trainer's Ray actor, a process of its own: name this function as Ray's
    `worker_process_setup_hook` to register it there."""
    if ADV_ESTIMATOR_REGISTRY.get(STAGE_ESTIMATOR) is not stage_advantage:
        register_adv_est(STAGE_ESTIMATOR)(stage_advantage)


register_estimator()


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
    token_versions = torch.full((n, q), -1, dtype=torch.int64)
    for i, (row, train) in enumerate(zip(rows, samples, strict=True)):
        k, m = row.prompt_length, len(row.tokens) - row.prompt_length
        prompts[i, p - k:] = torch.from_numpy(row.tokens[:k])  # left-padded, as verl's rollout writes them
        responses[i, :m] = torch.from_numpy(row.tokens[k:])
        attention[i, p - k:p + m] = 1
        response_mask[i, :m] = torch.from_numpy(row.mask[k:])
        log_probs[i, :m] = torch.from_numpy(row.log_probs[k:])
        token_versions[i, :m] = torch.from_numpy(row.versions[k:])
        if m:
            scores[i, m - 1] = train.reward if rewards == "stage" else train.raw_reward
    versions = [_versions(s) for s in samples]
    tensors = {
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention, "position_ids": (attention.cumsum(dim=1) - 1).clamp(min=0),
        "response_mask": response_mask, "rollout_log_probs": log_probs, "rm_scores": scores,
        "rollout_weight_versions": token_versions,  # per response token (-1: padding or none known)
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
