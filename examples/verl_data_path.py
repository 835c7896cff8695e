"""verl's fully-async data path through the stage, on the CPU (needs verl: the [verl] extra, and ray).

    .venv/bin/python examples/verl_data_path.py                  # $KAFKA_BOOTSTRAP_SERVERS or :9092
    .venv/bin/python examples/verl_data_path.py --bootstrap-servers localhost:9092

verl's message queue is a Ray actor; so is the stage's. The example starts a local Ray runtime (2 CPUs, no
dashboard, stopped at the end) and one `StageMessageQueue` actor, built from a `StageQueueConfig`, that both
sides reach through verl's own `MessageQueueClient`: the rollouter side puts verl `RolloutSample`s (one
prompt's n generated rows, raw rewards in `rm_scores`, pickled as verl's rollouter pickles them), which the
actor publishes as prompt groups; the stage normalizes per group; the trainer side takes the groups back as
verl's `FullyAsyncTrainer` does (`get_sample`, then verl's own `assemble_batch_from_rollout_samples` and
`compute_advantage`) with the stage's rewards and the pass-through estimator. A second queue, in this
process (a comparison needs no actor), hands the same groups with their raw rewards to verl's GRPO. One
prompt has a single response, where the two differ (verl: r / (1 + 1e-6), the stage: 0). What needs GPUs is
verl's trainer itself (FSDP or Megatron workers, a vLLM or SGLang rollout); this is the data between them.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

import numpy as np
import ray
import torch
from local_stage import LocalStage
from verl import DataProto
from verl.experimental.fully_async_policy.detach_utils import (
    RolloutSample,
    assemble_batch_from_rollout_samples,
)
from verl.experimental.fully_async_policy.message_queue import MessageQueueClient
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.ray_trainer import compute_advantage

from rollout_stream import Connection
from rollout_stream.integrations.verl import STAGE_ESTIMATOR
from rollout_stream.integrations.verl_queue import StageMessageQueue, StageQueueConfig

PROMPT, RESPONSE = 4, 6


def generated_rows(prompt: int, n: int, rng: np.random.Generator, step: int) -> Any:
    """n responses to one prompt as verl's agent loop returns them (left-padded prompts, right-padded
    responses, the reward on the last response token): reward = share of even response tokens."""
    lengths = rng.integers(2, RESPONSE + 1, size=n)
    # one pad on the left of each prompt
    prompts = torch.tensor([[0] + [prompt % 90 + 10 + i for i in range(PROMPT - 1)]] * n)
    responses = torch.zeros((n, RESPONSE), dtype=torch.long)
    attention = torch.zeros((n, PROMPT + RESPONSE), dtype=torch.long)
    scores = torch.zeros((n, RESPONSE), dtype=torch.float32)
    for i, length in enumerate(lengths):
        tokens = torch.from_numpy(rng.integers(100, 200, size=length))
        responses[i, :length] = tokens
        attention[i, 1:PROMPT + length] = 1
        scores[i, length - 1] = float((tokens % 2 == 0).float().mean())
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
                 "attention_mask": attention, "response_mask": attention[:, PROMPT:],
                 "position_ids": (attention.cumsum(1) - 1).clamp(min=0), "rm_scores": scores,
                 "rollout_log_probs": torch.full((n, RESPONSE), -0.7) * attention[:, PROMPT:]},
        non_tensors={"uid": np.array([f"uid_{prompt}"] * n, dtype=object),
                     "min_global_steps": np.array([step] * n, dtype=object),
                     "max_global_steps": np.array([step] * n, dtype=object)})
    # verl's rollouter names a prompt sample_<epoch>_<n>: the stage's group index is n
    return RolloutSample(full_batch=data, sample_id=f"sample_0_{prompt}", epoch=0, rollout_status={})


def stage_queue(conn: Connection, topics: Any, group: str, required_samples: int, *, rewards: str = "stage",
                rollouter: bool = True) -> MessageQueueClient:
    """verl's message queue on the stage, a Ray actor as verl's own: the rollouter's `put_sample` publishes to
    the stage's input topic, the trainer's `get_sample` reads its train data, a step's groups per batch."""
    config = StageQueueConfig(conn, train_data_topic=topics.output, group_id=group,
                              groups_per_batch=required_samples,
                              input_topic=topics.input if rollouter else None)
    queue = ray.remote(StageMessageQueue).options(max_restarts=-1, max_task_retries=-1).remote(
        config, rewards=rewards, prompt_length=PROMPT, response_length=RESPONSE, run_id="verl-example")
    client = MessageQueueClient(queue)  # verl: trainer.set_message_queue_client(client), the rollouter's too
    return client


