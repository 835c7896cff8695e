"""Pacing at the deployment's shape, on the real broker and each client: 8 producer processes, 3 partitions,
a worker and a trainer process, every producer bursting at the same instants, one producer killed in the
middle of a group, the trainer killed -9 and restarted on its committed step (docs/pacing.md).

One run in `make test`, on the first client: the rule shown sits above the Kafka seam, and the paced
producers of test_prompt_deployment.py run on both clients there; the other client's run is in the long
tier. `bench/scripts/pacing_processes.py` runs the same with `--runs` repeated for the ten-run
acceptance and the figures in docs/pacing.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka(timeout=300), pytest.mark.any_client]

HARNESS = Path(__file__).resolve().parents[3] / "bench/scripts/pacing_processes.py"
DURATION_S = 30


def test_eight_producer_processes_a_kill_and_a_trainer_restart_skip_no_admitted_group(
        kafka_bootstrap, kafka_client, tmp_path):
    out = tmp_path / "runs"
    run = subprocess.run(
        [sys.executable, str(HARNESS), "--bootstrap", kafka_bootstrap, "--runs", "paced:-2",
         "--duration", str(DURATION_S), "--producers", "8", "--partitions", "3",
         "--client", kafka_client or "confluent", "--burst-every", "5", "--kill-producer-at", "6",
         "--restart-trainer-at", "20", "--out", str(out)],
        capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    [result] = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    print("\npacing deployment", kafka_client, json.dumps(result.get("deployment")))
    assert "error" not in result, (result["error"], run.stdout[-3000:])
    d = result["deployment"]
    assert result["producer_died_mid_group"] == [f"pm-{result['tag']}-p0"], result
    assert result["trainer_killed_at_s"] >= 20, result
    assert d["skipped_stale"] == 0, d  # max_policy_lag == max_weight_staleness: no admitted group is skipped
    assert max(int(lag) for lag in d["policy_lag"]) <= 1, d
    # the trainer went on training through the producer's death and after its own restart
    batches = [json.loads(line) for line in next(out.glob("logs/*/batches.jsonl")).read_text().splitlines()]
    after_kill = [b["t"] for b in batches if b["incarnation"] == 0 and b["t"] > 6 + 5]
    assert after_kill, [(b["incarnation"], b["t"]) for b in batches]
    assert any(b["incarnation"] == 1 for b in batches), [(b["incarnation"], b["t"]) for b in batches]
