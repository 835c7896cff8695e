"""TRL's GRPOTrainer takes optimizer steps on the CPU from rollouts that went through the stage
(examples/trl_grpo.py), and re-normalizes the stage's rewards it is handed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the [trl] extra")

# any client: the example's logic; each client's reader is shown in tests/stream
pytestmark = pytest.mark.any_client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


def rows(text: str, name: str) -> list[list[float]]:
    return [[float(v) for v in line.split()] for line in re.findall(rf"^  {name} +(.*)$", text, re.M)]


@pytest.mark.kafka(timeout=240)
def test_grpo_trainer_trains_from_the_stage_and_renormalizes(kafka_bootstrap):
    command = [sys.executable, str(EXAMPLE), "--bootstrap-servers", kafka_bootstrap, "--steps", "3"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"done: 3 optimizer steps, [1-9]\d* parameter tensors changed, 6 groups", proc.stdout)
    stage, trl = rows(proc.stdout, "stage reward"), rows(proc.stdout, "TRL advantage")
    assert len(stage) == len(trl) == 3
    for s, a in zip(stage, trl, strict=True):
        for g in range(0, len(s), 4):  # per prompt group of 4: TRL's (r - mean) / (std + 1e-4) of the stage's
            group, adv = s[g:g + 4], a[g:g + 4]
            mean = sum(group) / 4
            std = (sum((r - mean) ** 2 for r in group) / 3) ** 0.5
            assert adv == pytest.approx([(r - mean) / (std + 1e-4) for r in group], abs=2e-4)
