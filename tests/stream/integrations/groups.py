"""Prompt groups for the framework tests: the stage's samples, the reference's rewards for them, and their
train samples as the worker publishes them (without a broker)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from rollout_stream.codec import Array, Sample, TrainSample
from rollout_stream.core import RewardConfig, post_process_rewards


@dataclass
class Group:
    key: str
    samples: list[Sample]  # rollouts in order, a rollout's siblings together
    rewards: list[float]  # the reference's processed reward of each sample (bit for bit the stage's)


def make_groups(rng: random.Random, n: int, *, rollouts: tuple[int, int] = (2, 6), max_siblings: int = 1,
                run_id: str = "run", base: int = 0) -> list[Group]:
    """`n` prompt groups of rollouts..rollouts[1] rollouts, each of 1..max_siblings samples sharing its raw
    reward (a random float); every sample's tokens are distinct from every other's (tests find them by it)."""
    groups = []
    for g in range(base, base + n):
        count = rng.randint(*rollouts)
        shape = [(r, rng.randint(1, max_siblings)) for r in range(count)]
        samples = []
        for r, nsib in shape:
            reward = rng.choice([0.0, 1.0, rng.random(), rng.uniform(-3, 3)])
            for sib in range(nsib):
                serial = len(samples) + 1000 * g
                prompt = [7, g % 50 + 10, 1]
                response = [serial % 97 + 100, serial // 97 + 300, sib + 2, r + 3]
                samples.append(Sample(
                    group_index=g, index=g * 100 + r, rollout_id=g * 100 + r, prompt=f"p{g}",
                    response=f"r{r}.{sib}", tokens=Array(np.asarray(prompt + response, dtype="<i4")),
                    response_length=len(response), reward=reward,
                    loss_mask=Array(np.asarray([1] * (len(response) - 1) + [sib % 2 == 0], dtype="u1")),
                    rollout_log_probs=Array(np.asarray([-0.25 * (i + 1) - r for i in range(len(response))],
                                                       dtype="<f4")),
                    weight_versions=["1"], group_size=count, sibling_count=nsib, sibling_index=sib,
                    run_id=run_id))
        _, rewards = post_process_rewards(samples, RewardConfig(advantage_estimator="grpo"),
                                          prompt_group_sizes=[len(samples)])
        groups.append(Group(f"{run_id}/{g}", samples, rewards))
    return groups


def train_samples(group: Group) -> list[TrainSample]:
    """The group's train records as the worker writes them (its statistics are not checked here)."""
    rollouts = len({s.rollout_id for s in group.samples})
    return [TrainSample(
        sample=s, raw_reward=float(s.reward), reward=reward, group_key=group.key,  # type: ignore[arg-type]
        group_rollout_count=rollouts, group_sample_count=len(group.samples), group_mean=0.0, group_std=0.0,
        zero_variance=False, advantage_estimator="grpo", rewards_normalization=True,
        grpo_std_normalization=True, reward_key=None, source_topic="rollouts", source_partition=0,
        source_offset=i)
        for i, (s, reward) in enumerate(zip(group.samples, group.rewards, strict=True))]


def tokens_key(tokens: object) -> tuple[int, ...]:
    return tuple(int(t) for t in np.asarray(tokens).tolist())


def committed_batch(bootstrap: str, topic: str, group_id: str, partitions: int) -> int | None:
    """The highest batch index rank 0 of `group_id` committed on `topic` (None: no commit yet)."""
    from kafka import KafkaConsumer, TopicPartition

    from rollout_stream.names import rank_group_id

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=rank_group_id(group_id, 0),
                             enable_auto_commit=False)
    try:
        metas = [consumer.committed(TopicPartition(topic, p), metadata=True) for p in range(partitions)]
    finally:
        consumer.close()
    batches = [int(m.metadata.split("batch=")[1].split()[0]) for m in metas if m is not None and m.metadata]
    return max(batches) if batches else None


def spanned(train: TrainSample, versions: list[int], offsets: list[int] | None) -> TrainSample:
    """`train` generated under `versions` (a partial rollout: each starting at its response offset)."""
    import msgspec

    sample = msgspec.structs.replace(train.sample, weight_versions=[str(v) for v in versions],
                                     weight_version_offsets=None if offsets is None else Array(offsets))
    return msgspec.structs.replace(train, sample=sample)


def expected_token_versions(train: TrainSample, versions: list[int], offsets: list[int] | None) -> list[int]:
    """Aligned with the whole sequence: -1 on the prompt, then each response token's version."""
    r = train.sample.response_length
    n = len(train.sample.tokens) if train.sample.tokens is not None else 0
    starts = [*(offsets or [0]), r]
    spans = [v for i, v in enumerate(versions if offsets else [min(versions)])
             for _ in range(starts[i + 1] - starts[i])]
    return [-1] * (n - r) + spans
