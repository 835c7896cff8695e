"""The miles examples run end to end in the suite: send_many → worker → two miles-layout DP ranks."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

# any client: the example's logic; each client's reader is shown in tests/stream
pytestmark = pytest.mark.any_client

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.kafka(timeout=150)
@pytest.mark.parametrize("balance", [False, True])
def test_miles_trainer_gives_two_ranks_every_sample_of_each_batch_once(kafka_bootstrap, balance):
    command = [sys.executable, str(EXAMPLES / "miles_trainer.py"), "--bootstrap-servers", kafka_bootstrap,
               "--batches", "2", *(["--balance-data"] if balance else [])]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=140)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.findall(
        r"^batch (\d): the two shards hold every sample once: yes$", proc.stdout, re.M
    ) == ["0", "1"]
    ranks = re.findall(r"^batch \d rank (\d): (\d+) of (\d+) samples", proc.stdout, re.M)
    assert len(ranks) == 4 and all(int(n) > 0 for _, n, _ in ranks)
    if balance:
        assert all(int(n) * 2 == int(whole) for _, n, whole in ranks)


@pytest.mark.kafka(timeout=60)
def test_miles_publish_sends_whole_groups(kafka_bootstrap, topic_factory):
    topic = topic_factory(2)
    proc = subprocess.run([sys.executable, str(EXAMPLES / "miles_publish.py"), "--bootstrap-servers",
                           kafka_bootstrap, "--topic", topic, "--groups", "3"],
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"published 3 prompt groups \(\d+ samples\)", proc.stdout)
