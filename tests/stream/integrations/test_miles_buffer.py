"""miles' fully-async data buffer on the stage, driven by the calls miles' `FullyAsyncRolloutFn` makes
(radixark/miles at 31f1ca9, `miles/rollout/fully_async_rollout.py`; quoted where the test follows it).
miles is not on PyPI: its `Sample` is the transcription of tests/core/miles_reference.py, its reward step
that of tests/core/reference_impl.py; the shape test also runs miles' own code where `miles` is importable
(tests/stream/integrations/miles_rollout.py)."""

from __future__ import annotations

import asyncio
import copy
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from rollout_stream.config import WorkerConfig
from rollout_stream.integrations.miles import stage_data_buffer
from tests.core.reference_impl import post_process_rewards as reference_rewards
from tests.stream.helpers import new_topics, running_worker, wait_until
from tests.stream.integrations.groups import committed_batch
from tests.stream.integrations.miles_rollout import (
    TRANSCRIBED,
    DataBufferConstructorInput,
    DataBufferInput,
    Miles,
    MilesSample,
    first_sample,
    upstream,
)


@dataclass
class ListDataSource:
    """What `_recycle` calls on the data source: add_samples(list of prompt groups)."""

    added: list[list[Any]] = field(default_factory=list)

    def add_samples(self, samples: list[list[Any]]) -> None:
        self.added += samples


def rollout(g: int, r: int, reward: float, version: str, *, siblings: int = 1,
            status: Any = MilesSample.Status.COMPLETED) -> Any:
    samples = [MilesSample(group_index=g, index=g * 10 + r, rollout_id=g * 10 + r, prompt=f"prompt {g}",
                           tokens=[1, g, r, s, 9], response=f"r{r}", response_length=2, label=str(g),
                           reward=reward, loss_mask=[1, 1], weight_versions=[version],
                           rollout_log_probs=[-0.5, -0.25], status=status) for s in range(siblings)]
    return samples[0] if siblings == 1 else samples


def finished(g: int, rewards: list[float], version: str = "5", **kw: Any) -> DataBufferInput:
    group = [rollout(g, r, reward, version, siblings=2 if g == 3 and r == 1 else 1, **kw)
             for r, reward in enumerate(rewards)]
    prompts = [MilesSample(group_index=g, index=g * 10 + r, prompt=f"prompt {g}")
               for r in range(len(rewards))]
    return DataBufferInput(prompt_group=prompts, group=group)


def bits(x: float) -> int:
    return int(torch.tensor(x, dtype=torch.float32).view(torch.int32).item())


