"""verl's queue as verl runs it: a Ray actor (a local Ray runtime on the CPU) built from a `StageQueueConfig`,
fed by the real stage and drained through verl 0.9.1's own `MessageQueueClient`, the collection method of its
`FullyAsyncTrainer` (`_get_samples_from_queue`, which calls `assemble_batch_from_rollout_samples`) and
`compute_advantage`, while the actor is killed twice (the long tier: a minute, most of it Ray and three actor
starts). `make test` starts the actor in the verl example (tests/examples/test_verl_data_path.py)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from typing import Any

import pytest
import torch

pytest.importorskip("verl", reason="the [verl] extra")
import ray  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.fully_async_policy.fully_async_trainer import FullyAsyncTrainer  # noqa: E402
from verl.experimental.fully_async_policy.message_queue import MessageQueueClient  # noqa: E402
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402

from rollout_stream.clients import Connection  # noqa: E402
from rollout_stream.config import WorkerConfig  # noqa: E402
from rollout_stream.integrations.verl import STAGE_ESTIMATOR  # noqa: E402
from rollout_stream.integrations.verl_queue import StageMessageQueue, StageQueueConfig  # noqa: E402
from rollout_stream.producer import RolloutProducer  # noqa: E402
from rollout_stream.reader import TrainDataReader  # noqa: E402
from tests.stream.helpers import new_topics, running_worker, wait_until  # noqa: E402
from tests.stream.integrations.groups import Group, committed_batch, make_groups, tokens_key  # noqa: E402

PROMPT, RESPONSE = 3, 4  # the widths of make_groups' samples: verl's max_prompt_length, max_response_length


@pytest.fixture(scope="module")
def ray_runtime() -> Any:
    """A local Ray runtime on the CPU, no cluster, no dashboard: what verl's `ray.init` starts on one node."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


class VerlTrainer:
    """What verl's `FullyAsyncTrainer._get_samples_from_queue` reads of its trainer (verl 0.9.1), with the
    method itself verl's: `required_samples` `get_sample` calls on the `MessageQueueClient`, then
    `assemble_batch_from_rollout_samples` on what they return."""

    collect = FullyAsyncTrainer.__ray_actor_class__._get_samples_from_queue

    def __init__(self, client: MessageQueueClient, required_samples: int) -> None:
        self.message_queue_client, self.required_samples = client, required_samples
        self.dynamic_schedule_enabled = False
        self.config = OmegaConf.create({"trainer": {"balance_batch": False}})
        self.tokenizer = self._balance_batch = None
        self._step_wait_times: list[float] = []
        self._step_wait_samples: list[int] = []

    async def step(self) -> Any:
        _, batch = await self.collect()
        assert batch is not None, "verl's trainer got no batch"
        return batch


def queue_actor(config: StageQueueConfig, **options: Any) -> Any:
    """The queue as the docs wire it: Ray restarts it and retries the calls a restart interrupted."""
    return ray.remote(StageMessageQueue).options(max_restarts=-1, max_task_retries=-1).remote(
        config, prompt_length=PROMPT, response_length=RESPONSE, poll_s=0.2, **options)


def bits(x: float) -> int:
    return int(torch.tensor(x, dtype=torch.float32).view(torch.int32).item())


def trained(batch: Any) -> dict[tuple[int, ...], set[int]]:
    """Each row's advantages on its trained tokens (float32 bits), by its tokens, after verl's
    `compute_advantage` with the stage's estimator."""
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]  # verl's extract_reward, no KL in reward
    out = compute_advantage(batch, adv_estimator=STAGE_ESTIMATOR)
    found = {}
    for i in range(len(out)):
        mask = out.batch["response_mask"][i].bool()
        ids = out.batch["input_ids"][i][out.batch["attention_mask"][i].bool()]
        found[tokens_key(ids)] = set(out.batch["advantages"][i][mask].view(torch.int32).tolist())
    return found


def expected(groups: list[Group]) -> dict[tuple[int, ...], set[int]]:
    return {tokens_key(s.tokens): {bits(r)} if sum(s.loss_mask) else set()  # type: ignore[arg-type]
            for g in groups for s, r in zip(g.samples, g.rewards, strict=True)}


def stage_config(bootstrap: str, topics: Any, group_id: str, groups_per_batch: int, **kw: Any
                 ) -> StageQueueConfig:
    return StageQueueConfig(bootstrap, train_data_topic=topics.output, group_id=group_id,
                            groups_per_batch=groups_per_batch, partition_idle_ms=200, **kw)


