"""verl 0.9.1 on the stage's data: its real `assemble_batch_from_rollout_samples` and `compute_advantage`
on the rows `rollout_stream.integrations.verl` builds, in memory and through the real stage. With the stage's
estimator verl trains on the stage's rewards bit for bit; with verl's own GRPO (on raw rewards) the two
agree on multi-row groups of one row per rollout and differ, as pinned here, on a group of one and on
sibling rows."""

from __future__ import annotations

import asyncio
import inspect
import random

import pytest
import torch

pytest.importorskip("verl", reason="the [verl] extra")
import ray  # noqa: E402
from verl.experimental.fully_async_policy.detach_utils import assemble_batch_from_rollout_samples  # noqa: E402
from verl.experimental.fully_async_policy.message_queue import MessageQueue  # noqa: E402
from verl.trainer.ppo.core_algos import AdvantageEstimator  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from rollout_stream.codec import Sample  # noqa: E402
from rollout_stream.config import WorkerConfig  # noqa: E402
from rollout_stream.core import RewardConfig, post_process_rewards  # noqa: E402
from rollout_stream.integrations.verl import STAGE_ESTIMATOR, rollout_sample  # noqa: E402
from rollout_stream.integrations.verl_queue import StageMessageQueue  # noqa: E402
from rollout_stream.producer import RolloutProducer  # noqa: E402
from rollout_stream.reader import TrainDataReader  # noqa: E402
from tests.stream.helpers import new_topics, running_worker  # noqa: E402
from tests.stream.integrations.groups import (  # noqa: E402
    Group,
    expected_token_versions,
    make_groups,
    spanned,
    tokens_key,
    train_samples,
)


def advantages(groups: list[Group], estimator: str, rewards: str) -> dict[tuple[int, ...], set[int]]:
    """Each sample's (by tokens) advantages on its trained response tokens, as float32 bit patterns, after
    verl's trainer path: pickled RolloutSamples → assemble → token_level_rewards = rm_scores → compute."""
    queued = [ray.cloudpickle.dumps(rollout_sample(train_samples(g), rewards=rewards)) for g in groups]
    batch = assemble_batch_from_rollout_samples([ray.cloudpickle.loads(q) for q in queued], None, None, None)
    return advantages_of(batch, estimator)


def advantages_of(batch, estimator: str) -> dict[tuple[int, ...], set[int]]:
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]  # verl's extract_reward, no KL penalty
    out = compute_advantage(batch, adv_estimator=estimator)
    found: dict[tuple[int, ...], set[int]] = {}
    for i in range(len(out)):
        mask = out.batch["response_mask"][i].bool()
        ids = out.batch["input_ids"][i][out.batch["attention_mask"][i].bool()]
        found[tokens_key(ids)] = set(out.batch["advantages"][i][mask].view(torch.int32).tolist())
    return found


def bits(x: float) -> int:
    return int(torch.tensor(x, dtype=torch.float32).view(torch.int32).item())


def expected(groups: list[Group]) -> dict[tuple[int, ...], set[int]]:
    return {tokens_key(s.tokens): {bits(r)} if sum(s.loss_mask) else set()  # type: ignore[arg-type]
            for g in groups for s, r in zip(g.samples, g.rewards, strict=True)}


def test_the_stage_estimator_trains_on_the_stages_rewards_bit_for_bit():
    groups = make_groups(random.Random(3), 20, rollouts=(1, 6), max_siblings=3)
    assert advantages(groups, STAGE_ESTIMATOR, "stage") == expected(groups)


def test_verls_grpo_equals_the_reference_on_multi_row_groups_of_one_row_per_rollout():
    groups = make_groups(random.Random(4), 40, rollouts=(2, 8), max_siblings=1)
    assert advantages(groups, AdvantageEstimator.GRPO, "raw") == expected(groups)


def test_verls_grpo_gives_a_group_of_one_its_reward_over_one_plus_1e6_the_reference_zero():
    groups = make_groups(random.Random(5), 10, rollouts=(1, 1), max_siblings=1)
    found = advantages(groups, AdvantageEstimator.GRPO, "raw")
    for g in groups:
        (s,) = g.samples
        assert g.rewards == [0.0]
        raw = torch.tensor(float(s.reward), dtype=torch.float32)  # type: ignore[arg-type]
        assert found[tokens_key(s.tokens)] == {bits((raw / (torch.tensor(1.0) + 1e-6)).item())}


def test_verls_grpo_counts_sibling_rows_as_rollouts_of_their_own():
    groups = make_groups(random.Random(6), 30, rollouts=(2, 5), max_siblings=3)
    found = advantages(groups, AdvantageEstimator.GRPO, "raw")
    # verl equals the reference applied to the rows as if every sibling were a rollout of its own ...
    as_rollouts = []
    for g in groups:
        flat = [Sample(**{**{f: getattr(s, f) for f in s.__struct_fields__}, "rollout_id": i, "index": i,
                          "sibling_count": 1, "sibling_index": 0}) for i, s in enumerate(g.samples)]
        _, rewards = post_process_rewards(flat, RewardConfig(advantage_estimator="grpo"), [len(flat)])
        as_rollouts.append(Group(g.key, g.samples, rewards))
    assert found == expected(as_rollouts)
    # ... which differs from the stage's wherever a group has siblings
    with_siblings = [g for g in groups if any(s.sibling_count > 1 for s in g.samples)]
    differ = sum(found[tokens_key(s.tokens)] != expected([g])[tokens_key(s.tokens)]
                 for g in with_siblings for s in g.samples if sum(s.loss_mask))  # type: ignore[arg-type]
    assert with_siblings and differ > len(with_siblings)


