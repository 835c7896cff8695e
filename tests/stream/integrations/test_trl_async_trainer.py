"""TRL's real AsyncGRPOTrainer trains on the stage: StageRolloutWorker as its rollout worker, two optimizer
steps on the CPU, the advantages reaching its loss the stage's rewards bit for bit.

The trainer needs a GPU in two places, patched here for the test only: `__init__` asks torch.cuda for the
device's peak FLOPs (`get_peak_flops_per_device` → None), and its tree attention calls FlashAttention-3
fetched from the hub (the kernel loader returns a CPU SDPA of the same varlen call instead)."""

from __future__ import annotations

import os
import random
import types

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytest.importorskip("trl", reason="the [trl] extra")
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from tokenizers.models import WordLevel  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl.experimental.async_grpo import (  # noqa: E402
    AsyncGRPOConfig,
    AsyncGRPOTrainer,
    async_grpo_trainer,
    packing,
)

from rollout_stream.config import WorkerConfig  # noqa: E402
from rollout_stream.integrations.trl import StageRolloutWorker  # noqa: E402
from rollout_stream.producer import RolloutProducer  # noqa: E402
from rollout_stream.reader import TrainDataReader  # noqa: E402
from tests.stream.helpers import new_topics, running_worker, wait_until  # noqa: E402
from tests.stream.integrations.groups import committed_batch, make_groups  # noqa: E402

VOCAB = 512  # the test groups' token ids stay below it


def sdpa_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale=None, causal=True, window_size=(-1, -1),
                **_):
    """flash_attn_varlen_func on the CPU: per segment, causal aligned at the end of its keys (FA's rule)."""
    out = torch.empty_like(q)
    for s in range(len(cu_q) - 1):
        qs = q[cu_q[s]:cu_q[s + 1]].transpose(0, 1)
        ks, vs = (x[cu_k[s]:cu_k[s + 1]].transpose(0, 1) for x in (k, v))
        mask = torch.ones(qs.shape[1], ks.shape[1], dtype=torch.bool).tril(diagonal=ks.shape[1] - qs.shape[1])
        out[cu_q[s]:cu_q[s + 1]] = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, scale=softmax_scale).transpose(0, 1)
    return out


class NoWeightSync:
    """WeightTransferProtocol doing nothing: the rollout fleet syncs its own weights."""

    def init_weight_transfer(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...

    def send_weights(self, iterator) -> None:
        for _ in iterator:
            pass


class RecordingTrainer(AsyncGRPOTrainer):
    """The real trainer, keeping the loss inputs' advantages and segments."""

    seen: list[tuple[torch.Tensor, torch.Tensor]]

    def compute_loss(self, model, inputs, *args, **kwargs):
        selected = inputs["token_index"] >= 0
        self.seen.append((inputs["advantages"][selected].clone(), inputs["segment_id"][selected].clone()))
        return super().compute_loss(model, inputs, *args, **kwargs)


def tiny_model_dir(path) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="<pad>")),
                                        pad_token="<pad>", eos_token="<eos>", padding_side="left")
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         pad_token_id=0, eos_token_id=1)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return tokenizer


def bits(x: float) -> int:
    return int(torch.tensor(x, dtype=torch.float32).view(torch.int32).item())


@pytest.mark.any_client
@pytest.mark.kafka(timeout=180)
def test_async_grpo_trainer_trains_on_the_stages_rewards(kafka_bootstrap, unique_group_id, tmp_path,
                                                        monkeypatch):
    monkeypatch.setattr(async_grpo_trainer, "get_peak_flops_per_device", lambda *a, **k: None)
    shim = types.SimpleNamespace(flash_attn_varlen_func=sdpa_varlen)
    monkeypatch.setattr(packing, "_flash_attn", lambda: shim)
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="trl-async")
    groups = make_groups(random.Random(11), 8, rollouts=(2, 4), max_siblings=2, run_id="async")
    expected = {bits(r) for g in groups for r in g.rewards}
    tokenizer = tiny_model_dir(tmp_path / "model")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"w-{topics.input}",
                          group_timeout_s=5.0, commit_interval_s=0.2)
    with running_worker(config), RolloutProducer(kafka_bootstrap, topics.input) as producer:
        for g in groups:
            producer.send_group(g.samples)
        producer.flush(30)
        reader = TrainDataReader(kafka_bootstrap, topics.output, unique_group_id, groups_per_batch=1,
                                 start="earliest", partition_idle_ms=200)
        worker = StageRolloutWorker(reader, queue_maxsize=64, poll_s=0.2)
        args = AsyncGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, max_steps=2, token_budget=32,
                               report_to=[], logging_steps=1, save_strategy="no", dtype="float32",
                               disable_tqdm=True, max_staleness=100)
        trainer = RecordingTrainer(model=str(tmp_path / "model"), args=args, processing_class=tokenizer,
                                   train_dataset=Dataset.from_dict({"prompt": ["w2"] * 8}),
                                   rollout_worker=worker, weight_transfer=NoWeightSync())
        trainer.seen = []
        before = [p.detach().clone() for p in trainer.model.parameters()]
        try:
            trainer.train()  # starts and stops the worker (its TrainBegin/TrainEnd callbacks)
        finally:
            worker.stop()
        assert trainer.state.global_step == 2
        assert any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
        # every loss term's advantage is a stage reward, one per sample (segment)
        assert trainer.seen
        for advantages, segments in trainer.seen:
            for segment in segments.unique().tolist():
                values = set(advantages[segments == segment].view(torch.int32).tolist())
                assert len(values) == 1 and values <= expected
        # the trainer's model-version updates moved the reader's weight version and commits
        assert reader.weight_version is not None and reader.weight_version >= 2
        wait_until(lambda: committed_batch(kafka_bootstrap, topics.output, unique_group_id, 2) is not None,
                   20, "a commit after training")
