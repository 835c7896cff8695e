"""miles' fully-async data buffer on the stage, driven by the calls miles' `FullyAsyncRolloutFn` makes
(radixark/miles at 31f1ca9, `miles/rollout/fully_async_rollout.py`; quoted where the test follows it).
miles is not on PyPI: its `Sample` is the transcription of tests/core/miles_reference.py, its reward step
that of tests/core/reference_impl.py."""

from __future__ import annotations

import asyncio
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from rollout_stream.config import WorkerConfig
from rollout_stream.integrations.miles import stage_data_buffer
from tests.core.miles_reference import MilesSample as TranscribedSample
from tests.core.reference_impl import post_process_rewards as reference_rewards
from tests.stream.helpers import new_topics, running_worker, wait_until
from tests.stream.integrations.groups import committed_batch


@dataclass
class MilesSample(TranscribedSample):
    """The transcription plus `reset_for_retry` (miles/utils/types.py at 31f1ca9, the fields it has)."""

    def reset_for_retry(self) -> None:
        self.tokens, self.response, self.response_length, self.reward = [], "", 0, None
        self.loss_mask, self.weight_versions, self.rollout_log_probs = None, [], None
        self.status = MilesSample.Status.ABORTED  # `self.status = Sample.Status.ABORTED`
        self.remove_sample, self.train_metadata = False, None


@dataclass(frozen=True)
class DataBufferConstructorInput:  # miles/rollout/fully_async_data_buffer.py at 31f1ca9
    args: Namespace
    unused_handler_fn: Callable[[list[Any]], None]


@dataclass
class DataBufferInput:  # miles/rollout/fully_async_data_buffer.py at 31f1ca9
    prompt_group: list[Any]
    group: list[Any]


@dataclass
class ListDataSource:
    """What `_recycle` calls on the data source: add_samples(list of prompt groups)."""

    added: list[list[Any]] = field(default_factory=list)

    def add_samples(self, samples: list[list[Any]]) -> None:
        self.added += samples


def first_sample(group: list[Any]) -> Any:  # fully_async_data_buffer.first_sample
    return group[0][0] if isinstance(group[0], list) else group[0]


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