@pytest.mark.any_client
def test_a_reader_cannot_be_sent_to_an_actor_its_configuration_can(kafka_bootstrap, unique_group_id):
    """Ray pickles an actor's constructor arguments (and keeps them, to restart it): a reader holds a thread
    lock, which is why `ray.remote(StageMessageQueue).remote(reader)` fails with "Could not serialize"; the
    configuration crosses, and builds the reader where it lands. The actor itself runs in the verl example
    (tests/examples/test_verl_data_path.py) and in the restart test below."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="verl-config")
    reader = TrainDataReader(kafka_bootstrap, topics.output, unique_group_id, groups_per_batch=1)
    try:
        with pytest.raises(TypeError, match="lock"):
            ray.cloudpickle.dumps(reader)
    finally:
        reader.close()
    config = stage_config(kafka_bootstrap, topics, unique_group_id, 4, input_topic=topics.input)
    sent = ray.cloudpickle.loads(ray.cloudpickle.dumps(config))
    assert sent == config and isinstance(sent.connection, Connection)
    assert sent.connection.client == os.environ.get("ROLLOUT_STREAM_CLIENT", "confluent")  # chosen here
    queue = StageMessageQueue(sent, prompt_length=PROMPT, response_length=RESPONSE)
    try:
        assert queue.reader is not None and queue.reader.groups_per_batch == 4
        assert queue.reader.topic == topics.output and queue.producer is not None
    finally:
        asyncio.run(queue.shutdown())
    with pytest.raises(ValueError, match="group_id"):
        StageQueueConfig(kafka_bootstrap, train_data_topic=topics.output)


class DrainingClient(MessageQueueClient):
    """verl's client, counting what it hands the trainer; after the deliveries named in `kills` it kills
    the actor, once the commit the docs promise by then is on the broker (made within `poll_s`)."""

    def __init__(self, actor: Any, kills: dict[int, Any]) -> None:
        super().__init__(actor)
        self.kills, self.received = kills, []

    async def get_sample(self) -> Any:
        item = await super().get_sample()
        self.received.append(ray.cloudpickle.loads(item[0]).sample_id)
        if (kill := self.kills.get(len(self.received))) is not None:
            kill()
        return item


@pytest.mark.long
@pytest.mark.kafka(timeout=600)
def test_the_queue_actor_restarts_while_verl_drains_it_nothing_lost(kafka_bootstrap, unique_group_id,
                                                                    ray_runtime):
    """500 prompt groups through the stage; verl's trainer takes them 10 per step while the queue actor is
    killed twice (ray.kill with a restart, then kill -9 of its process). Every group reaches the trainer;
    the only repeats are, per restart, the groups after the last commit (the step being collected and the
    one before it), and they are exactly those; every batch is verl's assembly; every advantage is the
    stage's reward bit for bit."""
    n, per_step = 500, 10
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="verl-restart")
    groups = make_groups(random.Random(12), n, rollouts=(1, 4), max_siblings=2, run_id="verl-restart")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"w-{topics.input}",
                          group_timeout_s=5.0, commit_interval_s=0.2)
    actor = queue_actor(stage_config(kafka_bootstrap, topics, unique_group_id, per_step))
    pids: list[int] = []

    def pid() -> int:
        return int(ray.get(actor.__ray_call__.remote(lambda _: os.getpid()), timeout=120))

    def committed(through: int) -> None:
        # the commit the rule has made by now: batches before the step before the one being collected
        batch = through // per_step - 1
        wait_until(lambda: committed_batch(kafka_bootstrap, topics.output, unique_group_id, 2) == batch, 30,
                   f"the commit of batch {batch}")

    def restart() -> None:  # ray.kill, letting Ray restart it
        committed(110)
        pids.append(pid())
        ray.kill(actor, no_restart=False)

    def kill_9() -> None:  # the actor's process dies at once
        committed(280)
        pids.append(pid())
        os.kill(pids[-1], signal.SIGKILL)

    # 123 deliveries: 12 steps and 3 groups of the 13th; the last commit covered batches 0..10 (110
    # groups), so 13 groups come again. Then 187 more (the 13th step's other 7 and 18 steps): its commit is
    # 170 groups past the restart, so 17 come again. 500 + 30 deliveries: 53 whole steps.
    client = DrainingClient(actor, {123: restart, 310: kill_9})
    trainer = VerlTrainer(client, per_step)

    async def drain() -> list[Any]:
        batches = []
        while len(client.received) < n + 30:
            batches.append(await trainer.step())
        return batches

    with RolloutProducer(kafka_bootstrap, topics.input) as producer:
        for g in groups:
            producer.send_group(g.samples)
        producer.flush()
    started = time.monotonic()
    try:
        with running_worker(config):
            batches = asyncio.run(drain())
            after = pid()
    finally:
        ray.kill(actor)
    took = time.monotonic() - started

    got = client.received
    assert len(got) == n + 30 and len(batches) == 53 and len(set(pids + [after])) == 3
    first, second, third = got[:123], got[123:310], got[310:]
    # each restart resumed at its last commit: the repeats are exactly the groups handed out after it
    assert second[:13] == first[110:123] and third[:17] == second[170:187]
    order = first + second[13:] + third[17:]
    assert len(order) == len(set(order)) == n and set(order) == {g.key for g in groups}
    want, sizes = expected(groups), {g.key: len(g.samples) for g in groups}
    for batch in batches:  # each group once in a batch, all its rows
        assert len(batch) == sum(sizes[key] for key in set(batch.non_tensor_batch["uid"]))
        assert all(want[key] == advantages for key, advantages in trained(batch).items())
    print(f"500 groups, 530 deliveries, 2 restarts in {took:.1f} s")
