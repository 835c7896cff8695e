"""A tiny asynchronous GRPO trainer fed by rollout-stream: generator → stage → reader → optimizer.

    .venv/bin/rollout-stream broker start                       # a local broker on 127.0.0.1:9092, once
    .venv/bin/python examples/async_trainer.py                  # 20 steps
    .venv/bin/python examples/async_trainer.py --steps 5 --bootstrap-servers localhost:9092

The policy is a bigram model (embedding + linear head over a 64-token vocabulary). A rollout-generator
thread makes prompt groups of --group-size rollouts, each of 1 to --max-siblings samples (an agentic
rollout's turns), samples every response from a snapshot of the policy at the weight version it
"generates" with (the current one, or up to 3 versions old, as long generations are), records the
snapshot's log-probs, rewards a rollout with the share of even tokens in its responses (siblings share it)
and publishes the group with `RolloutProducer.send_many`. The stage (`rollout-stream run`, started for the
run) normalizes rewards per group (GRPO); the trainer reads whole groups with TrainDataReader, skips groups
older than --max-staleness versions, and takes one clipped policy-gradient step per batch: the raw reward
should rise above its initial ~0.5. The run's topics are new, named after a random tag.
"""

from __future__ import annotations

import argparse
import copy
import logging
import random
import sys
import threading
import time
from collections import defaultdict
from typing import Any

import torch
from local_stage import LocalStage
from torch import nn

from rollout_stream import PacingTimeout, RolloutProducer, TrainDataReader, WeightsTooOld

VOCAB = 64
PROMPT_TOKENS, RESPONSE_TOKENS = 8, 24


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

    def __init__(self, bootstrap: str, topic: str, policy: TinyPolicy, *, group_size: int, max_siblings: int,
                 ahead_groups: int, seed: int, run_id: str, pacing: dict[str, Any] | None = None) -> None:
        """`pacing`: RolloutProducer's pacing arguments (docs/pacing.md); without them the generator keeps
        itself `ahead_groups` ahead of what the trainer consumed."""
        super().__init__(name="rollout-generator", daemon=True)
        self.bootstrap, self.topic, self.ahead, self.run_id = bootstrap, topic, ahead_groups, run_id
        self.group_size, self.max_siblings = group_size, max_siblings
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

    def _generate(self, group_index: int, version: int) -> list[dict[str, Any]]:
        """One prompt group as a rollout process hands it over: a dict per sample, miles' field names."""
        with self.lock:
            policy = self.snapshots.get(version) or self.snapshots[self.version]
        siblings = [self.rng.randint(1, self.max_siblings) for _ in range(self.group_size)]
        rollout_of_row = [r for r, n in enumerate(siblings) for _ in range(n)]
        prompt = torch.randint(VOCAB, (PROMPT_TOKENS,), generator=self.torch_rng)
        responses, log_probs = policy.sample(prompt.repeat(len(rollout_of_row), 1), RESPONSE_TOKENS,
                                             self.torch_rng)
        even: dict[int, list[float]] = defaultdict(list)
        for r, response in zip(rollout_of_row, responses, strict=True):
            even[r].append(float((response % 2 == 0).float().mean()))
        rows = zip(rollout_of_row, responses, log_probs, strict=True)
        return [{"group_index": group_index, "index": i, "rollout_id": r, "status": "completed",
                 "tokens": torch.cat([prompt, response]).tolist(), "response_length": RESPONSE_TOKENS,
                 "loss_mask": [1] * RESPONSE_TOKENS, "rollout_log_probs": lp.tolist(),
                 "reward": sum(even[r]) / len(even[r]),  # one trajectory reward shared by the siblings
                 "weight_versions": [str(version)]}
                for i, (r, response, lp) in enumerate(rows)]

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
            while not self.stop.is_set():
                if self.pacing:
                    version = self._admitted_version(producer)
                else:
                    while self.sent_groups - self.consumed_groups >= self.ahead and not self.stop.is_set():
                        time.sleep(0.02)
                    version = self._choose_version()
                if self.stop.is_set() or version is None:
                    return
                # keyed by group, siblings numbered; a paced producer counts the group until it is consumed
                producer.send_many(self._generate(self.sent_groups, version), run_id=self.run_id)
                producer.flush()
                self.sent_groups += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=None,
                        help="Kafka address (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)")
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
    logging.basicConfig(level=logging.WARNING)

    local = LocalStage.start(args.bootstrap_servers, "example", commit_interval_s=0.5)
    bootstrap, topics, tag = local.bootstrap, local.topics, local.tag
    policy = TinyPolicy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr)
    trainer_group = f"example-{tag}-trainer"
    pacing = {"trainer_group_id": trainer_group, "train_data_topic": topics.output,
              "max_policy_lag": args.max_staleness, "max_unconsumed_groups": 3 * args.groups_per_batch}
    generator = RolloutGenerator(bootstrap, topics.input, policy, group_size=args.group_size,
                                 max_siblings=args.max_siblings, ahead_groups=3 * args.groups_per_batch,
                                 seed=args.seed, run_id=f"example-{tag}",
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
        generator.join(timeout=30)
        local.stop()
    stats = reader.stats
    print(f"done: {stats.batches} batches, {stats.groups} groups read, {stats.skipped_stale_groups} stale "
          f"groups skipped; {generator.sent_groups} groups sent", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
