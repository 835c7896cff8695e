"""The `rollout_data` a miles trainer rank receives, built from published train samples (docs/miles.md).

Three steps, as miles (radixark/miles @31f1ca9) takes them in-process:

* `train_data`: `convert_samples_to_train_data` (`miles/ray/rollout/train_data_conversion.py`), one dict of
  per-sample columns for the whole batch. Rewards are not recomputed: each train sample already carries
  the raw and the group-normalized reward, bit-identical to miles' (`rollout_stream.core.rewards`).
* `split_by_dp`: `split_train_data_by_dp_raw`, one shard per data-parallel rank.
* `trainer_shard`: `process_rollout_data_shard`, the trainer-side finish of a shard.

Pure functions; unlike miles they never modify their inputs (miles fills in missing loss masks on its
samples, adds `total_lengths` to the batch dict and pops `partition` from the shard).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from rollout_stream.codec import Array, Sample, ShapedArray, TrainSample
from rollout_stream.core.balance import balanced_partitions

__all__ = ["train_data", "split_by_dp", "trainer_shard", "dp_rows", "shard_of_rows", "PER_SAMPLE_KEYS",
           "WHOLE_BATCH_KEYS"]

# Keys a shard slices to its rows, and keys every shard gets whole, in miles' order (`_package_shards`).
# miles' list also holds keys of features not carried here (multimodal inputs, prompts, witness ids);
# they are sliced likewise when a caller adds them. `metadata` (train_metadata) is in neither list, in
# miles too: it reaches `train_data` but no shard.
PER_SAMPLE_KEYS: tuple[str, ...] = (
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
    "rollout_sampling_mask_ids",
    "rollout_sampling_mask_offsets",
    "prompt",
    "teacher_log_probs",
    "opd_reverse_kl",
    "seq_witness_ids",
    "weight_versions",
    # not miles': where each of a row's `weight_versions` starts in its response (rollout-stream's spans);
    # miles' own code ignores it, and this module slices it with the rest
    "weight_version_offsets",
)
WHOLE_BATCH_KEYS: tuple[str, ...] = (
    "raw_reward",
    "total_lengths",
    "dynamic_global_batch_size",
    "prompt_group_sizes",
)


_NO_TOKENS = Array(np.zeros(0, dtype=np.int32))  # miles' default `tokens` is an empty list
_NO_TOKENS.numpy().flags.writeable = False  # one array shared by every row without tokens


def _row(values: Array | None, arrays: bool) -> Any:
    """A token or log-prob row: a list of Python numbers (miles' type) or, with `arrays`, the numpy array."""
    if values is None:
        return None
    return values.numpy() if arrays else values.tolist()


def _shaped(values: ShapedArray | None, arrays: bool) -> np.ndarray | None:
    # miles holds these as numpy arrays already; the list layout gets a private, writable copy.
    if values is None:
        return None
    return values.numpy() if arrays else values.numpy().copy()


def _sampling_masks(samples: Sequence[Sample], arrays: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Every row's sampling mask as miles' `RolloutSamplingMask` holds it: ids int32, offsets int64 (the
    only conversion: the wire carries what the producer gave, int32 by miles' convention). With `arrays`,
    views of the records where the dtype is already right; else private, writable copies."""
    ids, offsets = [], []
    for row, sample in enumerate(samples):
        if sample.rollout_sampling_mask_ids is None or sample.rollout_sampling_mask_offsets is None:
            # miles refuses a batch where a training sample lacks it, like this
            raise ValueError(f"row {row}: no sampling mask, but the batch's first sample has one")
        ids.append(sample.rollout_sampling_mask_ids.numpy().astype(np.int32, copy=not arrays))
        offsets.append(sample.rollout_sampling_mask_offsets.numpy().astype(np.int64, copy=not arrays))
    return ids, offsets


def _loss_mask(sample: Sample, row: int, arrays: bool) -> Any:
    """miles' loss mask: all ones when missing, its length checked, all zeros for a removed sample."""
    length = sample.response_length
    mask = sample.loss_mask
    if mask is not None and len(mask) != length:
        raise ValueError(f"row {row}: loss mask length {len(mask)} != response length {length}")
    if sample.remove_sample:
        return np.zeros(length, dtype=np.int32) if arrays else [0] * length
    if mask is None:
        return np.ones(length, dtype=np.int32) if arrays else [1] * length
    values = mask.numpy()
    if arrays:
        return values
    # Bool masks would come out as True/False; miles' masks are ints.
    return (values.astype(np.int32) if values.dtype.kind == "b" else values).tolist()


def _rollout_mask_sums(rollout_ids: list[Any], loss_masks: list[Any]) -> list[int]:
    # Keyed by rollout id over the whole batch, as miles does: ids must be unique across prompt groups
    # (miles' are), or rollouts of different groups that share an id are summed together.
    totals: dict[Any, int] = {}
    for rid, mask in zip(rollout_ids, loss_masks, strict=True):
        totals[rid] = totals.get(rid, 0) + (sum(mask) if isinstance(mask, list) else mask.sum().item())
    return [totals[rid] for rid in rollout_ids]


def _from_metadata(samples: Sequence[Sample], name: str) -> list[Any]:
    values = []
    for row, sample in enumerate(samples):
        if name not in sample.metadata:
            # miles raises a bare KeyError here: the first sample decides, every sample must follow.
            raise ValueError(f"row {row}: metadata has no {name!r}, but the batch's first sample has one")
        values.append(sample.metadata[name])
    return values


def train_data(
    samples: Sequence[TrainSample],
    *,
    prompt_group_sizes: Sequence[int] | None = None,
    arrays: bool = False,
) -> dict[str, Any]:
    """miles' `train_data` dict for published train samples, key for key, in batch order.

    `prompt_group_sizes` is only recorded (the rewards are the samples'); it must sum to the batch size.
    With `arrays`, token, loss-mask and log-prob rows are numpy arrays (read-only views of the records)
    instead of lists. Raises ValueError for an empty batch, a loss mask whose length is not the
    response length, or a metadata override the first sample has and a later one lacks.
    """
    if not samples:
        raise ValueError("train_data needs at least one sample")
    rollout = [ts.sample for ts in samples]
    data: dict[str, Any] = {
        "tokens": [_row(s.tokens if s.tokens is not None else _NO_TOKENS, arrays) for s in rollout],
        "response_lengths": [s.response_length for s in rollout],
        "rewards": [ts.reward for ts in samples],
        "raw_reward": [ts.raw_reward for ts in samples],
        "truncated": [1 if s.status == "truncated" else 0 for s in rollout],
        "sample_indices": [s.index for s in rollout],
        "rollout_ids": [s.rollout_id if s.rollout_id is not None else s.index for s in rollout],
    }
    data["loss_masks"] = [_loss_mask(s, row, arrays) for row, s in enumerate(rollout)]
    data["rollout_mask_sums"] = _rollout_mask_sums(data["rollout_ids"], data["loss_masks"])

    # The first sample decides which optional keys exist (miles' rule), except weight_versions: any sample.
    first = rollout[0]
    if "raw_reward" in first.metadata:
        data["raw_reward"] = _from_metadata(rollout, "raw_reward")  # a rollout buffer's own raw reward
    if "round_number" in first.metadata:
        data["round_number"] = _from_metadata(rollout, "round_number")
    if first.rollout_log_probs is not None:
        data["rollout_log_probs"] = [_row(s.rollout_log_probs, arrays) for s in rollout]
    if first.rollout_routed_experts is not None:
        data["rollout_routed_experts"] = [_shaped(s.rollout_routed_experts, arrays) for s in rollout]
    if first.rollout_indexer_topk is not None:
        data["rollout_indexer_topk"] = [_shaped(s.rollout_indexer_topk, arrays) for s in rollout]
    if first.rollout_sampling_mask_ids is not None:
        ids, offsets = _sampling_masks(rollout, arrays)
        data["rollout_sampling_mask_ids"], data["rollout_sampling_mask_offsets"] = ids, offsets
    if first.train_metadata is not None:
        data["metadata"] = [s.train_metadata for s in rollout]
    if any(s.weight_versions for s in rollout):
        data["weight_versions"] = [list(s.weight_versions) for s in rollout]
    if any(s.weight_version_offsets is not None for s in rollout):  # None: the whole response, as before
        data["weight_version_offsets"] = [None if s.weight_version_offsets is None
                                          else s.weight_version_offsets.tolist() for s in rollout]
    if first.teacher_log_probs is not None:
        data["teacher_log_probs"] = [_row(s.teacher_log_probs, arrays) for s in rollout]
    if prompt_group_sizes is not None:
        sizes = [operator.index(size) for size in prompt_group_sizes]
        if sum(sizes) != len(samples) or any(size < 0 for size in sizes):
            raise ValueError(f"prompt group sizes {sizes} do not split a batch of {len(samples)} samples")
        data["prompt_group_sizes"] = sizes
    if first.opd_reverse_kl is not None:
        data["opd_reverse_kl"] = [_row(s.opd_reverse_kl, arrays) for s in rollout]
    return data


def dp_rows(total_lengths: Sequence[int], dp_size: int, rank: int, *, balance_data: bool = False
            ) -> range | list[int]:
    """The rows of the batch `split_by_dp` gives data-parallel rank `rank`, from the rows' total lengths."""
    if balance_data:
        return balanced_partitions(list(total_lengths), dp_size)[rank]
    return range(rank, len(total_lengths), dp_size)


def shard_of_rows(outline: dict[str, Any], rows: dict[str, Any] | None, partition: range | list[int]
                  ) -> dict[str, Any]:
    """The `split_by_dp` shard of the rows `partition`, built without the other rows' payloads: `outline` is
    `train_data` of the whole batch from samples that carry only lengths, loss-mask counts, rollout ids and
    rewards (whole-batch keys and `rollout_mask_sums` are computed over every row), `rows` is `train_data`
    of this shard's own rows, in `partition` order (None: no rows)."""
    lengths = [len(tokens) for tokens in outline["tokens"]]
    shard: dict[str, Any] = {"partition": partition}
    for key in PER_SAMPLE_KEYS:
        if key == "rollout_mask_sums":
            shard[key] = [outline[key][row] for row in partition]
        elif rows is not None and key in rows:
            shard[key] = rows[key]
        elif rows is None and key in outline:
            shard[key] = []
    for key in WHOLE_BATCH_KEYS:
        if key == "total_lengths":
            shard[key] = lengths
        elif key in outline:
            shard[key] = outline[key]
    return shard


def split_by_dp(data: dict[str, Any], dp_size: int, *, balance_data: bool = False) -> list[dict[str, Any]]:
    """One `rollout_data` shard per data-parallel rank, as miles' `split_train_data_by_dp_raw`.

    Rank i gets rows `range(i, n, dp_size)`, or with `balance_data` the i-th equal-size Karmarkar–Karp
    partition of the total lengths (`rollout_stream.core.balance`). Each shard holds `partition`, its rows of
    the per-sample keys, and the whole-batch keys (`raw_reward`, `total_lengths`, `prompt_group_sizes`).
    """
    if isinstance(dp_size, bool) or not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"dp_size must be an integer >= 1; got {dp_size!r}")
    if "adapter_slots" in data:
        raise ValueError("multi-LoRA adapter batches are not supported (docs/miles.md)")
    data = {**data, "total_lengths": [len(tokens) for tokens in data["tokens"]]}
    count = len(data["total_lengths"])
    partitions: list[range] | list[list[int]]
    if balance_data:
        partitions = balanced_partitions(data["total_lengths"], dp_size)
    else:
        partitions = [range(rank, count, dp_size) for rank in range(dp_size)]

    shards = []
    for partition in partitions:
        shard: dict[str, Any] = {"partition": partition}
        for key in PER_SAMPLE_KEYS:
            if key in data:
                column = data[key]
                shard[key] = [column[row] for row in partition]
        for key in WHOLE_BATCH_KEYS:
            if key in data:
                shard[key] = data[key]
        shards.append(shard)
    return shards


def trainer_shard(shard: dict[str, Any]) -> dict[str, Any]:
    """A shard as a miles trainer rank uses it (`process_rollout_data_shard`): `partition` removed and
    `total_lengths` narrowed from the whole batch to this shard's rows, in its row order."""
    partition = shard["partition"]
    finished = {key: value for key, value in shard.items() if key != "partition"}
    finished["total_lengths"] = [shard["total_lengths"][row] for row in partition]
    return finished
