"""normalize_group benchmark: the previous all-torch implementation vs the current one, per group.

Run: .venv/bin/python bench/scripts/normalize_bench.py [--repeats 7] [--number 20000] [--json]

One prompt group of 8 or 16 samples, one per rollout (the stream's shape), with typical rewards:
binary {0, 1}, quarters {0, 0.25, 0.5, 0.75, 1}, and reward-model-like floats (whose sums are not
exact, so torch still computes mean and std). Config: grpo with std normalization. The "old" function
is `_reference_normalize_group` from tests/core/test_rewards_fastpath.py, a verbatim copy of the
implementation before the fast path. Each case is first checked to give bit-identical results.

Timing: timeit, `--number` calls per repeat, best of `--repeats` (the least disturbed run), in µs per
group. Both run in one process, one after the other, on the same inputs.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import platform
import random
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rollout_stream.codec import Sample
from rollout_stream.core import GroupRewards, RewardConfig, normalize_group

TEST_MODULE = Path(__file__).resolve().parents[4] / "tests" / "core" / "test_rewards_fastpath.py"


def _load_reference() -> Any:
    spec = importlib.util.spec_from_file_location("rollout_stream_normalize_reference", TEST_MODULE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def make_group(kind: str, size: int, seed: int = 0) -> list[Sample]:
    rng = random.Random(seed)
    draw: dict[str, Callable[[], float]] = {
        "binary": lambda: rng.choice([0.0, 1.0]),
        "quarters": lambda: rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]),
        "rm-scores": lambda: rng.gauss(0.0, 1.5),
    }
    return [Sample(group_index=0, rollout_id=k, reward=draw[kind]()) for k in range(size)]


def per_group_us(
    fn: Callable[..., Any], samples: list[Sample], cfg: RewardConfig, number: int, repeats: int
) -> float:
    """Best-of-`repeats` µs per `fn(samples, cfg)` call."""
    call = functools.partial(fn, samples, cfg)
    call()  # warm-up
    return min(timeit.repeat(call, number=number, repeat=repeats)) / number * 1e6


def run(number: int, repeats: int) -> dict[str, Any]:
    reference = _load_reference()
    cfg = RewardConfig()
    rows = []
    for size in (8, 16):
        for kind in ("binary", "quarters", "rm-scores"):
            samples = make_group(kind, size)
            old_fn = reference._reference_normalize_group
            old, new = old_fn(samples, cfg), normalize_group(samples, cfg)
            assert isinstance(new, GroupRewards) and reference.identity(new) == reference.identity(old)
            old_us = per_group_us(old_fn, samples, cfg, number, repeats)
            new_us = per_group_us(normalize_group, samples, cfg, number, repeats)
            rows.append(
                dict(group=f"g{size}", rewards=kind, old_us=old_us, new_us=new_us, speedup=old_us / new_us)
            )
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "torch_threads": torch.get_num_threads(),
        "number": number,
        "repeats": repeats,
        "rows": rows,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        f"normalize_group, grpo, one sample per rollout; best of {result['repeats']} x "
        f"{result['number']} calls (python {result['python']}, torch {result['torch']})",
        "",
        "| group | rewards | old µs/group | new µs/group | speed-up |",
        "|---|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['group']} | {r['rewards']} | {r['old_us']:.1f} | {r['new_us']:.1f} | {r['speedup']:.1f}× |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000, help="calls per timed repeat (default 20000)")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats, best kept (default 7)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.number < 1 or args.repeats < 1:
        parser.error("--number and --repeats must be >= 1")
    result = run(args.number, args.repeats)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
