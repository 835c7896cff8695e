"""The example trainer runs end to end in the suite: synth → worker → train-data → reader → optimizer."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

# any client: the example's logic; each client's reader is shown in tests/stream
pytestmark = pytest.mark.any_client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async_trainer.py"


@pytest.mark.kafka(timeout=150)
def test_async_trainer_trains_a_few_steps(kafka_bootstrap):
    command = [sys.executable, str(EXAMPLE), "--bootstrap-servers", kafka_bootstrap, "--steps", "4"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = re.findall(r"^step +(\d+) +loss ([+-]\d+\.\d+) .* groups (\d+) +samples (\d+)", proc.stdout, re.M)
    assert [int(s[0]) for s in steps] == [0, 1, 2, 3], proc.stdout
    for _, loss, groups, samples in steps:
        assert float(loss) == float(loss)  # a number, not nan
        assert int(groups) == 4 and int(samples) >= 4
    assert "done: 4 batches" in proc.stdout
