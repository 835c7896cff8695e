"""What the trainer gets: `Batch`, one step's data for one data-parallel rank."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from rollout_stream.codec import TrainSample
from rollout_stream.core.assembly import GroupInfo
from rollout_stream.core.collate import Collated
from rollout_stream.core.staleness import token_version_rows

if TYPE_CHECKING:
    import torch

__all__ = ["Batch", "GroupInfo"]


@dataclass(frozen=True)
class Batch:
    """One step's data: `groups` (all ranks') and this rank's `samples` with their collated tensors.

    `index`: the batch's place in the global sequence (the same on every rank, kept across resumes).
    `rank`, `world_size`: whose share this is. `samples`: this rank's train samples, in global order.
    `groups`: every group of the batch (all ranks), in global order. `tensors`: `samples` collated (the
    properties below read it). `skipped_stale`, `skipped_invalid`, `skipped_superseded`: groups this batch
    left out (too old for the weight version; cannot be collated or judged; another attempt of their prompt
    trains, the fence). `global_samples`, `global_loss_tokens`: samples and tokens with a non-zero loss mask
    of the whole batch, over all ranks (for DP loss normalization), counting only what trains.
    `stale_rollouts`, `stale_tokens`: with staleness by rollout or by token, what the bound left out of the
    groups that train (all ranks'): their rewards stay the whole group's. `rollout_data`: with
    `layout="miles"`, this rank's finished shard (rollout_stream.core.miles: train_data → split_by_dp →
    trainer_shard), what a miles trainer rank receives in-process; `samples` are then its rows.
    """

    index: int
    rank: int
    world_size: int
    samples: list[TrainSample]
    groups: list[GroupInfo]
    tensors: Collated
    skipped_stale: int
    skipped_invalid: int
    global_samples: int
    global_loss_tokens: int
    rollout_data: dict[str, Any] | None = None
    skipped_superseded: int = 0
    stale_rollouts: int = 0
    stale_tokens: int = 0

    @property
    def tokens(self) -> torch.Tensor:
        return self.tensors.tokens

    @property
    def attention_mask(self) -> torch.Tensor:
        return self.tensors.attention_mask

    @property
    def total_lengths(self) -> torch.Tensor:
        return self.tensors.total_lengths

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.tensors.response_lengths

    @property
    def loss_mask(self) -> torch.Tensor:
        return self.tensors.loss_mask

    @cached_property
    def token_weight_versions(self) -> torch.Tensor:
        """int64 (B, R), aligned with `loss_mask`: the weight version each response token was generated under
        (`Sample.weight_version_offsets`; without them a sample's oldest version); -1 on padding and for a
        sample without integer weight versions."""
        import torch

        return torch.from_numpy(token_version_rows(self.samples))

    @property
    def rollout_log_probs(self) -> torch.Tensor:
        return self.tensors.rollout_log_probs

    @property
    def response_index(self) -> torch.Tensor:
        return self.tensors.response_index

    @property
    def rewards(self) -> torch.Tensor:
        return self.tensors.rewards

    @property
    def raw_rewards(self) -> torch.Tensor:
        return self.tensors.raw_rewards

    def __len__(self) -> int:
        return len(self.samples)
