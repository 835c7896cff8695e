"""TRL's async GRPO data path fed by the stage, on the CPU (needs the [trl] extra).

    .venv/bin/python examples/trl_async_data_path.py                  # $KAFKA_BOOTSTRAP_SERVERS or :9092
    .venv/bin/python examples/trl_async_data_path.py --groups 6 --bootstrap-servers localhost:9092

Prompt groups of random completions and rewards are published to the stage; `StageRolloutWorker` reads the
stage's train data and feeds TRL's own `RolloutQueueDataset` → `FixedCountBatcher` → `DataCollatorForRollout`
(two data-parallel rows), the pipeline `AsyncGRPOTrainer` trains from. Each sample's packed advantages are
printed beside the reference trainer's GRPO reward of its group (`grpo_rewards` below): equal bit for bit.
The trainer itself needs a GPU (FlashAttention-3 tree attention, `torch.cuda` FLOPs at start; its default
rollout worker vLLM); the tests run it on the CPU with those two parts patched.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
from collections import defaultdict

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from accelerate import PartialState  # noqa: E402
from local_stage import LocalStage  # noqa: E402
from trl.experimental.async_grpo.async_grpo_trainer import (  # noqa: E402
    DataCollatorForRollout,
    FixedCountBatcher,
    RolloutQueueDataset,
)

from rollout_stream import RolloutProducer, TrainDataReader  # noqa: E402
from rollout_stream.integrations.trl import StageRolloutWorker, completion_samples  # noqa: E402


def grpo_rewards(rewards: list[float]) -> list[float]:
    """The reference trainer's GRPO reward of each rollout of one prompt group (one sample each): the float32
    operations of docs/spec.md §2, in its order."""
    r = torch.tensor(rewards, dtype=torch.float)
    a = r - r.mean()
    if len(rewards) > 1 and (s := r.std()) > 0:
        a = a / (s + 1e-6)
    return [float(x) for x in a]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=None,
                        help="Kafka address (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--completions", type=int, default=4, help="completions per prompt")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    PartialState(cpu=True)  # TRL's dataset logs through accelerate
    rng = random.Random(args.seed)
    local = LocalStage.start(args.bootstrap_servers, "trl-async", commit_interval_s=0.1)
    conn, topics, tag = local.conn, local.topics, local.tag
    reference: dict[tuple[int, ...], float] = {}
    status = 0
    feeder = None
    try:
        with RolloutProducer(conn, topics.input) as producer:
            for g in range(args.groups):
                prompt = [5, g + 10, 6]
                completions = [[rng.randrange(100, 200) for _ in range(rng.randint(2, 5))]
                               for _ in range(args.completions)]
                rewards = [rng.choice([0.0, 1.0, rng.random()]) for _ in completions]
                samples = completion_samples(prompt, completions, rewards, group_index=g, run_id=f"trl-{tag}",
                                             log_probs=[[-0.5] * len(c) for c in completions])
                producer.send_group(samples)
                processed = grpo_rewards(rewards)
                reference.update({tuple(prompt + c): r for c, r in zip(completions, processed, strict=True)})
            producer.flush(30)
        reader = TrainDataReader(conn, topics.output, f"trl-async-{tag}-trainer", groups_per_batch=1,
                                 partition_idle_ms=100)
        feeder = StageRolloutWorker(reader, queue_maxsize=64)
        feeder.start()
        dataset = RolloutQueueDataset(feeder.rollout_buffer, model_version_fn=lambda: 0,
                                      check_health_fn=feeder.check_health, stale_after_s=60,
                                      metrics=defaultdict(list), max_staleness=3)
        rows = next(iter(FixedCountBatcher(dataset, num_processes=2, microbatch_size=len(reference))))
        batch = DataCollatorForRollout(pad_token_id=0, num_processes=2).torch_call([rows])
        exact = True
        print(f"{'rank':>4} {'sample tokens':<28} {'reference reward':>17} {'TRL advantages':>15}")
        for rank, row in enumerate(rows):
            selected = batch["token_index"][rank] >= 0  # inter-rank padding is not a loss term
            segments = batch["segment_id"][rank][selected]
            advantages = batch["advantages"][rank][selected]
            for i, sample in enumerate(row.samples):
                tokens = tuple(int(t) for t in sample["input_ids"])
                packed = advantages[segments == i]
                want = torch.tensor(reference[tokens], dtype=torch.float32)
                same = bool((packed.view(torch.int32) == want.view(torch.int32)).all())
                exact &= same
                print(f"{rank:>4} {' '.join(map(str, tokens)):<28} {reference[tokens]:+17.6f} "
                      f"{packed[0].item():+15.6f}{'' if same else '  DIFFERS'}")
        print(f"done: {len(reference)} samples of {args.groups} groups in the collated batch; advantages "
              f"equal the reference's rewards bit for bit: {'yes' if exact else 'NO'}", flush=True)
        status = 0 if exact else 1
    finally:
        if feeder is not None:
            feeder.stop()
        local.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
