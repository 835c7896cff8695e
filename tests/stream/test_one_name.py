"""One name per thing across compose, the CLI, its help, its logs and the documentation."""

from __future__ import annotations

import json
import logging
import re
import uuid
from pathlib import Path

import pytest
from kafka.admin import KafkaAdminClient, NewTopic
from typer.testing import CliRunner

from rollout_stream.cli import app
from rollout_stream.clients import Connection
from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.config import WorkerConfig
from rollout_stream.core.records import DeadLettered, InputRecord
from rollout_stream.kafka.kafka_python import raw_producer
from rollout_stream.ops.dlq.record import readable_header
from rollout_stream.worker.outputs import dead_letter_records
from tests.stream.commands.test_cli_help import COMMANDS, options_of
from tests.stream.helpers import new_topics, running_worker, wait_until

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _run_options() -> list:
    """The options of `run` itself (the connection security flags are documented in their own section)."""
    return [o for o in options_of(("run",)) if o.rich_help_panel is None and o.opts != ["--help"]]


# ---- compose and the CLI ------------------------------------------------------------------------------
def test_compose_defaults_are_the_clis():
    compose = (ROOT / "docker-compose.yml").read_text()
    defaults = dict(re.findall(r"^\s+(ROLLOUT_STREAM_\w+): \$\{\1:-([^}]*)\}", compose, re.MULTILINE))
    assert {"ROLLOUT_STREAM_INPUT_TOPIC", "ROLLOUT_STREAM_OUTPUT_TOPIC", "ROLLOUT_STREAM_DEAD_LETTER_TOPIC",
            "ROLLOUT_STREAM_GROUP_ID"} <= defaults.keys()
    by_env = {o.envvar: o for o in _run_options()}
    for env, value in defaults.items():
        assert str(by_env[env].default) == value, (env, value, by_env[env].default)
    assert defaults["ROLLOUT_STREAM_DEAD_LETTER_TOPIC"] == "rollouts-dlq"


# ---- the README's run table -----------------------------------------------------------------------------
def _run_table() -> list[tuple[str, str]]:
    """(flag cell, env cell) of every row of the `rollout-stream run` table (docs/operations.md)."""
    readme = (ROOT / "docs" / "operations.md").read_text()
    section = readme.split("### `rollout-stream run` configuration", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    table = rows[: next((i for i, r in enumerate(rows) if "| code |" in r), len(rows))]
    return [(cells[1], cells[2]) for cells in (row.split("|") for row in table)]


def test_every_run_flag_is_a_row_of_the_readme_table_with_its_environment_variable():
    rows = _run_table()
    for option in _run_options():
        flag = option.opts[0]
        row = next((r for r in rows if f"`{flag}`" in r[0]), None)
        assert row is not None, f"{flag} is not in the README's run table"
        short = "…" + option.envvar.removeprefix("ROLLOUT_STREAM")
        assert f"`{option.envvar}`" in row[1] or f"`{short}`" in row[1], (flag, option.envvar, row)


def test_every_flag_of_the_readme_table_exists():
    known = {f for o in _run_options() for f in o.opts}
    for flags, _env in _run_table():
        for flag in re.findall(r"`(--[a-z-]+)`", flags):
            assert flag in known, flag


# ---- --help names values one way --------------------------------------------------------------------------
def _help(path: tuple[str, ...]) -> str:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "rollout-stream")
def test_help_names_every_value_as_a_type_and_no_flag_takes_one(path):
    text = _help(path)
    assert not re.search(r"<bool>|<list\[|\bTEXT\b|KEY=VALUE", text), text
    for option in options_of(path):
        names = " +".join(re.escape(n) for n in [*option.opts, *option.secondary_opts])
        shown = re.search(rf"│ +(?:\* +)?{names} +(\S*)", text)  # `*`: required
        assert shown, (option.opts, text)
        # a value: `<type>` (`<int range> [x>=1]` too); a flag: straight on to its help
        assert shown.group(1).startswith("<") != option.is_flag, (option.opts, shown.group(0))


def test_a_repeatable_option_shows_the_type_of_one_value():
    assert re.search(r"│ +--reason +<str> ", _help(("dlq", "stats")))
    assert re.search(r"│ +--override +<key=value> ", _help(("broker", "start")))
    assert re.search(r"│ +--sasl-password +<str> ", _help(("run",)))


# ---- dlq show: the original timestamp a person can read ----------------------------------------------------
@pytest.mark.parametrize(
    "name,value,shown",
    [
        ("x-original-timestamp", "1700000000000", "1700000000000 (2023-11-14T22:13:20.000Z)"),
        ("x-original-timestamp", "not a number", "not a number"),
        ("x-original-timestamp", "99999999999999999999", "99999999999999999999"),
        ("x-original-offset", "1700000000000", "1700000000000"),
        ("x-failed-at", "2023-11-14T22:13:20.000Z", "2023-11-14T22:13:20.000Z"),
    ],
)
def test_readable_header(name, value, shown):
    assert readable_header(name, value) == shown


def test_dlq_show_writes_the_original_timestamp_as_a_time_and_json_keeps_the_header(kafka_bootstrap):
    topic = f"names-{uuid.uuid4().hex[:8]}-dlq"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    sample = Sample(group_index=3, index=30, rollout_id=30, reward=1.0, group_size=2, run_id="n",
                    tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 0], rollout_log_probs=[-0.5, -1.0])
    source = InputRecord("rollouts", 0, 41, 1_700_000_000_000, group_key(sample), encode_sample(sample), ())
    producer = raw_producer(Connection(kafka_bootstrap))
    try:
        for r in dead_letter_records(DeadLettered(R.INCOMPLETE_GROUP, "test", "n/3", (source,),
                                                  1_700_000_300_000), topic):
            producer.send(r.topic, key=r.key, value=r.value, headers=r.headers)
        producer.flush()
    finally:
        producer.close()
    args = ["dlq", "show", "0:0", "--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", topic]
    shown = runner.invoke(app, args, env={"COLUMNS": "160"})
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.stdout.splitlines() if "x-original-timestamp" in x)
    assert "1700000000000 (2023-11-14T22:13:20.000Z)" in line
    as_json = runner.invoke(app, [*args, "--json"])
    assert ["x-original-timestamp", "1700000000000"] in json.loads(as_json.stdout)["headers"]


# ---- worker.started --------------------------------------------------------------------------------------
def test_worker_started_logs_the_bootstrap_address_once(kafka_bootstrap, caplog):
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="names")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}")
    with caplog.at_level(logging.INFO, logger="rollout_stream.worker"), running_worker(config):
        wait_until(lambda: any(getattr(r, "event", None) == "worker.started" for r in caplog.records), 30,
                   "worker.started")
    (started,) = [r for r in caplog.records if getattr(r, "event", None) == "worker.started"]
    fields = started.fields  # type: ignore[attr-defined]
    assert fields["bootstrap_servers"] == kafka_bootstrap
    assert not [k for k in fields if k.startswith("bootstrap") and k != "bootstrap_servers"], sorted(fields)
    assert started.getMessage().count(kafka_bootstrap) == 1
