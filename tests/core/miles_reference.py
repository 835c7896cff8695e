"""miles' train-data path transcribed plainly, for differential tests of core/miles.py and core/balance.py.

Source: radixark/miles (Apache-2.0) at 31f1ca9: `miles/ray/rollout/train_data_conversion.py`
(`convert_samples_to_train_data`, `_compute_rollout_mask_sums`, `split_train_data_by_dp_raw`,
`_package_shards`, `process_rollout_data_shard`), `miles/utils/seqlen_balancing.py`
(`karmarkar_karp`, `get_seqlen_balanced_partitions`) and `miles/utils/types.py` (`Sample`).
Kept independent of `core/`: same statements in the same order, mutations included (loss masks filled
in on the samples, `total_lengths` added to the batch, `partition` popped). Dropped: the custom-function
hooks, multi-LoRA adapters, multimodal inputs, the rollout-side schedule, dynamic batch size and the
Timer side effect. Rewards come from tests/core/reference_impl.py (the same transcription's rewards).
"""

from __future__ import annotations

import heapq
import importlib.util
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


def _load_reward_reference() -> Any:
    name = "rollout_stream_tests_reference_impl"
    if name in sys.modules:
        return sys.modules[name]
    path = Path(__file__).resolve().parent / "reference_impl.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


reward_reference = _load_reward_reference()


# ---------------------------------------------------------------- miles.utils.types.Sample (the fields used)


@dataclass
class MilesSample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: Any = None
    prompt: Any = ""
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: Any = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_routed_experts: Any = None
    rollout_indexer_topk: Any = None
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None
    opd_reverse_kl: list[float] | None = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    train_metadata: dict | None = None


# ---------------------------------------------------------------- convert_samples_to_train_data


def convert_samples_to_train_data(args: Any, samples: list[MilesSample], metadata: dict[str, Any]) -> dict:
    raw_rewards, rewards = reward_reference.post_process_rewards(
        args, samples, prompt_group_sizes=metadata.get("prompt_group_sizes")
    )
    assert len(raw_rewards) == len(samples)
    assert len(rewards) == len(samples)

    train_data = {
        "tokens": [sample.tokens for sample in samples],
        "response_lengths": [sample.response_length for sample in samples],
        "rewards": rewards,
        "raw_reward": raw_rewards,
        "truncated": [1 if sample.status == MilesSample.Status.TRUNCATED else 0 for sample in samples],
        "sample_indices": [sample.index for sample in samples],
        "rollout_ids": [s.rollout_id if s.rollout_id is not None else s.index for s in samples],
    }

    loss_masks = []
    for sample in samples:
        if sample.loss_mask is None:
            sample.loss_mask = [1] * sample.response_length
        assert len(sample.loss_mask) == sample.response_length
        if sample.remove_sample:
            sample.loss_mask = [0] * sample.response_length
        loss_masks.append(sample.loss_mask)
    train_data["loss_masks"] = loss_masks

    train_data["rollout_mask_sums"] = compute_rollout_mask_sums(train_data["rollout_ids"], loss_masks)

    if samples[0].metadata and "raw_reward" in samples[0].metadata:
        train_data["raw_reward"] = [sample.metadata["raw_reward"] for sample in samples]
    if samples[0].metadata and "round_number" in samples[0].metadata:
        train_data["round_number"] = [sample.metadata["round_number"] for sample in samples]
    if samples[0].rollout_log_probs is not None:
        train_data["rollout_log_probs"] = [sample.rollout_log_probs for sample in samples]
    if samples[0].rollout_routed_experts is not None:
        train_data["rollout_routed_experts"] = [sample.rollout_routed_experts for sample in samples]
    if samples[0].rollout_indexer_topk is not None:
        train_data["rollout_indexer_topk"] = [sample.rollout_indexer_topk for sample in samples]
    if samples[0].train_metadata is not None:
        train_data["metadata"] = [sample.train_metadata for sample in samples]
    if any(sample.weight_versions for sample in samples):
        train_data["weight_versions"] = [sample.weight_versions for sample in samples]
    if samples[0].teacher_log_probs is not None:
        train_data["teacher_log_probs"] = [sample.teacher_log_probs for sample in samples]
    if (prompt_group_sizes := metadata.get("prompt_group_sizes")) is not None:
        train_data["prompt_group_sizes"] = prompt_group_sizes
    if samples[0].opd_reverse_kl is not None:
        train_data["opd_reverse_kl"] = [sample.opd_reverse_kl for sample in samples]
    return train_data


def compute_rollout_mask_sums(rollout_ids: list[Any], loss_masks: list[list[int]]) -> list[int]:
    totals: dict[Any, int] = {}
    for rid, mask in zip(rollout_ids, loss_masks, strict=True):
        totals[rid] = totals.get(rid, 0) + sum(mask)
    return [totals[rid] for rid in rollout_ids]


# ---------------------------------------------------------------- seqlen_balancing.karmarkar_karp


