"""verl's fully-async data path through the stage (examples/verl_data_path.py): the queue as a Ray actor built
from its configuration, reached through verl's `MessageQueueClient` (the smoke test of the actor wiring), and
verl's own batch assembly and advantage computation on the stage's groups, the pass-through estimator bit for
bit. tests/stream/integrations/test_verl_ray.py restarts the actor while verl drains it (the long tier)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl", reason="the [verl] extra")

# any client: the example's logic; each client's reader is shown in tests/stream
pytestmark = pytest.mark.any_client

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "verl_data_path.py"


@pytest.mark.kafka(timeout=300)
def test_verl_data_path_trains_on_the_stages_rewards(kafka_bootstrap):
    command = [sys.executable, str(EXAMPLE), "--bootstrap-servers", kafka_bootstrap, "--prompts", "4"]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=290)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "starting a local Ray runtime" in proc.stdout
    assert "13 rows through the stage; the pass-through advantages equal the stage's rewards bit for bit: " \
        "yes" in proc.stdout
    # the single-response prompt: the stage gives 0, verl's GRPO r / (1 + 1e-6)
    number = r" +([+-]?\d\.\d+)"
    single = re.search(rf"^ *\S+/3{number * 4}$", proc.stdout, re.M)
    assert single, proc.stdout
    raw, stage, passed, grpo = map(float, single.groups())
    assert stage == passed == 0.0 and grpo == pytest.approx(raw / (1 + 1e-6), abs=1e-6)
