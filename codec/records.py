"""Wire records: the rollout sample (input) and the train sample (output), docs/spec.md §3."""

from __future__ import annotations

from typing import Any

import msgspec

from rollout_stream.codec.arrays import Array, ShapedArray
from rollout_stream.codec.miles_sample import miles_sample_fields

__all__ = ["SCHEMA_VERSION", "Sample", "TrainSample", "Reward"]

# Bumped only for changes an older reader cannot ignore; new fields with defaults keep the version.
SCHEMA_VERSION = 1

Reward = float | dict[str, float]


class Sample(msgspec.Struct, kw_only=True, tag="rollout_sample", tag_field="type"):
    """One training sample produced by a rollout worker (fields named as in the reference trainer)."""

    schema_version: int = SCHEMA_VERSION
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | str | None = None
    prompt: str = ""
    response: str = ""
    label: str | None = None
    tokens: Array | None = None
    response_length: int = 0
    reward: float | dict[str, float] | None = None
    loss_mask: Array | None = None
    rollout_log_probs: Array | None = None
    status: str = "completed"
    remove_sample: bool = False
    weight_versions: list[str] = msgspec.field(default_factory=list)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    # Streaming fields.
    group_size: int | None = None
    sibling_count: int = 1
    sibling_index: int = 0
    run_id: str | None = None
    # Fields miles trainers read (docs/miles.md). Added later: None in records of older producers.
    teacher_log_probs: Array | None = None  # on-policy distillation
    opd_reverse_kl: Array | None = None  # precomputed per-token OPD reverse-KL estimate
    rollout_routed_experts: ShapedArray | None = None  # MoE routing replay, (tokens - 1, layers, top-k)
    rollout_indexer_topk: ShapedArray | None = None  # sparse-attention indexer replay, like the experts
    train_metadata: dict[str, Any] | None = None  # per-sample training options (e.g. which loss)
    # Sampling-mask replay (miles' names), CSR over the response: the token ids the sampler could emit at
    # response token t are ids[offsets[t]:offsets[t + 1]]; offsets has response_length + 1 entries.
    rollout_sampling_mask_ids: Array | None = None
    rollout_sampling_mask_offsets: Array | None = None
    # Partial rollouts (generation interrupted by a weight update and continued): the response token at
    # which each of `weight_versions` started generating, one offset per version. Version i produced
    # response tokens [offsets[i], offsets[i + 1]), the last one up to response_length; equal offsets, or
    # an offset equal to response_length, mark a version that produced none. None: the whole response
    # under the listed versions, judged by the oldest (docs/codec.md).
    weight_version_offsets: Array | None = None

    def __post_init__(self) -> None:
        # Accept plain lists/ndarrays from callers; decoded records already hold Arrays.
        if self.tokens is not None and not isinstance(self.tokens, Array):
            self.tokens = Array(self.tokens)
        if self.loss_mask is not None and not isinstance(self.loss_mask, Array):
            self.loss_mask = Array(self.loss_mask)
        if self.rollout_log_probs is not None and not isinstance(self.rollout_log_probs, Array):
            self.rollout_log_probs = Array(self.rollout_log_probs)
        if self.teacher_log_probs is not None and not isinstance(self.teacher_log_probs, Array):
            self.teacher_log_probs = Array(self.teacher_log_probs)
        if self.opd_reverse_kl is not None and not isinstance(self.opd_reverse_kl, Array):
            self.opd_reverse_kl = Array(self.opd_reverse_kl)
        ids = self.rollout_sampling_mask_ids
        if ids is not None and not isinstance(ids, Array):
            self.rollout_sampling_mask_ids = Array(ids)
        offsets = self.rollout_sampling_mask_offsets
        if offsets is not None and not isinstance(offsets, Array):
            self.rollout_sampling_mask_offsets = Array(offsets)
        version_offsets = self.weight_version_offsets
        if version_offsets is not None and not isinstance(version_offsets, Array):
            self.weight_version_offsets = Array(version_offsets)
        experts, topk = self.rollout_routed_experts, self.rollout_indexer_topk
        if experts is not None and not isinstance(experts, ShapedArray):
            self.rollout_routed_experts = ShapedArray.of(experts)
        if topk is not None and not isinstance(topk, ShapedArray):
            self.rollout_indexer_topk = ShapedArray.of(topk)

    @classmethod
    def from_miles(
        cls,
        obj: Any,
        *,
        group_size: int | None = None,
        sibling_count: int = 1,
        sibling_index: int = 0,
        run_id: str | None = None,
    ) -> Sample:
        """A rollout sample from a miles/slime `Sample`, or a dict with its field names (`Sample.to_dict()`).

        `status` may be the `Sample.Status` enum or its value; `reward` a number or a mapping of numbers.
        The streaming fields are not miles' and are given here. Raises ValueError for what the wire
        cannot carry (multimodal train inputs, LoRA adapters, non-numeric rewards); see docs/miles.md.
        """
        fields = miles_sample_fields(obj)
        return cls(
            **fields,
            group_size=group_size,
            sibling_count=sibling_count,
            sibling_index=sibling_index,
            run_id=run_id,
        )


class TrainSample(msgspec.Struct, kw_only=True, tag="train_sample", tag_field="type"):
    """A published sample: the rollout sample unchanged plus its group-normalized reward."""

    schema_version: int = SCHEMA_VERSION
    sample: Sample
    raw_reward: float
    reward: float
    group_key: str
    group_rollout_count: int
    group_sample_count: int
    group_mean: float
    group_std: float
    zero_variance: bool
    advantage_estimator: str
    rewards_normalization: bool
    grpo_std_normalization: bool
    reward_key: str | None
    source_topic: str
    source_partition: int
    source_offset: int
    stage_version: str = ""