@pytest.mark.any_client
@pytest.mark.kafka(timeout=120)
def test_miles_fully_async_rollout_trains_through_the_stage(kafka_bootstrap, unique_group_id):
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="miles")
    args = Namespace(async_unused_samples_handler="retry", rollout_batch_size=2, n_samples_per_prompt=4,
                     max_weight_staleness=1, rollout_global_dataset=True, advantage_estimator="grpo",
                     rewards_normalization=True, grpo_std_normalization=True, reward_key=None)
    data_source = ListDataSource()

    def recycle(prompt_group: list[Any]) -> None:  # FullyAsyncRolloutFn._recycle
        for sample in prompt_group:
            sample.reset_for_retry()
        data_source.add_samples([prompt_group])

    buffer_cls = stage_data_buffer(kafka_bootstrap, input_topic=topics.input, output_topic=topics.output,
                                   group_id=unique_group_id, run_id="miles", sample_type=MilesSample,
                                   start="earliest", partition_idle_ms=200)
    published = [finished(0, [1.0, 0.0, 0.5, 0.25]), finished(1, [0.0, 0.0, 1.0, 1.0], version="2"),
                 finished(2, [0.2, 0.4, 0.6, 0.8], status=MilesSample.Status.ABORTED),
                 finished(3, [1.0, 3.0, -1.0, 0.0]), finished(4, [0.1, 0.9, 0.3, 0.3]),
                 finished(5, [2.0, 1.0, 0.0, 1.0])]

    async def run(output: Any) -> tuple[list[list[Any]], list[dict[str, float]]]:
        for entry in published:  # _worker_loop: `await self._output.put(task.result())`
            await output.put(entry)
        steps, metrics = [], []
        for _ in range(2):  # _drain, once per rollout step
            data: list[Any] = []
            while len(data) < args.rollout_batch_size:
                entry = await output.get(current_version=5)  # _next_group(input.weight_version)
                assert len(entry.group) == args.n_samples_per_prompt
                data.append(entry.group)
            data.sort(key=lambda group: first_sample(group).index)
            steps.append(data)
            # `RolloutFnTrainOutput(samples=data, metrics=self._output.get_metrics())`
            metrics.append(output.get_metrics())
        metrics.append(output.get_metrics())  # the next step: the first one's groups are trained by now
        return steps, metrics

    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"w-{topics.input}",
                          group_timeout_s=5.0, commit_interval_s=0.2)
    with running_worker(config):
        # constructed as in FullyAsyncRolloutFn.__call__:
        # `buffer_cls(DataBufferConstructorInput(args=self.args, unused_handler_fn=self._handle_unused))`
        output = buffer_cls(DataBufferConstructorInput(args=args, unused_handler_fn=recycle))
        try:
            steps, metrics = asyncio.run(run(output))
            wait_until(lambda: committed_batch(kafka_bootstrap, topics.output, unique_group_id, 2)
                       is not None, 20, "the commit of the first step's groups")
        finally:
            output.close()

    # the aborted group never reached the stage, the stale one (version 2 at 5, bound 1) was not trained:
    # both went to the unused handler as prompts reset for retry, recycled into the data source
    assert sorted(g[0].group_index for g in data_source.added) == [1, 2]
    assert all(s.status is MilesSample.Status.ABORTED and s.reward is None
               for g in data_source.added for s in g)
    assert metrics[0]["rollout/fully_async/aborted_groups_filtered"] == 1.0
    assert sum(m["rollout/fully_async/stale_groups_filtered"] for m in metrics) == 1.0
    trained = [first_sample(g).group_index for step in steps for g in step]
    assert sorted(trained) == [0, 3, 4, 5]
    sent = {first_sample(e.group).group_index: e for e in published}
    for step in steps:
        for group in step:
            flat = [s for item in group for s in (item if isinstance(item, list) else [item])]
            original = [s for item in sent[flat[0].group_index].group
                        for s in (item if isinstance(item, list) else [item])]
            # the samples come back as published (siblings of a trajectory as one rollout's list) ...
            assert [(s.tokens, s.reward, s.loss_mask, s.rollout_log_probs) for s in flat] == \
                [(s.tokens, s.reward, s.loss_mask, s.rollout_log_probs) for s in original]
            assert [isinstance(item, list) for item in group] == \
                [isinstance(item, list) for item in sent[flat[0].group_index].group]
            # ... and miles' own reward step on them gives the stage's processed rewards bit for bit
            _, reference = reference_rewards(args, flat, [len(flat)])
            stage = [s.metadata["rollout_stream_reward"] for s in flat]
            assert [bits(float(r)) for r in reference] == [bits(r) for r in stage]


# Shapes a miles generate function returns per prompt: a `Sample` per rollout (an int here), or a list of
# samples per rollout (a list of its length), one sample or more (multi-turn, multi-agent).
SHAPES = {
    10: [[1], [2], [1], [2]],  # one-sample trajectories beside two-sample ones
    11: [[3], [1], [1], [2]],
    12: [[1], [1], [1], [1]],  # lists of one sample only
    13: [1, 1, 1, 1],  # plain samples
    14: [1, 1, 1, 1],
}
IMPLEMENTATIONS = [pytest.param(TRANSCRIBED, id="transcribed"),
                   pytest.param(upstream(), id="miles", marks=pytest.mark.skipif(
                       upstream() is None, reason="miles is not importable (not on PyPI)"))]


def shaped_group(miles: Miles, g: int, shape: list[Any]) -> DataBufferInput:
    """A finished group of `shape`: a trajectory's samples share its reward and rollout id (miles requires
    both of siblings); plain samples of group 13 have no rollout id, as miles' single-turn rollouts."""
    group: list[Any] = []
    for r, size in enumerate(shape):
        n = size[0] if isinstance(size, list) else 1
        samples = [miles.Sample(
            group_index=g, index=g * 10 + r, rollout_id=None if g == 13 else g * 10 + r, prompt=f"prompt {g}",
            tokens=[1, g, r, s, 9, 9][:4 + s % 3], response=f"r{r}.{s}", response_length=1 + s % 3,
            label=str(g), reward=float((g * 7 + r * 3) % 5) / 4, loss_mask=[1] * (1 + s % 3),
            weight_versions=["5"], rollout_log_probs=[-0.5 * (s + 1)] * (1 + s % 3),
            status=miles.Sample.Status.COMPLETED) for s in range(n)]
        group.append(samples if isinstance(size, list) else samples[0])
    prompts = [miles.Sample(group_index=g, index=g * 10 + r, prompt=f"prompt {g}") for r in range(len(shape))]
    return miles.DataBufferInput(prompt_group=prompts, group=group)