async def take(client: MessageQueueClient | StageMessageQueue, count: int) -> Any:
    """What verl's FullyAsyncTrainer._get_samples_from_queue does, then its batch assembly."""
    items = [await asyncio.wait_for(client.get_sample(), 120) for _ in range(count)]
    samples = [ray.cloudpickle.loads(x) for x, _ in items]
    batch = assemble_batch_from_rollout_samples(samples, None, None, None)
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]  # verl's extract_reward, no KL in reward
    return batch


async def run(conn: Connection, topics: Any, tag: str, prompts: list[int], rng: np.random.Generator
              ) -> tuple[Any, Any]:
    queue = stage_queue(conn, topics, f"verl-{tag}-stage", len(prompts))
    raw_queue = StageMessageQueue(StageQueueConfig(conn, train_data_topic=topics.output,
                                                   group_id=f"verl-{tag}-raw", groups_per_batch=len(prompts)),
                                  rewards="raw", prompt_length=PROMPT, response_length=RESPONSE)
    try:
        for prompt in prompts:  # verl's rollouter: one put per prompt, its n generated rows
            n = 1 if prompt == prompts[-1] else 4  # the last prompt: a single response
            await queue.put_sample(ray.cloudpickle.dumps(generated_rows(prompt, n, rng, step=0)))
        return await take(queue, len(prompts)), await take(raw_queue, len(prompts))
    finally:
        await queue.shutdown()
        await raw_queue.shutdown()


def keyed(batch: Any, values: list[Any] | None) -> dict[tuple[int, ...], Any]:
    """`values` (default: each row's advantage, on its first response token) by the row's tokens."""
    out = {}
    for i in range(len(batch)):
        ids = tuple(batch.batch["input_ids"][i][batch.batch["attention_mask"][i].bool()].tolist())
        out[ids] = float(batch.batch["advantages"][i][0]) if values is None else values[i]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=None,
                        help="Kafka address (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    local = LocalStage.start(args.bootstrap_servers, "verl", commit_interval_s=0.1)
    conn, topics, tag = local.conn, local.topics, local.tag
    status = 0
    try:
        print("starting a local Ray runtime (2 CPUs, no dashboard) for the queue actors", flush=True)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        prompts = list(range(args.prompts))
        stage, raw = asyncio.run(run(conn, topics, tag, prompts, np.random.default_rng(args.seed)))
        # the stage's processed reward of each row: what it put on the row's last response token
        rewards = keyed(stage, stage.batch["rm_scores"].sum(-1).tolist())
        raw_rewards = keyed(raw, raw.batch["rm_scores"].sum(-1).tolist())
        uids = keyed(stage, list(stage.non_tensor_batch["uid"]))
        passed = keyed(compute_advantage(stage, adv_estimator=STAGE_ESTIMATOR), None)
        grpo = keyed(compute_advantage(raw, adv_estimator=AdvantageEstimator.GRPO), None)
        print(f"{'group':>14} {'raw':>7} {'stage reward':>13} {'pass-through':>13} {'verl GRPO':>10}")
        for ids in rewards:
            print(f"{uids[ids]:>14} {raw_rewards[ids]:7.4f} {rewards[ids]:+13.6f} {passed[ids]:+13.6f} "
                  f"{grpo[ids]:+10.6f}")
        exact = all(torch.tensor(passed[k]).view(torch.int32) == torch.tensor(rewards[k]).view(torch.int32)
                    for k in rewards)
        differ = sum(grpo[k] != rewards[k] for k in rewards)
        print(f"done: {len(prompts)} prompt groups, {len(rewards)} rows through the stage; the pass-through "
              f"advantages equal the stage's rewards bit for bit: {'yes' if exact else 'NO'}; verl's GRPO "
              f"differs on {differ} row(s)", flush=True)
        status = 0 if exact else 1
    finally:
        ray.shutdown()
        local.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
