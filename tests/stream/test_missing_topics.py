"""A typo in a topic name is an error naming the topic, never a new topic: the local broker does not
auto-create, and every command checks the topics it reads or writes before it touches them. The producer
helper fails as fast and as clearly as the CLI."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rollout_stream.broker.properties import server_properties
from rollout_stream.clients import BrokerUnreachable
from rollout_stream.producer import RolloutProducer
from rollout_stream.topics import MissingTopic
from tests.stream.helpers import new_topics

EXE = str(Path(sys.executable).with_name("rollout-stream"))


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in result.stderr.splitlines() if "error:" in ln]


def test_the_local_broker_never_auto_creates_topics(tmp_path):
    props = server_properties(port=9092, controller_port=9093, log_dirs=tmp_path)
    assert "auto.create.topics.enable=false" in props.splitlines()


@pytest.fixture
def typo() -> str:
    return f"nosuch-{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("command", [
    ("synth", "--input-topic", "{typo}", "--groups", "2"),
    ("run", "--input-topic", "{typo}"),
    ("run", "--output-topic", "{typo}"),
    ("tail", "--output-topic", "{typo}", "--groups", "1"),
    ("dlq", "replay", "--dead-letter-topic", "{typo}"),
    ("dlq", "stats", "--dead-letter-topic", "{typo}"),
])
def test_a_missing_topic_is_named_in_one_line_and_nothing_is_created(kafka_bootstrap, kafka_admin, typo,
                                                                     command):
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="miss")
    base = {"run": ["--input-topic", topics.input, "--output-topic", topics.output, "--dead-letter-topic",
                    topics.dead_letter, "--group-id", f"miss-{typo}"]}.get(command[0], [])
    args = [a.format(typo=typo) for a in command]
    # a later flag wins: the typo replaces one of the good names
    result = cli(*args[:2 if command[0] == "dlq" else 1], "--bootstrap-servers", kafka_bootstrap, *base,
                 *args[2 if command[0] == "dlq" else 1:])
    assert result.returncode in (1, 2), result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and typo in lines[0] and "not exist" in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    time.sleep(0.5)
    left = [t for t in kafka_admin.list_topics() if typo in t]
    assert left == [], f"{' '.join(command)} created {left}"


def test_the_producer_helper_names_a_missing_topic_at_once(kafka_bootstrap, typo):
    started = time.monotonic()
    with pytest.raises(MissingTopic) as missing:
        RolloutProducer(kafka_bootstrap, topic=typo)
    assert time.monotonic() - started < 5
    assert repr(typo) in str(missing.value) and kafka_bootstrap in str(missing.value)


def test_the_producer_helper_fails_fast_and_names_an_unreachable_broker():
    started = time.monotonic()
    with pytest.raises(BrokerUnreachable) as unreachable:
        RolloutProducer("127.0.0.1:1", topic="rollouts")
    assert time.monotonic() - started < 5
    assert "127.0.0.1:1" in str(unreachable.value)
