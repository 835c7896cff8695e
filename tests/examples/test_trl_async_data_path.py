"""TRL's async data path fed by the stage (examples/trl_async_data_path.py): the collated advantages of two
DP rows equal the reference's processed rewards bit for bit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the [trl] extra")

# any client: the example's logic; each client's reader is shown in tests/stream
pytestmark = pytest.mark.any_client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_async_data_path.py"


@pytest.mark.kafka(timeout=150)
def test_trl_async_data_path_carries_the_stages_rewards(kafka_bootstrap):
    command = [sys.executable, str(EXAMPLE), "--bootstrap-servers", kafka_bootstrap, "--groups", "4"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done: 16 samples of 4 groups in the collated batch; advantages equal the reference's rewards " \
        "bit for bit: yes" in proc.stdout
    assert "DIFFERS" not in proc.stdout