def test_the_stage_queue_has_every_method_of_verls_message_queue():
    theirs = MessageQueue.__ray_actor_class__
    for name, method in inspect.getmembers(theirs, inspect.isfunction):
        if name.startswith("_"):
            continue
        ours = getattr(StageMessageQueue, name)
        assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(method), name
        theirs_params = [p for p in inspect.signature(method).parameters if p != "_ray_trace_ctx"]  # ray's
        assert list(inspect.signature(ours).parameters) == theirs_params, name


@pytest.mark.any_client
@pytest.mark.kafka(timeout=120)
def test_verl_rows_go_through_the_stage_and_train_on_its_rewards(kafka_bootstrap, unique_group_id):
    """The rollouter side publishes verl rows (raw rewards in rm_scores) with put_sample; the trainer side
    gets them back as verl RolloutSamples with the stage's rewards, which verl trains on bit for bit."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="verl")
    groups = make_groups(random.Random(9), 6, rollouts=(2, 5), max_siblings=1, run_id="verl")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"w-{topics.input}",
                          group_timeout_s=5.0, commit_interval_s=0.2)

    async def run() -> list:
        with RolloutProducer(kafka_bootstrap, topics.input) as producer:
            rollouter = StageMessageQueue(producer=producer, run_id="verl")
            for g in groups:
                assert await rollouter.put_sample(ray.cloudpickle.dumps(rollout_sample(train_samples(g),
                                                                                       rewards="raw")))
        return [await read(rewards) for rewards in ("stage", "raw")]

    async def read(rewards: str) -> list:
        reader = TrainDataReader(kafka_bootstrap, topics.output, f"{unique_group_id}-{rewards}",
                                 groups_per_batch=2, start="earliest", partition_idle_ms=200)
        trainer = StageMessageQueue(reader, max_queue_size=2, poll_s=0.2, rewards=rewards)  # type: ignore[arg-type]
        try:
            got = [await asyncio.wait_for(trainer.get_sample(), 60) for _ in groups]
            stats = await trainer.get_statistics()
            assert stats["total_consumed"] == len(groups) and stats["dropped_samples"] == 0
        finally:
            await trainer.shutdown()
        return [ray.cloudpickle.loads(item) for item, _ in got]

    with running_worker(config):
        stage, raw = asyncio.run(run())
    # put_sample numbered the rollouts afresh, so the tokens (not the ids) find each sample
    assert advantages_of(assemble_batch_from_rollout_samples(stage, None, None, None), STAGE_ESTIMATOR) == \
        expected(groups)
    # these groups have one row per rollout and at least two: verl's own GRPO on the raw rewards agrees
    raw_batch = assemble_batch_from_rollout_samples(raw, None, None, None)
    assert advantages_of(raw_batch, AdvantageEstimator.GRPO) == expected(groups)


def test_rows_are_padded_to_verls_fixed_widths_and_longer_samples_refused():
    from rollout_stream.integrations.verl import data_proto

    # 3 prompt and 4 response tokens each
    trains = train_samples(make_groups(random.Random(7), 1, rollouts=(3, 3))[0])
    data = data_proto(trains, prompt_length=5, response_length=8)
    assert data.batch["prompts"].shape == (3, 5) and data.batch["responses"].shape == (3, 8)
    assert data.batch["attention_mask"][:, :2].sum() == 0 and data.batch["attention_mask"][:, 9:].sum() == 0
    with pytest.raises(ValueError, match="does not fit"):
        data_proto(trains, prompt_length=5, response_length=3)


def test_each_response_token_carries_the_version_that_generated_it_through_verls_assembly():
    """`rollout_weight_versions` beside `response_mask` (-1 on padding): a partial rollout's spans survive
    verl's own batch assembly, row for row."""
    from rollout_stream.integrations.verl import data_proto

    trains = train_samples(make_groups(random.Random(7), 1, rollouts=(3, 3))[0])  # 4 response tokens each
    spans = [([2, 5], [0, 1]), ([3], None), ([1, 2, 6], [0, 2, 3])]
    trains = [spanned(t, v, o) for t, (v, o) in zip(trains, spans, strict=True)]
    data = data_proto(trains, prompt_length=5, response_length=8)
    versions = data.batch["rollout_weight_versions"]
    assert versions.shape == data.batch["response_mask"].shape == (3, 8)
    for row, (train, (v, o)) in enumerate(zip(trains, spans, strict=True)):
        response = expected_token_versions(train, v, o)[-train.sample.response_length:]
        assert versions[row].tolist() == response + [-1] * (8 - len(response))
    assembled = assemble_batch_from_rollout_samples([rollout_sample(trains, prompt_length=5,
                                                                    response_length=8)], None, {})
    assert torch.equal(assembled.batch["rollout_weight_versions"], versions)
