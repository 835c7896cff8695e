"""TRL 1.16's async GRPO trainer on the stage's data: its real RolloutQueueDataset, FixedCountBatcher and
DataCollatorForRollout carry the stage's processed rewards into the packed `advantages` bit for bit, from
train samples in memory and through the real stage (producer → worker → reader → StageRolloutWorker)."""

from __future__ import annotations

import os
import queue
import random
from collections import defaultdict

import pytest
import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl", reason="the [trl] extra")
from accelerate import PartialState  # noqa: E402
from trl.experimental.async_grpo.async_grpo_trainer import (  # noqa: E402
    DataCollatorForRollout,
    FixedCountBatcher,
    RolloutQueueDataset,
)

from rollout_stream.config import WorkerConfig  # noqa: E402
from rollout_stream.integrations.trl import StageRolloutWorker, completion_samples, rollout_sample  # noqa: E402
from rollout_stream.producer import RolloutProducer  # noqa: E402
from rollout_stream.reader import TrainDataReader  # noqa: E402
from tests.stream.helpers import new_topics, running_worker, wait_until  # noqa: E402
from tests.stream.integrations.groups import (  # noqa: E402
    committed_batch,
    expected_token_versions,
    make_groups,
    spanned,
    tokens_key,
    train_samples,
)


def collated_advantages(buffer: queue.Queue, count: int, health=lambda s: None) -> dict[tuple[int, ...], set]:
    """Run TRL's dataset → batcher → collator over `count` queued samples: each sample's (tokens) packed
    advantages, as float32 bit patterns."""
    PartialState(cpu=True)  # TRL logs through accelerate's logger when a sample took over 1 s to come
    dataset = RolloutQueueDataset(buffer, model_version_fn=lambda: 1, check_health_fn=health,
                                  stale_after_s=60, metrics=defaultdict(list), max_staleness=3,
                                  poll_interval_s=0.2)
    rows = next(iter(FixedCountBatcher(dataset, num_processes=1, microbatch_size=count)))
    batch = DataCollatorForRollout(pad_token_id=0).torch_call([rows])
    (row,) = rows
    found: dict[tuple[int, ...], set] = defaultdict(set)
    bits = batch["advantages"][0].view(torch.int32).tolist()  # one row: one DP rank, no inter-rank padding
    for seg, adv in zip(batch["segment_id"][0].tolist(), bits, strict=True):
        found[tokens_key(row.samples[seg]["input_ids"])].add(adv)
    return found


def expected_bits(groups) -> dict[tuple[int, ...], int]:
    return {tokens_key(s.tokens): torch.tensor(r, dtype=torch.float32).view(torch.int32).item()
            for g in groups for s, r in zip(g.samples, g.rewards, strict=True) if s.loss_mask is not None}


def test_the_collated_advantages_are_the_stages_rewards_bit_for_bit():
    groups = make_groups(random.Random(5), 12, max_siblings=3)
    buffer: queue.Queue = queue.Queue()
    for gid, group in enumerate(groups):
        for train in train_samples(group):
            buffer.put(rollout_sample(train, group_id=gid, model_version=1))
    count = buffer.qsize()
    found = collated_advantages(buffer, count)
    expected = expected_bits(groups)
    # every sample that trains a token is there, each with one advantage: its reference reward, bit for bit
    trained = {tokens_key(s.tokens) for g in groups for s in g.samples if sum(s.loss_mask)}  # type: ignore[arg-type]
    assert set(found) == trained and len(trained) == count
    assert all(found[k] == {expected[k]} for k in trained)
    assert min(r for g in groups for r in g.rewards) < 0 < max(r for g in groups for r in g.rewards)


@pytest.mark.any_client
@pytest.mark.kafka(timeout=120)
def test_trls_async_collator_trains_on_the_rewards_the_stage_published(kafka_bootstrap, unique_group_id):
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="trl")
    groups = make_groups(random.Random(8), 6, max_siblings=1, run_id="trl")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"w-{topics.input}",
                          group_timeout_s=5.0, commit_interval_s=0.2)
    with running_worker(config), RolloutProducer(kafka_bootstrap, topics.input) as producer:
        for g in groups:
            producer.send_group(g.samples)
        producer.flush(30)
        reader = TrainDataReader(kafka_bootstrap, topics.output, unique_group_id, groups_per_batch=2,
                                 start="earliest", partition_idle_ms=200)
        worker = StageRolloutWorker(reader, queue_maxsize=8, poll_s=0.2)
        worker.start()
        try:
            count = sum(len(g.samples) for g in groups)
            found = collated_advantages(worker.rollout_buffer, count, health=worker.check_health)
            worker.check_health(30)
            expected = expected_bits(groups)
            assert set(found) == set(expected)
            assert all(found[k] == {expected[k]} for k in expected)
            # two optimizer steps later everything taken before the first one is committed
            worker.update_model_version(1)
            worker.update_model_version(2)
            wait_until(lambda: committed_batch(kafka_bootstrap, topics.output, unique_group_id, 2) == 2, 20,
                       "the reader's commit of the third batch")
        finally:
            worker.stop()


def test_each_completion_token_carries_the_version_that_generated_it_through_trls_collator():
    """Partial rollouts (a weight update mid-generation): the sample TRL gets is its `RolloutSample`, with
    the version of each token beside `input_ids`; TRL's collator takes it as any other."""
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    groups = make_groups(random.Random(9), 6)
    buffer: queue.Queue = queue.Queue()
    count = 0
    for g in groups:
        for n, train in enumerate(train_samples(g)):
            r = train.sample.response_length
            versions, offsets = ([4, 7], [0, r // 2]) if n % 2 == 0 and r >= 2 else ([5], None)
            item = rollout_sample(spanned(train, versions, offsets), group_id=0, model_version=min(versions))
            assert isinstance(item, RolloutSample) and item.model_version == min(versions)
            assert item.token_versions is not None
            assert item.token_versions.tolist() == expected_token_versions(train, versions, offsets)
            assert item.token_versions.shape == item.input_ids.shape == item.completion_mask.shape
            buffer.put(item)
            count += 1
    found = collated_advantages(buffer, count)
    assert {k: v for k, v in found.items() if v} and all(len(v) == 1 for v in found.values())
    assert {k: next(iter(v)) for k, v in found.items()} == {
        k: v for k, v in expected_bits(groups).items() if k in found}


def test_completion_samples_make_one_prompt_group():
    samples = completion_samples([1, 2], [[3, 4], [5]], [1.0, 0.0], group_index=4, run_id="x",
                                 log_probs=[[-0.5, -0.25], [-1.0]], weight_version=3)
    assert [s.rollout_id for s in samples] == [8, 9]
    assert [list(s.tokens) for s in samples] == [[1, 2, 3, 4], [1, 2, 5]]  # type: ignore[arg-type]
    assert [s.response_length for s in samples] == [2, 1] and {s.group_size for s in samples} == {2}
    assert samples[0].weight_versions == ["3"]
    with pytest.raises(ValueError):
        completion_samples([1], [[2]], [1.0, 2.0], group_index=0)
