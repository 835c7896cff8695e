"""The loop at a deployment's shape, on the real broker (`make test`: the first client; the long tier: the
other): 2,000 prompts for one and a half
epochs, a fifth of them with rollouts 5x longer, 4 rollout processes, the stage and a 2-rank trainer, each
its own OS process; a rollout process killed -9 mid-group, one SIGSTOPped past its lease with two or more
takes waiting and resumed, the stage killed -9 and the trainer killed -9, each started again (docs/loop.md,
"Through any crash").

One run here; `bench/scripts/prompt_loop_processes.py --runs 10 --client C` is the ten-run acceptance per
client whose figures docs/loop.md gives.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka(timeout=420), pytest.mark.any_client]

HARNESS = Path(__file__).resolve().parents[3] / "bench/scripts/prompt_loop_processes.py"


def test_every_prompt_of_the_first_epoch_trains_once_through_kills_of_every_part(
        kafka_bootstrap, kafka_client, tmp_path):
    out = tmp_path / "runs"
    run = subprocess.run([sys.executable, str(HARNESS), "--bootstrap", kafka_bootstrap, "--client",
                          kafka_client or "confluent", "--prompts", "2000", "--timeout", "300",
                          "--out", str(out)], capture_output=True, text=True, timeout=400)
    [result] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    shown = ("run_s", "epoch0", "trained_share", "skipped_stale", "skipped_superseded", "dead_letters",
             "events")
    print("\nprompt loop deployment", kafka_client, json.dumps({k: result.get(k) for k in shown}))
    assert "error" not in result, (result["error"], run.stdout[-3000:], run.stderr[-3000:])
    assert result["problems"] == [] and result["ok"], result["problems"]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # every fault happened, and the first epoch settled: each prompt trained once or dead-lettered once
    assert set(result["events"]) >= {"rollout_killed", "rollout_stopped", "rollout_resumed", "stage_killed",
                                     "trainer_killed", "trainer_done"}, result["events"]
    assert result["rollout_died_mid_group"].startswith("loop@"), result
    epoch = result["epoch0"]
    assert epoch["trained"] + sum(epoch["not_trained"].values()) == 2000, epoch
    assert epoch["reissued_by"].get("lease", 0) >= 1, epoch  # the killed process's prompts came back
    # the frozen process held two or more waiting takes when it stopped, and no prompt was exhausted for it
    assert result["frozen_waiting_takes"] >= 2, result
    assert not any(k.startswith("exhausted") for k in epoch["not_trained"]), epoch
    share = result["trained_share"]
    assert abs(share["long"] - share["short"]) <= 0.02, share
