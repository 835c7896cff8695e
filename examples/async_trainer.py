"""A tiny asynchronous GRPO trainer fed by rollout-stream: synth → worker → train-data → reader → optimizer.

    .venv/bin/python examples/async_trainer.py                  # local broker (started if needed), 20 steps
    .venv/bin/python examples/async_trainer.py --steps 5 --bootstrap-servers localhost:9092

The policy is a bigram model (embedding + linear head over a 64-token vocabulary). A rollout-generator
thread takes the shape of each prompt group from `rollout_stream.ops.synth.plan_groups` (group, rollouts,
sibling
samples, prompt tokens), samples every response from a snapshot of the policy at the weight version it
"generates" with (the current one, or up to 3 versions old, as long generations are), records the
snapshot's log-probs, and rewards a rollout with the share of even tokens in its responses (siblings share
it). The stream worker normalizes rewards per group (GRPO); the trainer reads whole groups with
TrainDataReader, skips groups older than --max-staleness versions, and takes one clipped policy-gradient
step per batch: the raw reward should rise above its initial ~0.5. Topics are created for the run and
deleted at the end.
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch
from local_stage import LocalStage
from torch import nn

from rollout_stream import TrainDataReader
from rollout_stream.codec import Sample, decode_sample
from rollout_stream.logs import configure_logging
from rollout_stream.ops.synth import SynthPlan, plan_groups
from rollout_stream.pacing import PacingTimeout, WeightsTooOld
from rollout_stream.producer import RolloutProducer

VOCAB = 64


class TinyPolicy(nn.Module):
    """p(next token | current token): an embedding and a linear head (token ids are folded into `vocab`)."""

    def __init__(self, vocab: int = VOCAB, dim: int = 16) -> None:
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def next_log_probs(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head(self.embed(ids)), dim=-1)

    def response_log_probs(self, tokens: torch.Tensor, response_index: torch.Tensor) -> torch.Tensor:
        """log p(token at each response position | the token before it), shape of `response_index`."""
        ids = tokens.clamp(min=0) % self.vocab
        token_lp = self.next_log_probs(ids[:, :-1]).gather(2, ids[:, 1:, None]).squeeze(2)  # t predicts t + 1
        return token_lp.gather(1, (response_index - 1).clamp(min=0))

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, length: int,
               generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Responses of `length` tokens after each prompt, and their log-probs under this policy."""
        last, tokens, log_probs = prompts[:, -1], [], []
        for _ in range(length):
            lp = self.next_log_probs(last)
            last = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(1)
            tokens.append(last)
            log_probs.append(lp.gather(1, last[:, None]).squeeze(1))
        return torch.stack(tokens, 1), torch.stack(log_probs, 1)


def grpo_loss(new_lp: torch.Tensor, old_lp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              clip: float = 0.2) -> tuple[torch.Tensor, float]:
    """PPO-clipped surrogate with per-sample advantages, averaged over loss tokens; also the clip fraction."""
    ratio = torch.exp(torch.clamp(new_lp - old_lp, -20.0, 20.0))
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip, 1 + clip) * adv)
    tokens = mask.sum().clamp(min=1.0)
    clipped = ((ratio - 1).abs() > clip).float()
    return -(surrogate * mask).sum() / tokens, float((clipped * mask).sum() / tokens)