class KKSet:
    def __init__(self) -> None:
        self.sum = 0
        self.items: list[tuple[int, int]] = []

    def add(self, idx: int, val: int) -> None:
        self.items.append((idx, val))
        self.sum += val

    def merge(self, other: KKSet) -> None:
        for idx, val in other.items:
            self.items.append((idx, val))
            self.sum += val

    def __lt__(self, other: KKSet) -> bool:
        if self.sum != other.sum:
            return self.sum < other.sum
        if len(self.items) != len(other.items):
            return len(self.items) < len(other.items)
        return self.items < other.items


class KKState:
    def __init__(self, items: list[tuple[int, int]], k: int) -> None:
        self.k = k
        self.sets = [KKSet() for _ in range(k)]
        assert len(items) in [1, k]
        for i, (idx, seqlen) in enumerate(items):
            self.sets[i].add(idx=idx, val=seqlen)
        self.sets = sorted(self.sets, reverse=True)

    def get_partitions(self) -> list[list[int]]:
        return [[idx for idx, _ in s.items] for s in self.sets]

    def merge(self, other: KKState) -> None:
        for i in range(self.k):
            self.sets[i].merge(other.sets[self.k - 1 - i])
        self.sets = sorted(self.sets, reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].sum - self.sets[-1].sum

    def __lt__(self, other: KKState) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0] > other.sets[0]


def karmarkar_karp(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    sorted_seqlen_list = sorted([(seqlen, i) for i, seqlen in enumerate(seqlen_list)])
    states_pq: list[KKState] = []
    if equal_size:
        assert len(seqlen_list) % k_partitions == 0
        for offset in range(0, len(sorted_seqlen_list), k_partitions):
            items = []
            for i in range(k_partitions):
                seqlen, idx = sorted_seqlen_list[offset + i]
                items.append((idx, seqlen))
            heapq.heappush(states_pq, KKState(items=items, k=k_partitions))
    else:
        for seqlen, idx in sorted_seqlen_list:
            heapq.heappush(states_pq, KKState(items=[(idx, seqlen)], k=k_partitions))
    while len(states_pq) > 1:
        state0 = heapq.heappop(states_pq)
        state1 = heapq.heappop(states_pq)
        state0.merge(state1)
        heapq.heappush(states_pq, state0)
    partitions = states_pq[0].get_partitions()
    if equal_size:
        for partition in partitions:
            assert len(partition) * k_partitions == len(seqlen_list)
    return partitions


def get_seqlen_balanced_partitions(seqlen_list: list[int], k_partitions: int, equal_size: bool) -> list:
    assert len(seqlen_list) >= k_partitions
    partitions = karmarkar_karp(seqlen_list=seqlen_list, k_partitions=k_partitions, equal_size=equal_size)
    assert len(partitions) == k_partitions
    seen_idx = set()
    sorted_partitions: list[Any] = [None] * k_partitions
    for i, partition in enumerate(partitions):
        assert len(partition) > 0
        for idx in partition:
            seen_idx.add(idx)
        sorted_partitions[i] = sorted(partition)
    assert seen_idx == set(range(len(seqlen_list)))
    return sorted_partitions


# ---------------------------------------------------------------- split_train_data_by_dp_raw, shards


def split_train_data_by_dp_raw(args: Any, data: dict[str, Any], *, dp_size: int) -> list[dict[str, Any]]:
    total_lengths = [len(t) for t in data["tokens"]]
    data["total_lengths"] = total_lengths
    if args.balance_data:
        partitions = get_seqlen_balanced_partitions(total_lengths, dp_size, equal_size=True)
    else:
        partitions = [range(i, len(total_lengths), dp_size) for i in range(dp_size)]
    return package_shards(data, partitions)


def package_shards(data: dict[str, Any], partitions: list[Any]) -> list[dict[str, Any]]:
    shards = []
    for i in range(len(partitions)):
        rollout_data: dict[str, Any] = {}
        partition = partitions[i]
        rollout_data["partition"] = partition
        for key in [
            "tokens",
            "multimodal_train_inputs",
            "response_lengths",
            "rewards",
            "truncated",
            "loss_masks",
            "round_number",
            "sample_indices",
            "rollout_ids",
            "rollout_mask_sums",
            "rollout_log_probs",
            "rollout_routed_experts",
            "rollout_indexer_topk",
            "prompt",
            "teacher_log_probs",
            "opd_reverse_kl",
            "seq_witness_ids",
            "weight_versions",
            "adapter_slots",
        ]:
            if key not in data:
                continue
            rollout_data[key] = [data[key][j] for j in partition]
        for key in [
            "raw_reward",
            "total_lengths",
            "dynamic_global_batch_size",
            "step_slots",
            "step_adapter_names",
            "step_adapter_batch_sizes",
            "prompt_group_sizes",
        ]:
            if key not in data:
                continue
            rollout_data[key] = data[key]
        shards.append(rollout_data)
    return shards


def process_rollout_data_shard(rollout_data: dict[str, Any]) -> dict[str, Any]:
    partition = rollout_data.pop("partition")
    total_lengths = rollout_data["total_lengths"]
    rollout_data["total_lengths"] = [total_lengths[i] for i in partition]
    return rollout_data
