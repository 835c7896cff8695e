"""Staleness by group, rollout and token on the real broker, through the whole loop: rollout processes whose
rollouts are updated mid-generation (version spans) run ahead of a slow 2-rank trainer (their policy lag
above its bound), and the trainer trains the same dataset once per grain. Every prompt of the first epoch
trains once whatever the grain; what each grain skipped, left out and had regenerated is printed (the
figures docs/reader.md gives come from `bench/scripts/prompt_loop_processes.py` with these settings).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka(timeout=420), pytest.mark.any_client]

HARNESS = Path(__file__).resolve().parents[3] / "bench/scripts/prompt_loop_processes.py"
SETTINGS = ["--prompts", "200", "--faults", "off", "--spans", "on", "--policy-lag", "7", "--step-s", "0.2",
            "--rollout-processes", "2", "--timeout", "240", "--train-epochs", "2.8",
            "--declared-epochs", "3", "--until-settled"]


def test_each_grain_trains_every_prompt_once_and_counts_what_it_left_out(kafka_bootstrap, kafka_client,
                                                                          tmp_path):
    grains = {}
    for grain in ("group", "rollout", "token"):
        out = tmp_path / grain
        run = subprocess.run([sys.executable, str(HARNESS), "--bootstrap", kafka_bootstrap,
                              "--client", kafka_client or "confluent", "--staleness", grain, *SETTINGS,
                              "--out", str(out)], capture_output=True, text=True, timeout=360)
        [result] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        assert "error" not in result, (result["error"], run.stdout[-3000:], run.stderr[-3000:])
        assert result["ok"] and result["problems"] == [], result["problems"]
        epoch = result["epoch0"]
        assert epoch["trained"] + sum(epoch["not_trained"].values()) == 200, epoch
        grains[grain] = {**result["grain"], "run_s": result["run_s"], "not_trained": epoch["not_trained"],
                         "trained_share": result["trained_share"]}
    print("\nstaleness grains", kafka_client, json.dumps(grains))
    assert grains["group"]["rollouts_left_out"] == grains["group"]["tokens_left_out"] == 0  # whole or none
