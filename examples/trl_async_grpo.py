"""TRL's AsyncGRPOTrainer trained from the stage (needs the [trl] extra).

    .venv/bin/python examples/trl_async_grpo.py                  # $KAFKA_BOOTSTRAP_SERVERS or :9092
    .venv/bin/python examples/trl_async_grpo.py --bootstrap-servers localhost:9092

Prompt groups of random completions and rewards are published to the stage; the trainer's rollout worker is
`StageRolloutWorker`, which hands it the stage's train data (the stage's reward as each sample's
advantage), and it takes 2 optimizer steps on a one-layer Llama built from a config. The weights go nowhere
(`NoWeightSync`): the rollout fleet that generated the groups syncs its own.

The trainer is built for a GPU in two places: its `__init__` asks torch.cuda for the device's peak FLOPs,
and its tree attention calls FlashAttention-3, a kernel fetched from the Hugging Face hub. Without CUDA this
example replaces both (`cpu_stand_ins`: no peak FLOPs, and a CPU SDPA of the same varlen call), and says so;
on a GPU it replaces neither.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import types
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from datasets import Dataset  # noqa: E402
from local_stage import LocalStage  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from tokenizers.models import WordLevel  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl.experimental.async_grpo import (  # noqa: E402
    AsyncGRPOConfig,
    AsyncGRPOTrainer,
    async_grpo_trainer,
    packing,
)

from rollout_stream import RolloutProducer, TrainDataReader  # noqa: E402
from rollout_stream.integrations.trl import StageRolloutWorker, completion_samples  # noqa: E402

VOCAB = 256


def sdpa_varlen(q: Any, k: Any, v: Any, cu_q: Any, cu_k: Any, max_q: int, max_k: int,
                softmax_scale: float | None = None, causal: bool = True, window_size: Any = (-1, -1),
                **_: Any) -> Any:
    """flash_attn_varlen_func on the CPU: per segment, causal aligned at the end of its keys (FA's rule)."""
    out = torch.empty_like(q)
    for s in range(len(cu_q) - 1):
        qs = q[cu_q[s]:cu_q[s + 1]].transpose(0, 1)
        ks, vs = (x[cu_k[s]:cu_k[s + 1]].transpose(0, 1) for x in (k, v))
        mask = torch.ones(qs.shape[1], ks.shape[1], dtype=torch.bool).tril(diagonal=ks.shape[1] - qs.shape[1])
        out[cu_q[s]:cu_q[s + 1]] = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, scale=softmax_scale).transpose(0, 1)
    return out


def cpu_stand_ins() -> None:
    """The two GPU-only parts of AsyncGRPOTrainer, replaced for a machine without CUDA."""
    async_grpo_trainer.get_peak_flops_per_device = lambda *a, **k: None
    shim = types.SimpleNamespace(flash_attn_varlen_func=sdpa_varlen)
    packing._flash_attn = lambda: shim


class NoWeightSync:
    """TRL's WeightTransferProtocol doing nothing: the rollout fleet syncs its own weights."""

    def init_weight_transfer(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...

    def send_weights(self, iterator: Any) -> None:
        for _ in iterator:
            pass


def tiny_model_dir(path: str) -> PreTrainedTokenizerFast:
    """A one-layer Llama and a WordLevel tokenizer saved to `path` (no hub)."""
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")),
                                        pad_token="<pad>", eos_token="<eos>", padding_side="left")
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=None,
                        help="Kafka address (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if not torch.cuda.is_available():
        print("no CUDA: AsyncGRPOTrainer's peak-FLOPs query and FlashAttention-3 replaced by CPU stand-ins",
              flush=True)
        cpu_stand_ins()
    rng = random.Random(args.seed)
    local = LocalStage.start(args.bootstrap_servers, "trl-grpo-async", commit_interval_s=0.1)
    conn, topics, tag = local.conn, local.topics, local.tag
    status = 0
    try:
        with RolloutProducer(conn, topics.input) as producer:
            for g in range(args.groups):
                completions = [[rng.randrange(10, VOCAB) for _ in range(rng.randint(2, 5))] for _ in range(4)]
                rewards = [rng.choice([0.0, 1.0, rng.random()]) for _ in completions]
                producer.send_group(completion_samples([5, g + 10, 6], completions, rewards, group_index=g,
                                                       run_id=f"trl-{tag}", weight_version=0))
            producer.flush(30)
        with tempfile.TemporaryDirectory() as work:
            model_dir, output_dir = os.path.join(work, "model"), os.path.join(work, "out")
            tokenizer = tiny_model_dir(model_dir)
            initial = list(LlamaForCausalLM.from_pretrained(model_dir).parameters())
            config = dict(output_dir=output_dir, use_cpu=not torch.cuda.is_available(), max_steps=2,
                          token_budget=32, report_to=[], save_strategy="no", dtype="float32",
                          disable_tqdm=True, logging_steps=1)
            prompts = Dataset.from_dict({"prompt": ["w2"] * args.groups})  # TRL asks; the fleet has them
            reader = TrainDataReader(conn, topics.output, f"trl-{tag}", groups_per_batch=1,
                                     max_weight_staleness=2)
            trainer = AsyncGRPOTrainer(model=model_dir, args=AsyncGRPOConfig(**config),
                                       processing_class=tokenizer, train_dataset=prompts,
                                       rollout_worker=StageRolloutWorker(reader, queue_maxsize=256),
                                       weight_transfer=NoWeightSync())  # the rollout fleet's, not TRL's vLLM
            trainer.train()  # starts and stops the rollout worker (its callbacks)
            after = trainer.model.parameters()
            changed = sum(not torch.equal(a, b) for a, b in zip(initial, after, strict=True))
            print(f"done: {trainer.state.global_step} optimizer steps from the stage's groups, {changed} "
                  f"parameter tensors changed; the reader's weight version {reader.weight_version}",
                  flush=True)
            status = 0 if trainer.state.global_step == 2 and changed else 1
    finally:
        local.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
