"""TRL's AsyncGRPOTrainer takes optimizer steps from the stage's groups (examples/trl_async_grpo.py): the
trainer construction docs/integrations.md shows, run as written (on the CPU, with the example's stand-ins for
the trainer's two GPU-only parts). tests/stream/integrations/test_trl_async_trainer.py checks the advantages
reaching its loss."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the [trl] extra")

# any client: the example's logic; each client's reader is shown in tests/stream
pytestmark = pytest.mark.any_client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_async_grpo.py"


@pytest.mark.kafka(timeout=240)
def test_async_grpo_trainer_trains_from_the_stage(kafka_bootstrap):
    command = [sys.executable, str(EXAMPLE), "--bootstrap-servers", kafka_bootstrap, "--groups", "8"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done: 2 optimizer steps from the stage's groups" in proc.stdout
    assert "replaced by CPU stand-ins" in proc.stdout  # said before the trainer is built
