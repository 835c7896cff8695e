"""Secrets are masked where they are rendered, never by searching free text: a short or common-word password
changes no other character of a message (it used to turn `127.0.0.1` into `**********27.0.0.**********`)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rollout_stream.cli import app

LONG = "Zq8-long-and-unlikely-secret-41x"


def dlq_stats_with_password(bootstrap: str, password: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [
        "dlq", "stats", "--bootstrap-servers", bootstrap, "--security-protocol", "SASL_PLAINTEXT",
        "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-username", "u", "--sasl-password", password,
    ])  # fmt: skip
    return result.exit_code, result.output


@pytest.mark.parametrize("password", ["1", "p", "a", ".", "the", "not", "Kafka", "error", "9092", "SASL"])
def test_a_short_or_common_password_changes_no_other_text(kafka_bootstrap, password):
    code, text = dlq_stats_with_password(kafka_bootstrap, password)
    reference_code, reference = dlq_stats_with_password(kafka_bootstrap, LONG)
    assert (code, text) == (reference_code, reference)
    assert code == 2 and "does not expect a SASL login" in text and kafka_bootstrap in text
    assert "*" not in text and LONG not in reference