class RolloutGenerator(threading.Thread):
    """Generates groups with snapshots of the policy, a few batches ahead of the trainer (an async fleet)."""

    def __init__(self, bootstrap: str, topic: str, plan: SynthPlan, policy: TinyPolicy, ahead_groups: int,
                 seed: int, pacing: dict[str, Any] | None = None) -> None:
        """`pacing`: RolloutProducer's pacing arguments (docs/pacing.md); without them the generator keeps
        itself `ahead_groups` ahead of what the trainer consumed."""
        super().__init__(name="rollout-generator", daemon=True)
        self.bootstrap, self.topic, self.plan, self.ahead = bootstrap, topic, plan, ahead_groups
        self.pacing = pacing
        self.rng = random.Random(seed)
        self.torch_rng = torch.Generator().manual_seed(seed)
        self.snapshots: dict[int, TinyPolicy] = {0: copy.deepcopy(policy)}
        self.version = 0  # the trainer's current weight version
        self.consumed_groups = 0  # groups the trainer has taken so far
        self.sent_groups = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def publish_weights(self, version: int, policy: TinyPolicy) -> None:
        snapshot = copy.deepcopy(policy)
        with self.lock:
            self.snapshots[version] = snapshot
            self.snapshots.pop(version - 8, None)
            self.version = version

    def _choose_version(self) -> int:
        with self.lock:  # generated with current weights, or weights up to 3 versions old
            return max(0, self.version - self.rng.choice([0, 0, 1, 2, 3]))

    def _generate(self, samples: list[Sample], version: int) -> list[Sample]:
        with self.lock:
            policy = self.snapshots.get(version) or self.snapshots[self.version]
        length = samples[0].response_length
        prompts = torch.stack([s.tokens.tensor()[:-length].long() % VOCAB for s in samples])
        responses, log_probs = policy.sample(prompts, length, self.torch_rng)
        even: dict[object, list[float]] = defaultdict(list)
        for s, resp in zip(samples, responses, strict=True):
            even[s.rollout_id].append(float((resp % 2 == 0).float().mean()))
        for s, prompt, resp, lp in zip(samples, prompts, responses, log_probs, strict=True):
            s.tokens = torch.cat([prompt, resp]).numpy().astype("<i4")
            s.rollout_log_probs = lp.numpy().astype("<f4")
            s.loss_mask = np.ones(length, dtype="u1")
            s.reward = float(np.mean(even[s.rollout_id]))  # one trajectory reward shared by the siblings
            s.weight_versions = [str(version)]
            s.__post_init__()  # wrap the arrays
        return samples

    def _admitted_version(self, producer: RolloutProducer) -> int | None:
        """Paced: wait for room at the version chosen (weights too old to be admitted: the current ones)."""
        version = self._choose_version()
        while not self.stop.is_set():
            try:
                producer.admit(version, timeout=1.0)
                return version
            except PacingTimeout:  # no room yet; look at the stop flag, then wait on
                continue
            except WeightsTooOld:
                with self.lock:
                    version = self.version
        return None

    def run(self) -> None:
        with RolloutProducer(self.bootstrap, topic=self.topic, **(self.pacing or {})) as producer:
            for records, _ in plan_groups(self.plan, 10**9):
                if self.pacing:
                    version = self._admitted_version(producer)
                else:
                    while self.sent_groups - self.consumed_groups >= self.ahead and not self.stop.is_set():
                        time.sleep(0.02)
                    version = self._choose_version()
                if self.stop.is_set() or version is None:
                    return
                for sample in self._generate([decode_sample(rec.value) for rec in records], version):
                    producer.send(sample)  # keyed by group; a paced producer counts it until it is consumed
                producer.flush()
                self.sent_groups += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=None,
                        help="Kafka address (default: the local development broker, started if needed)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups-per-batch", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per prompt group")
    parser.add_argument("--max-siblings", type=int, default=2, help="samples per rollout drawn from 1..N")
    parser.add_argument("--max-staleness", type=int, default=2, help="skip groups this many versions older")
    parser.add_argument("--pace", action="store_true",
                        help="pace the generator to the trainer (max_policy_lag = --max-staleness, "
                        "docs/pacing.md)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    configure_logging("text", "warning")

    local = LocalStage.start(args.bootstrap_servers, "example", commit_interval_s=0.5)
    bootstrap, topics, worker, tag = local.bootstrap, local.topics, local.worker, local.tag
    policy = TinyPolicy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    plan = SynthPlan(group_size=args.group_size, max_siblings=args.max_siblings, tokens=32, seed=args.seed,
                     run_id=f"example-{tag}")
    trainer_group = f"example-{tag}-trainer"
    pacing = {"trainer_group_id": trainer_group, "train_data_topic": topics.output,
              "max_policy_lag": args.max_staleness, "max_unconsumed_groups": 3 * args.groups_per_batch}
    generator = RolloutGenerator(bootstrap, topics.input, plan, policy,
                                 ahead_groups=3 * args.groups_per_batch, seed=args.seed,
                                 pacing=pacing if args.pace else None)
    generator.start()
    reader = TrainDataReader(bootstrap, topics.output, trainer_group,
                             groups_per_batch=args.groups_per_batch, max_weight_staleness=args.max_staleness)
    status = 0
    try:
        for step in range(args.steps):
            batch = reader.next_batch(timeout=60)
            if batch is None:
                print("no batch within 60 s: is the worker running?", file=sys.stderr)
                status = 1
                break
            generator.consumed_groups += (len(batch.groups) + batch.skipped_stale + batch.skipped_invalid
                                         + batch.skipped_superseded)
            new_lp = policy.response_log_probs(batch.tokens, batch.response_index)
            loss, clip_frac = grpo_loss(new_lp, batch.rollout_log_probs, batch.rewards, batch.loss_mask)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            reader.commit()  # the batch is trained: a restarted trainer continues after it
            reader.set_weight_version(step + 1)
            generator.publish_weights(step + 1, policy)
            print(f"step {step:3d}  loss {loss.item():+.6f}  clip {clip_frac:.2f}  "
                  f"groups {len(batch.groups)}  samples {len(batch)}  "
                  f"raw reward {batch.raw_rewards.mean().item():.3f}  "
                  f"skipped stale {batch.skipped_stale}", flush=True)
    finally:
        generator.stop.set()
        reader.close()
        worker.request_stop()
        generator.join(timeout=30)
        local.stop()
    stats = reader.stats
    print(f"done: {stats.batches} batches, {stats.groups} groups read, {stats.skipped_stale_groups} stale "
          f"groups skipped; worker published {worker.stats.groups_published} groups", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
