"""TRL's GRPOTrainer trained on the CPU from rollouts that went through the stage (needs the [trl] extra).

    .venv/bin/python examples/trl_grpo.py                  # $KAFKA_BOOTSTRAP_SERVERS or :9092, 3 steps
    .venv/bin/python examples/trl_grpo.py --steps 5 --bootstrap-servers localhost:9092

A tiny Llama (built from a config, no hub) and a WordLevel tokenizer. TRL calls `rollout_func` with each
prompt repeated `num_generations` times; the function samples the completions with the model being trained,
rewards each with its share of even token ids, publishes every prompt's completions to the stage as one
prompt group (`rollout_stream.integrations.trl.completion_samples`), reads the groups back from the train-data
topic with TrainDataReader and hands TRL the stage's processed rewards as a reward column. TRL then
**re-normalizes** them per group, (r - mean) / (std + 1e-4) with its own `nanstd`: the advantage it trains
on is not the stage's reward (`--scale-rewards none` leaves r - mean, which for the stage's zero-mean
rewards equals them up to float rounding). Each step prints both. The async trainer takes the stage's reward
as its advantage unchanged (`StageRolloutWorker`, docs/integrations.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from local_stage import LocalStage  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from tokenizers.models import WordLevel  # noqa: E402
from tokenizers.pre_tokenizers import WhitespaceSplit  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from rollout_stream import RolloutProducer, TrainDataReader  # noqa: E402
from rollout_stream.integrations.trl import completion_samples  # noqa: E402

WORDS = 30  # w0..w29; ids 0..2 are the special tokens


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{f"w{i}": i + 3 for i in range(WORDS)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>", padding_side="left")


def tiny_llama(vocab: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1, bos_token_id=1)
    return LlamaForCausalLM(config)


def even_share(completion: list[int]) -> float:
    return sum(t % 2 == 0 for t in completion) / max(1, len(completion))


class StageRollouts:
    """TRL's `rollout_func`: sample, publish each prompt's completions as a group, read the stage's
    rewards."""

    def __init__(self, producer: RolloutProducer, reader: TrainDataReader, tokenizer: PreTrainedTokenizerFast,
                 num_generations: int, completion_length: int, run_id: str) -> None:
        self.producer, self.reader, self.tokenizer = producer, reader, tokenizer
        self.n, self.length, self.run_id = num_generations, completion_length, run_id
        self.next_group = 0
        self.log: list[tuple[list[float], list[float]]] = []  # (raw, stage) per call

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        model = trainer.model
        rows: dict[int, tuple[list[int], list[int], list[float]]] = {}
        first = self.next_group
        for start in range(0, len(prompts), self.n):  # TRL repeats each prompt num_generations times in a row
            prompt_ids = self.tokenizer(prompts[start])["input_ids"]
            completions, log_probs = self._sample(model, prompt_ids)
            rewards = [even_share(c) for c in completions]
            group = self.next_group
            self.next_group += 1
            self.producer.send_group(completion_samples(
                prompt_ids, completions, rewards, group_index=group, run_id=self.run_id, log_probs=log_probs,
                weight_version=trainer.state.global_step))
            for i in range(self.n):
                rows[group * self.n + i] = (prompt_ids, completions[i], log_probs[i])
        self.producer.flush(30)
        stage: dict[int, float] = {}
        raw: dict[int, float] = {}
        while len(stage) < len(prompts):
            batch = self.reader.next_batch(timeout=60)
            if batch is None:
                raise RuntimeError("no train data from the stage within 60 s: is the worker running?")
            for train in batch.samples:
                rid = int(train.sample.rollout_id)  # type: ignore[arg-type]
                stage[rid], raw[rid] = train.reward, train.raw_reward
            self.reader.commit()
        ids = range(first * self.n, self.next_group * self.n)
        self.log.append(([raw[i] for i in ids], [stage[i] for i in ids]))
        return {"prompt_ids": [rows[i][0] for i in ids], "completion_ids": [rows[i][1] for i in ids],
                "logprobs": [rows[i][2] for i in ids], "stage_reward": [stage[i] for i in ids]}

    @torch.no_grad()
    def _sample(self, model: Any, prompt_ids: list[int]) -> tuple[list[list[int]], list[list[float]]]:
        inputs = torch.tensor([prompt_ids] * self.n)
        out = model.generate(inputs, attention_mask=torch.ones_like(inputs), do_sample=True,
                             max_new_tokens=self.length, min_new_tokens=self.length, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0)
        scores = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        completions = out.sequences[:, len(prompt_ids):].tolist()
        return completions, scores.float().tolist()


def stage_reward(completions: list[Any], stage_reward: list[float], **_: Any) -> list[float]:
    """The reward column TRL sums: the stage's processed reward, passed through `rollout_func`."""
    return stage_reward


class RecordingGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that keeps the advantages it computed, to print them beside the stage's rewards."""

    advantages: list[list[float]]

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        out: dict[str, Any] = super()._generate_and_score_completions(inputs)
        self.advantages.append(out["advantages"].flatten().tolist())
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=None,
                        help="Kafka address (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--scale-rewards", default="group", choices=["group", "batch", "none"],
                        help="TRL's re-normalization of the rewards it is given (default: TRL's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    logging.basicConfig(level=logging.WARNING)

    local = LocalStage.start(args.bootstrap_servers, "trl", commit_interval_s=0.1)
    conn, topics, tag = local.conn, local.topics, local.tag

    tokenizer = tiny_tokenizer()
    model = tiny_llama(len(tokenizer))
    prompts = [" ".join(f"w{(7 * i + j) % WORDS}" for j in range(3)) for i in range(64)]
    producer = RolloutProducer(conn, topics.input)
    reader = TrainDataReader(conn, topics.output, f"trl-{tag}-trainer", groups_per_batch=1,
                             partition_idle_ms=100)
    rollouts = StageRollouts(producer, reader, tokenizer, args.num_generations, completion_length=6,
                             run_id=f"trl-{tag}")
    status = 0
    try:
        with tempfile.TemporaryDirectory() as out:
            config = GRPOConfig(
                output_dir=out, use_cpu=True, max_steps=args.steps, learning_rate=0.05, logging_steps=1,
                per_device_train_batch_size=args.num_generations * args.prompts_per_step,
                num_generations=args.num_generations, max_completion_length=6, report_to=[],
                save_strategy="no", scale_rewards=args.scale_rewards, seed=args.seed, disable_tqdm=True)
            trainer = RecordingGRPOTrainer(model=model, reward_funcs=[stage_reward], args=config,
                                           train_dataset=Dataset.from_dict({"prompt": prompts}),
                                           processing_class=tokenizer, rollout_func=rollouts)
            trainer.advantages = []
            before = [p.detach().clone() for p in model.parameters()]
            trainer.train()
            after = list(model.parameters())
            changed = sum(not torch.equal(a, b.detach()) for a, b in zip(before, after, strict=True))
        for step, ((raw, stage), trl_adv) in enumerate(zip(rollouts.log, trainer.advantages, strict=False)):
            print(f"step {step}  raw reward {sum(raw) / len(raw):.3f}", flush=True)
            print("  stage reward   " + " ".join(f"{r:+.4f}" for r in stage))
            print("  TRL advantage  " + " ".join(f"{a:+.4f}" for a in trl_adv))
        print(f"done: {trainer.state.global_step} optimizer steps, {changed} parameter tensors changed, "
              f"{reader.stats.groups} groups through the stage", flush=True)
        if trainer.state.global_step != args.steps or not changed:
            status = 1
    finally:
        producer.close()
        reader.close()
        local.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