def shape_of(group: list[Any]) -> list[Any]:
    return [[len(item)] if isinstance(item, list) else 1 for item in group]


def fields(sample: Any) -> tuple[Any, ...]:
    metadata = {k: v for k, v in sample.metadata.items() if k != "rollout_stream_reward"}
    return (sample.group_index, sample.index, sample.rollout_id, sample.tokens, sample.response_length,
            sample.reward, sample.loss_mask, sample.rollout_log_probs, sample.weight_versions, metadata)


def train_data(miles: Miles, args: Namespace, batch: list[list[Any]]) -> dict[str, Any]:
    """What miles' RolloutManager makes of a step's groups: `postprocess_rollout_data` (flattening by the type
    of the first element), then `convert_samples_to_train_data` (reading each sample's reward)."""
    samples, metadata = miles.postprocess_rollout_data(args, copy.deepcopy(batch), None)
    return miles.convert_samples_to_train_data(args, samples, metadata)


@pytest.mark.parametrize("miles", IMPLEMENTATIONS)
@pytest.mark.any_client
@pytest.mark.kafka(timeout=120)
def test_get_returns_each_group_in_the_shape_put_gave_it(kafka_bootstrap, unique_group_id, miles):
    """Groups of mixed trajectory lengths come back from `get` as `put` received them (a one-sample
    trajectory stays a list), so miles flattens and converts them as it would have without the stage; the
    reshaped form (`[s, [a, b], s, [a, b]]`) is what miles' own code refuses."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="miles-shape")
    args = Namespace(async_unused_samples_handler="drop", rollout_batch_size=len(SHAPES),
                     n_samples_per_prompt=4, max_weight_staleness=1, rollout_global_dataset=True,
                     advantage_estimator="grpo", rewards_normalization=True, grpo_std_normalization=True,
                     reward_key=None, disable_rollout_trim_samples=False, global_batch_size=4,
                     use_dynamic_global_batch_size=False)
    put = {g: shaped_group(miles, g, shape) for g, shape in SHAPES.items()}
    buffer_cls = stage_data_buffer(kafka_bootstrap, input_topic=topics.input, output_topic=topics.output,
                                   group_id=unique_group_id, run_id="shape", sample_type=miles.Sample,
                                   start="earliest", partition_idle_ms=200)
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"w-{topics.input}",
                          group_timeout_s=5.0, commit_interval_s=0.2)

    async def run(output: Any) -> list[list[Any]]:
        for entry in put.values():
            await output.put(copy.deepcopy(entry))
        data = [(await output.get(current_version=5)).group for _ in put]
        data.sort(key=lambda group: miles.first_sample(group).index)  # _drain's order
        return data

    with running_worker(config):
        output = buffer_cls(miles.DataBufferConstructorInput(args=args, unused_handler_fn=lambda _: None))
        try:
            got = dict(zip(put, asyncio.run(run(output)), strict=True))
        finally:
            output.close()

    for g, group in got.items():
        assert shape_of(group) == shape_of(put[g].group) == SHAPES[g], g
        flat = [s for item in group for s in (item if isinstance(item, list) else [item])]
        sent = [s for item in put[g].group for s in (item if isinstance(item, list) else [item])]
        assert [fields(s) for s in flat] == [fields(s) for s in sent]
    # a step of list-shaped groups and one of plain ones (one generate function returns one kind): miles'
    # path gives the same train data for what came through the stage as for what was put
    for step in ([10, 11, 12], [13, 14]):
        assert train_data(miles, args, [got[g] for g in step]) == \
            train_data(miles, args, [put[g].group for g in step])
    # what `get` returned before: one-sample trajectories unwrapped, which miles cannot flatten
    reshaped = [[item[0] if isinstance(item, list) and len(item) == 1 else item for item in got[g]]
                for g in (10, 11)]
    assert shape_of(reshaped[0]) == [1, [2], 1, [2]]
    with pytest.raises(AttributeError, match="'list' object has no attribute"):
        train_data(miles, args, reshaped)
