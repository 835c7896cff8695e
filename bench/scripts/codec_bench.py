"""Codec benchmark: packed-array records (codec/) vs the same data as plain msgspec lists.

Run: .venv/bin/python bench/scripts/codec_bench.py [--tokens 32768] [--repeats 7] [--json]

A sample of N tokens (int32) whose second half is the response: loss_mask (int32, what `Array` infers
from a list of 0/1 ints) and rollout_log_probs (float32) of N/2 items each. The baseline is a parallel
msgspec Struct with list[int]/list[float] fields, encoded and decoded with reused MessagePack
encoder/decoder objects, which is what "just use msgspec" would give.

Each operation is timed with time.perf_counter over `number` calls per repeat (chosen so one repeat
takes >= --min-repeat-seconds), after a warm-up; the reported time is the median over repeats,
per call. MB/s is the array payload (tokens + loss_mask + log-probs as packed bytes, 10^6 bytes per MB)
divided by that time, so both codecs are measured on the same useful data.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import torch

from rollout_stream.codec import Sample, decode_sample, encode_sample


class PlainSample(msgspec.Struct, kw_only=True, tag="rollout_sample", tag_field="type"):
    """The baseline: the same record with plain lists instead of packed arrays."""

    schema_version: int = 1
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | str | None = None
    tokens: list[int] = msgspec.field(default_factory=list)
    response_length: int = 0
    reward: float | None = None
    loss_mask: list[int] = msgspec.field(default_factory=list)
    rollout_log_probs: list[float] = msgspec.field(default_factory=list)
    status: str = "completed"
    group_size: int | None = None
    sibling_count: int = 1
    sibling_index: int = 0
    run_id: str | None = None


_plain_encoder = msgspec.msgpack.Encoder()
_plain_decoder = msgspec.msgpack.Decoder(PlainSample)


def make_data(n_tokens: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    response = n_tokens // 2
    tokens = rng.integers(0, 151_936, size=n_tokens, dtype=np.int32)  # a Qwen-sized vocabulary
    loss_mask = (rng.random(response) > 0.1).astype(np.int32)
    log_probs = np.log(rng.random(response, dtype=np.float32) + np.float32(1e-6)).astype(np.float32)
    return tokens, loss_mask, log_probs


def _common(n_tokens: int) -> dict[str, Any]:
    return dict(
        group_index=42, index=7, rollout_id=7, response_length=n_tokens // 2, reward=1.0,
        group_size=8, run_id="bench",
    )  # fmt: skip


def plain_to_torch(s: PlainSample) -> tuple[torch.Tensor, ...]:
    return (
        torch.tensor(s.tokens, dtype=torch.int32),
        torch.tensor(s.loss_mask, dtype=torch.int32),
        torch.tensor(s.rollout_log_probs, dtype=torch.float32),
    )


def codec_to_torch(s: Sample) -> tuple[torch.Tensor, ...]:
    return (s.tokens.tensor(), s.loss_mask.tensor(), s.rollout_log_probs.tensor())  # type: ignore[union-attr]  # made with all three arrays just above


def measure(fn: Callable[[], Any], repeats: int, min_repeat_seconds: float) -> float:
    """Median seconds per call of `fn` over `repeats` timed runs, after warm-up."""
    for _ in range(3):
        fn()
    number = 1
    while True:  # calibrate: enough calls that one repeat is long enough to time reliably
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        if time.perf_counter() - t0 >= min_repeat_seconds:
            break
        number *= 2
    per_call = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        per_call.append((time.perf_counter() - t0) / number)
    return statistics.median(per_call)


def run(n_tokens: int, repeats: int, min_repeat_seconds: float) -> dict[str, Any]:
    tokens, loss_mask, log_probs = make_data(n_tokens)
    payload = tokens.nbytes + loss_mask.nbytes + log_probs.nbytes
    sample = Sample(tokens=tokens, loss_mask=loss_mask, rollout_log_probs=log_probs, **_common(n_tokens))  # type: ignore[arg-type]  # numpy arrays encode as the packed arrays they stand for
    plain = PlainSample(
        tokens=tokens.tolist(), loss_mask=loss_mask.tolist(), rollout_log_probs=log_probs.tolist(),
        **_common(n_tokens),
    )  # fmt: skip
    codec_bytes = encode_sample(sample)
    plain_bytes = _plain_encoder.encode(plain)

    # Both paths must carry the same data, or the comparison means nothing.
    back, plain_back = decode_sample(codec_bytes), _plain_decoder.decode(plain_bytes)
    for ours, theirs in zip(codec_to_torch(back), plain_to_torch(plain_back), strict=True):
        assert torch.equal(ours, theirs)

    ops: dict[str, dict[str, Callable[[], Any]]] = {
        "encode": {
            "codec": lambda: encode_sample(sample),
            "plain": lambda: _plain_encoder.encode(plain),
        },
        "decode": {
            "codec": lambda: decode_sample(codec_bytes),
            "plain": lambda: _plain_decoder.decode(plain_bytes),
        },
        "encode+decode": {
            "codec": lambda: decode_sample(encode_sample(sample)),
            "plain": lambda: _plain_decoder.decode(_plain_encoder.encode(plain)),
        },
        "decode→torch": {
            "codec": lambda: codec_to_torch(decode_sample(codec_bytes)),
            "plain": lambda: plain_to_torch(_plain_decoder.decode(plain_bytes)),
        },
    }
    rows = []
    for op, impls in ops.items():
        seconds = {name: measure(fn, repeats, min_repeat_seconds) for name, fn in impls.items()}
        rows.append(
            {
                "op": op,
                "codec_us": seconds["codec"] * 1e6,
                "plain_us": seconds["plain"] * 1e6,
                "codec_MBps": payload / seconds["codec"] / 1e6,
                "plain_MBps": payload / seconds["plain"] / 1e6,
                "speedup": seconds["plain"] / seconds["codec"],
            }
        )
    return {
        "tokens": n_tokens,
        "response_length": n_tokens // 2,
        "payload_bytes": payload,
        "codec_encoded_bytes": len(codec_bytes),
        "plain_encoded_bytes": len(plain_bytes),
        "repeats": repeats,
        "python": platform.python_version(),
        "msgspec": msgspec.__version__,
        "numpy": np.__version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"sample: {result['tokens']} tokens (int32), response {result['response_length']} "
        f"(loss_mask int32, rollout_log_probs float32); array payload {result['payload_bytes']:,} B",
        f"encoded size: codec {result['codec_encoded_bytes']:,} B, "
        f"plain lists {result['plain_encoded_bytes']:,} B",
        "",
        "| op | codec µs | plain µs | codec MB/s | plain MB/s | speed-up |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['op']} | {r['codec_us']:,.1f} | {r['plain_us']:,.1f} | {r['codec_MBps']:,.0f} "
            f"| {r['plain_MBps']:,.0f} | {r['speedup']:,.1f}× |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768, help="tokens per sample (default 32768)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats per op (default 7)")
    parser.add_argument(
        "--min-repeat-seconds", type=float, default=0.05, help="minimum length of one repeat (default 0.05)"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.tokens < 2 or args.repeats < 1:
        parser.error("--tokens must be >= 2 and --repeats >= 1")
    result = run(args.tokens, args.repeats, args.min_repeat_seconds)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
