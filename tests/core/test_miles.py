"""core/miles.py and core/balance.py against a plain transcription of miles (tests/core/miles_reference.py).

The property test takes a random miles batch through both paths: the reference builds `train_data` from
miles-like samples in-process; ours publishes them (`Sample.from_miles`, the wire, the stage's
`normalize_group`, `TrainSample` on the wire) and builds `train_data` from what a reader gets. Then both
are split across data-parallel ranks and finished per rank. Everything must be equal: same keys in the
same order, same Python types, floats bit for bit.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import random
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_stream.codec import (
    Sample,
    TrainSample,
    decode_sample,
    decode_train_sample,
    encode_sample,
    encode_train_sample,
)
from rollout_stream.core import RewardConfig, normalize_group
from rollout_stream.core.balance import balanced_partitions
from rollout_stream.core.config import ADVANTAGE_ESTIMATORS
from rollout_stream.core.miles import split_by_dp, train_data, trainer_shard
from rollout_stream.core.rewards import GroupRewards


def _load(name: str) -> Any:
    module_name = f"rollout_stream_tests_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, Path(__file__).resolve().parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


ref = _load("miles_reference")
MilesSample = ref.MilesSample

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- exact comparison


def assert_same(ours: Any, theirs: Any, path: str = "$") -> None:
    """Equal values of equal Python types; floats by their bits, ndarrays by dtype, shape and values."""
    if isinstance(theirs, np.ndarray):
        assert isinstance(ours, np.ndarray), f"{path}: {type(ours).__name__}, miles has an ndarray"
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), path
        assert np.array_equal(ours, theirs), path
        return
    assert type(ours) is type(theirs), f"{path}: {type(ours).__name__}, miles has {type(theirs).__name__}"
    if isinstance(theirs, float):
        assert struct.pack("<d", ours) == struct.pack("<d", theirs), f"{path}: {ours!r} != {theirs!r}"
    elif isinstance(theirs, dict):
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != miles' {list(theirs)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs), f"{path}: {len(ours)} items, miles has {len(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


# ---------------------------------------------------------------- random miles batches

FEATURES = ("rollout_log_probs", "teacher_log_probs", "opd_reverse_kl", "rollout_routed_experts",
            "rollout_indexer_topk", "train_metadata")
STATUSES = list(MilesSample.Status)
rewards = st.floats(-8.0, 8.0, allow_nan=False, width=32) | st.sampled_from([0.0, 1.0, -1.0])
log_probs = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)


@dataclass
class Batch:
    samples: list[Any]  # MilesSample, in batch order
    streaming: list[dict[str, Any]]  # group_size, sibling_count, sibling_index per sample
    cfg: RewardConfig
    prompt_group_sizes: list[int] | None


@st.composite
def miles_batches(draw: st.DrawFn) -> Batch:
    reward_key = draw(st.sampled_from([None, "acc"]))
    cfg = RewardConfig(
        advantage_estimator=draw(st.sampled_from(ADVANTAGE_ESTIMATORS)),
        rewards_normalization=draw(st.booleans()),
        grpo_std_normalization=draw(st.booleans()),
        reward_key=reward_key,
    )
    # How rollouts are named: unique over the batch, numbered per group (colliding across groups, which
    # merges their rollout_mask_sums in miles too), by index only, or strings.
    naming = draw(st.sampled_from(["batch", "group", "index", "text"]))
    # Per optional feature: absent, on every sample, or on some (miles' first sample decides).
    modes = {name: draw(st.sampled_from(["none", "all", "some"])) for name in FEATURES}
    override_modes = {
        name: draw(st.sampled_from(["none", "all", "later"])) for name in ("raw_reward", "round_number")
    }
    layers, topk = draw(st.integers(1, 2)), draw(st.integers(1, 2))

    samples: list[Any] = []
    streaming: list[dict[str, Any]] = []
    group_sizes: list[int] = []
    next_rollout = next_index = 0
    for group_index in range(draw(st.integers(1, 4))):
        n_rollouts = draw(st.integers(1, 4))
        group_sizes.append(0)
        for r in range(n_rollouts):
            reward = draw(rewards)
            siblings = 1 if naming == "index" else draw(st.integers(1, 3))
            names = {"batch": next_rollout, "group": r, "index": None, "text": f"r{next_rollout}"}
            rollout_id = names[naming]
            next_rollout += 1
            for sibling in range(siblings):
                response_length = draw(st.integers(0, 5))
                tokens = draw(st.lists(st.integers(0, 151_935), min_size=response_length + 1,
                                       max_size=response_length + 3))
                mask = draw(st.none() | st.lists(st.sampled_from([0, 1]), min_size=response_length,
                                                 max_size=response_length))
                row = len(samples)

                def present(name: str) -> bool:
                    mode = modes[name]
                    return mode == "all" or (mode == "some" and draw(st.booleans()))

                def log_prob_row(length: int = response_length) -> list[float]:
                    return draw(st.lists(log_probs, min_size=length, max_size=length))

                def replay(positions: int = len(tokens) - 1) -> np.ndarray:
                    size = positions * layers * topk
                    values = draw(st.lists(st.integers(0, 255), min_size=size, max_size=size))
                    return np.array(values, dtype=np.int32).reshape(positions, layers, topk)

                metadata: dict[str, Any] = {"turn": sibling}
                for name, mode in override_modes.items():
                    if mode == "all" or (mode == "later" and row > 0):
                        metadata[name] = draw(rewards) if name == "raw_reward" else draw(st.integers(0, 9))
                sample = MilesSample(
                    group_index=group_index,
                    index=next_index,
                    rollout_id=rollout_id,
                    prompt="p",
                    tokens=tokens,
                    response_length=response_length,
                    reward={"acc": reward, "len": draw(rewards)} if reward_key else reward,
                    loss_mask=mask,
                    weight_versions=draw(st.lists(st.sampled_from(["3", "4", "v5"]), max_size=2)),
                    rollout_log_probs=log_prob_row() if present("rollout_log_probs") else None,
                    teacher_log_probs=log_prob_row() if present("teacher_log_probs") else None,
                    opd_reverse_kl=log_prob_row() if present("opd_reverse_kl") else None,
                    rollout_routed_experts=replay() if present("rollout_routed_experts") else None,
                    rollout_indexer_topk=replay() if present("rollout_indexer_topk") else None,
                    remove_sample=draw(st.booleans()),
                    status=draw(st.sampled_from(STATUSES)),
                    metadata=metadata,
                    train_metadata=(
                        {"loss": draw(st.sampled_from(["pg", "sft"]))} if present("train_metadata") else None
                    ),
                )
                samples.append(sample)
                streaming.append(
                    {"group_size": n_rollouts, "sibling_count": siblings, "sibling_index": sibling}
                )
                group_sizes[-1] += 1
                next_index += 1

    prompt_group_sizes = None
    if draw(st.booleans()):
        # Explicit sizes, as multi-prompt rollout functions record them; empty groups are skipped.
        prompt_group_sizes = []
        for size in group_sizes:
            prompt_group_sizes += [0] * draw(st.integers(0, 1)) + [size]
    else:
        # Rows of different groups interleaved: miles groups by group_index, wherever the rows are.
        order = draw(st.permutations(range(len(samples))))
        samples = [samples[i] for i in order]
        streaming = [streaming[i] for i in order]
    return Batch(samples, streaming, cfg, prompt_group_sizes)


# ---------------------------------------------------------------- the two paths


def published(batch: Batch) -> list[TrainSample]:
    """What a reader gets for the batch: samples through the wire, rewards as the stage computes them."""
    raws = [
        encode_sample(Sample.from_miles(m, run_id="run", **streaming))
        for m, streaming in zip(batch.samples, batch.streaming, strict=True)
    ]
    decoded = [decode_sample(raw) for raw in raws]
    rows_by_group: dict[int, list[int]] = {}
    for row, sample in enumerate(decoded):
        rows_by_group.setdefault(sample.group_index, []).append(row)  # type: ignore[arg-type]
    out: list[Any] = [None] * len(decoded)
    for group_index, rows in rows_by_group.items():
        result = normalize_group([decoded[row] for row in rows], batch.cfg, rows=rows)
        assert isinstance(result, GroupRewards)
        for position, row in enumerate(rows):
            ts = TrainSample(
                sample=decoded[row], raw_reward=result.raw[position], reward=result.rewards[position],
                group_key=f"run/{group_index}", group_rollout_count=result.rollout_count,
                group_sample_count=len(rows), group_mean=result.mean, group_std=result.std,
                zero_variance=result.zero_variance, advantage_estimator=batch.cfg.advantage_estimator,
                rewards_normalization=batch.cfg.rewards_normalization,
                grpo_std_normalization=batch.cfg.grpo_std_normalization, reward_key=batch.cfg.reward_key,
                source_topic="rollouts", source_partition=0, source_offset=row,
            )
            out[row] = decode_train_sample(encode_train_sample(ts, raw_sample=raws[row]))
    return out


def reference_train_data(batch: Batch) -> dict[str, Any]:
    metadata = {} if batch.prompt_group_sizes is None else {"prompt_group_sizes": batch.prompt_group_sizes}
    # miles fills in loss masks on its samples: give it copies.
    return ref.convert_samples_to_train_data(batch.cfg, copy.deepcopy(batch.samples), metadata)


def _overrides_missing(batch: Batch) -> bool:
    first = batch.samples[0].metadata
    return any(name in first and any(name not in s.metadata for s in batch.samples)
               for name in ("raw_reward", "round_number"))


@dataclass
class SplitArgs:
    balance_data: bool


# ---------------------------------------------------------------- properties


@PROPERTY_SETTINGS
@given(batch=miles_batches(), dp_size=st.integers(1, 8), balance=st.booleans())
def test_train_data_split_and_shards_equal_miles(batch: Batch, dp_size: int, balance: bool) -> None:
    samples = published(batch)
    if _overrides_missing(batch):
        with pytest.raises(KeyError):
            reference_train_data(batch)
        with pytest.raises(ValueError, match="metadata has no"):
            train_data(samples, prompt_group_sizes=batch.prompt_group_sizes)
        return
    theirs = reference_train_data(batch)
    ours = train_data(samples, prompt_group_sizes=batch.prompt_group_sizes)
    assert_same(ours, theirs)

    count = len(samples)
    if balance and (count % dp_size or count < dp_size):
        with pytest.raises(AssertionError):
            ref.split_train_data_by_dp_raw(SplitArgs(True), dict(theirs), dp_size=dp_size)
        with pytest.raises(ValueError, match="balanced partitions"):
            split_by_dp(ours, dp_size, balance_data=True)
        dp_size = 1  # still check the shards, with the one size every batch splits into
    keys_before = list(ours)
    their_shards = ref.split_train_data_by_dp_raw(SplitArgs(balance), dict(theirs), dp_size=dp_size)
    our_shards = split_by_dp(ours, dp_size, balance_data=balance)
    assert list(ours) == keys_before, "split_by_dp must not add total_lengths to its input"
    assert_same(our_shards, their_shards)
    assert sorted(row for shard in our_shards for row in shard["partition"]) == list(range(count))

    for ours_shard, theirs_shard in zip(our_shards, their_shards, strict=True):
        before = dict(ours_shard)
        assert_same(trainer_shard(ours_shard), ref.process_rollout_data_shard(dict(theirs_shard)))
        assert ours_shard == before, "trainer_shard must not modify the shard"


@PROPERTY_SETTINGS
@given(batch=miles_batches())
def test_arrays_layout_holds_the_same_rows(batch: Batch) -> None:
    if _overrides_missing(batch):
        return
    samples = published(batch)
    as_lists = train_data(samples, prompt_group_sizes=batch.prompt_group_sizes)
    as_arrays = train_data(samples, prompt_group_sizes=batch.prompt_group_sizes, arrays=True)
    assert list(as_arrays) == list(as_lists)
    for key, column in as_arrays.items():
        if key in ("tokens", "loss_masks", "rollout_log_probs", "teacher_log_probs", "opd_reverse_kl"):
            column = [None if row is None else row.tolist() for row in column]
        assert_same(column, as_lists[key], f"$.{key}")


# ---------------------------------------------------------------- balanced partitions alone

lengths_lists = st.integers(1, 8).flatmap(
    lambda k: st.tuples(
        st.just(k),
        st.integers(1, 6).flatmap(lambda m: st.lists(st.integers(0, 40) | st.integers(0, 3),
                                                     min_size=k * m, max_size=k * m)),
    )
)


@settings(max_examples=300, deadline=None)
@given(case=lengths_lists)
def test_balanced_partitions_equal_miles(case: tuple[int, list[int]]) -> None:
    k, lengths = case
    assert balanced_partitions(lengths, k) == ref.get_seqlen_balanced_partitions(lengths, k, equal_size=True)


def test_balanced_partitions_of_a_large_batch_equal_miles() -> None:
    rng = random.Random(16)
    for k in (2, 4, 8):
        lengths = [rng.choice([rng.randrange(1, 33_000), 4096, 128]) for _ in range(64 * k)]
        expected = ref.get_seqlen_balanced_partitions(lengths, k, equal_size=True)
        assert balanced_partitions(lengths, k) == expected


@pytest.mark.parametrize(("lengths", "k"), [([1, 2, 3], 2), ([1], 2), ([], 1), ([1, 2], 0)])
def test_balanced_partitions_refuses_what_miles_asserts(lengths: list[int], k: int) -> None:
    with pytest.raises(ValueError, match="balanced partitions"):
        balanced_partitions(lengths, k)


# ---------------------------------------------------------------- edges


def _published_one(**fields: Any) -> TrainSample:
    sample = Sample(group_index=0, index=0, tokens=[1, 2, 3], response_length=2, reward=1.0, **fields)
    return TrainSample(
        sample=sample, raw_reward=1.0, reward=0.0, group_key="0", group_rollout_count=1, group_sample_count=1,
        group_mean=1.0, group_std=0.0, zero_variance=True, advantage_estimator="grpo",
        rewards_normalization=True, grpo_std_normalization=True, reward_key=None, source_topic="t",
        source_partition=0, source_offset=0,
    )


def test_train_data_refuses_an_empty_batch_and_a_wrong_mask_length() -> None:
    with pytest.raises(ValueError, match="at least one sample"):
        train_data([])
    with pytest.raises(ValueError, match="row 0: loss mask length 3 != response length 2"):
        train_data([_published_one(loss_mask=[1, 1, 1])])


def test_train_data_checks_prompt_group_sizes() -> None:
    with pytest.raises(ValueError, match="do not split a batch of 1"):
        train_data([_published_one()], prompt_group_sizes=[2])
    assert train_data([_published_one()], prompt_group_sizes=[0, 1])["prompt_group_sizes"] == [0, 1]


def test_bool_loss_masks_become_ints_and_arrays_are_views() -> None:
    ts = _published_one(loss_mask=np.array([True, False]))
    assert_same(train_data([ts])["loss_masks"], [[1, 0]])
    assert_same(train_data([ts])["rollout_mask_sums"], [1])
    assert train_data([ts], arrays=True)["tokens"][0] is ts.sample.tokens.numpy()


def test_version_spans_travel_as_a_key_miles_ignores_sliced_with_their_rows() -> None:
    """A partial rollout's `weight_version_offsets` ride beside `weight_versions`, one entry per row (None:
    the whole response under the listed versions), and each dp shard gets its own rows'."""
    spanned = _published_one(weight_versions=["3", "5"], weight_version_offsets=[0, 1])
    whole = _published_one(weight_versions=["4"])
    assert "weight_version_offsets" not in train_data([whole])  # nothing new without spans
    data = train_data([spanned, whole])
    assert data["weight_version_offsets"] == [[0, 1], None]
    shards = split_by_dp(data, 2)
    by_row = {row: shard["weight_version_offsets"][i] for shard in shards
              for i, row in enumerate(shard["partition"])}
    assert by_row == {0: [0, 1], 1: None}


def test_sample_without_tokens_has_an_empty_token_list() -> None:
    ts = _published_one()
    ts.sample.tokens = None
    ts.sample.response_length = 0
    data = train_data([ts])
    assert_same(data["tokens"], [[]])
    assert_same(split_by_dp(data, 1)[0]["total_lengths"], [0])


def test_split_by_dp_refuses_bad_sizes_and_adapters() -> None:
    data = train_data([_published_one()])
    for bad in (0, -1, True, 1.0):
        with pytest.raises(ValueError, match="dp_size"):
            split_by_dp(data, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="adapter"):
        split_by_dp({**data, "adapter_slots": [0]}, 1)


def test_more_ranks_than_samples_leaves_ranks_empty_when_strided() -> None:
    shards = split_by_dp(train_data([_published_one()]), 3)
    assert [list(s["partition"]) for s in shards] == [[0], [], []]
    assert trainer_shard(shards[2])["tokens"] == [] and trainer_shard(shards[2])["total_lengths"] == []


def test_an_old_record_still_builds_miles_train_data() -> None:
    """A train sample written before the miles fields existed (tests/data) gives miles' keys, no new ones."""
    fixture = Path(__file__).resolve().parents[1] / "data" / "wire_records_before_miles_fields.json"
    doc = json.loads(fixture.read_text())
    (data,) = [bytes.fromhex(r["hex"]) for r in doc["records"] if r["name"] == "train_sample_embedding_raw"]
    ts = decode_train_sample(data)
    rollout_data = train_data([ts])
    assert list(rollout_data) == [
        "tokens", "response_lengths", "rewards", "raw_reward", "truncated", "sample_indices", "rollout_ids",
        "loss_masks", "rollout_mask_sums", "round_number", "rollout_log_probs", "weight_versions",
    ]
    assert rollout_data["raw_reward"] == [0.5]  # the metadata override
    assert rollout_data["truncated"] == [1] and rollout_data["rollout_mask_sums"] == [3]
    float32_row = np.array([-0.1, -0.2, -0.3, -0.4], dtype=np.float32).tolist()
    assert_same(rollout_data["rollout_log_probs"], [float32_row])
    shard = trainer_shard(split_by_dp(rollout_data, 1)[0])
    assert shard["total_lengths"] == [12] and shard["rewards"] == [ts.reward]
