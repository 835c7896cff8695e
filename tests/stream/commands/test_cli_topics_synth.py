"""`rollout-stream topics create`, `rollout-stream synth` and 8 MiB samples end to end, on the real broker."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from collections import defaultdict
from pathlib import Path

import msgspec
import numpy as np
import pytest
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient
from kafka.partitioner.default import murmur2

from rollout_stream.clients import Connection
from rollout_stream.codec import Sample, decode_sample, encode_sample, group_key
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.core import RewardConfig, post_process_rewards
from rollout_stream.ops.synth import Expected, FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from rollout_stream.topics import TopicSettings, ensure_topics
from tests.stream.helpers import joined, new_topics, read_topic, running_worker, train_samples, wait_until

pytestmark = pytest.mark.kafka

EXE = str(Path(sys.executable).with_name("rollout-stream"))
MiB = 1024 * 1024
DAY_MS = 24 * 3600 * 1000


def cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([EXE, *args], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"})
    assert done.returncode == 0, done.stderr
    return done


def topic_configs(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        got = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names],
                                     config_filter="all")
        partitions = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(names)}
    finally:
        admin.close()
    return {n: {**{k: v["value"] for k, v in got["topic"][n].items()}, "partitions": str(partitions[n])}
            for n in names}


def test_topics_create_then_exists_with_large_record_limits_and_long_dead_letter_retention(kafka_bootstrap):
    tag = f"tc-{uuid.uuid4().hex[:8]}"
    names = [f"{tag}-rollouts", f"{tag}-train", f"{tag}-dlq"]
    args = ["topics", "create", "--bootstrap-servers", kafka_bootstrap, "--input-topic", names[0],
            "--output-topic", names[1], "--dead-letter-topic", names[2], "--partitions", "2"]
    first = cli(*args)
    progress = f"{names[1]}.progress"  # for pacing (docs/pacing.md): compacted, one partition
    admission = f"{names[1]}.admission"  # pacing's log: every record kept, stamped by the broker
    heads = f"{names[1]}.heads"  # group heads for rank-local fetch (docs/reader.md)
    assert first.stdout.splitlines() == [f"{n}: created" for n in [*names, heads, progress, admission]]
    second = cli(*args)
    assert second.stdout.splitlines() == [f"{n}: exists" for n in [*names, heads, progress, admission]]
    assert topic_configs(kafka_bootstrap, [progress])[progress]["cleanup.policy"] == "compact"
    log = topic_configs(kafka_bootstrap, [admission])[admission]
    assert (log["cleanup.policy"], log["message.timestamp.type"], log["partitions"]) == (
        "delete", "LogAppendTime", "1"), log

    configs = topic_configs(kafka_bootstrap, names)
    for name in names:
        assert int(configs[name]["max.message.bytes"]) >= 8 * MiB, (name, configs[name]["max.message.bytes"])
        assert configs[name]["partitions"] == "2"
    dlq_retention = int(configs[names[2]]["retention.ms"])
    assert dlq_retention >= 30 * DAY_MS, dlq_retention  # dead-letters are kept for inspection
    assert dlq_retention > int(configs[names[0]]["retention.ms"])


def test_synth_prints_what_the_stage_must_produce_and_sends_records_keyed_by_group(kafka_bootstrap):
    topics = new_topics(kafka_bootstrap, partitions=3, prefix="synth")
    run_id = f"syn-{uuid.uuid4().hex[:6]}"
    done = cli("synth", "--bootstrap-servers", kafka_bootstrap, "--input-topic", topics.input,
               "--groups", "20", "--fault-rate", "0.05", "--seed", "5", "--run-id", run_id)
    printed = json.loads(done.stdout.strip().splitlines()[-1])

    # The same plan, computed here: the printed expectation and the records must match it.
    plan = SynthPlan(group_size=4, faults=FaultRates.uniform(0.05), seed=5, run_id=run_id)
    expected, planned = Expected(), []
    for records, exp in plan_groups(plan, 20):
        expected.add(exp)
        planned += records
    assert printed == {
        "run_id": run_id, "groups": 20, "records": expected.records,
        "expected_published_samples": expected.published_samples,
        "expected_published_groups": expected.published_groups,
        "expected_dead_letters": {str(k): v for k, v in sorted(expected.dead_letters.items())},
        "expected_duplicates": expected.duplicates,
        "due_after_group_timeout": expected.due_after_group_timeout(),
    }
    assert expected.records == len(planned) and sum(expected.dead_letters.values()) > 0  # faults were planned

    got = read_topic(kafka_bootstrap, topics.input, min_count=len(planned))
    assert sorted((r.key, r.value) for r in got) == sorted((r.key, r.value) for r in planned)
    by_key = defaultdict(list)
    for r in sorted(got, key=lambda r: (r.partition, r.offset)):
        by_key[r.key].append(r)
    assert set(by_key) == {f"{run_id}/{g}".encode() for g in range(20)}
    for key, recs in by_key.items():
        assert {r.partition for r in recs} == {(murmur2(key) & 0x7FFFFFFF) % 3}  # one partition per group
        # In the planned order, and every decodable record's key is its group key.
        assert [r.value for r in recs] == [p.value for p in planned if p.key == key]
        for r in recs:
            try:
                s = decode_sample(r.value)
            except Exception:
                continue  # the planned malformed bytes
            assert group_key(s) == key


class _RawTrain(msgspec.Struct, tag="train_sample", tag_field="type"):
    """A train sample with its embedded rollout sample kept as raw bytes."""

    sample: msgspec.Raw


@pytest.mark.kafka(timeout=120)
def test_an_8_mib_sample_passes_through_the_worker_intact(kafka_bootstrap):
    tag = f"big-{uuid.uuid4().hex[:8]}"
    topics = TopicNames(f"{tag}-rollouts", f"{tag}-train", f"{tag}-dlq")
    # The product's own topic layout (what `topics create` and `run` set up).
    ensure_topics(Connection(kafka_bootstrap), data_topics=[topics.input, topics.output],
                  dead_letter_topics=[topics.dead_letter], settings=TopicSettings(partitions=1))
    n_tokens = 8 * MiB // 4 + 1024  # int32 tokens: a little over 8 MiB
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 150_000, n_tokens, dtype=np.int32)
    big = Sample(group_index=0, index=0, rollout_id=0, run_id=tag, group_size=2, reward=1.0, tokens=tokens,
                 response_length=4, loss_mask=[1, 1, 1, 0], rollout_log_probs=np.full(4, -0.5, np.float32))
    small = Sample(group_index=0, index=1, rollout_id=1, run_id=tag, group_size=2, reward=0.0, tokens=[1, 2],
                   response_length=0)
    big_invalid = Sample(group_index=1, index=0, rollout_id=0, run_id=tag, group_size=1, reward=math.nan,
                         tokens=tokens[::-1].copy(), response_length=0)
    values = {"big": encode_sample(big), "small": encode_sample(small), "invalid": encode_sample(big_invalid)}
    assert len(values["big"]) > 8 * MiB and len(values["invalid"]) > 8 * MiB

    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{tag}",
                          group_timeout_s=30, commit_interval_s=0.2)
    with running_worker(config) as worker:
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
            futures = [producer.send(s) for s in (big, small, big_invalid)]
            producer.flush()
            for f in futures:
                f.get(30)  # raises if the broker refused a record
        wait_until(lambda: worker.stats.samples_published == 2
                   and sum(worker.stats.dead_lettered.values()) == 1,
                   60, "the big group published and the big invalid sample dead-lettered")

    # Larger than a record of a default cluster: in and out as chunk records (docs/chunks.md), joined here.
    out = joined(read_topic(kafka_bootstrap, topics.output, min_count=2))
    assert len(out) == 2
    embedded = [bytes(msgspec.msgpack.decode(r.value, type=_RawTrain).sample) for r in out]
    assert embedded == [values["big"], values["small"]]  # the input bytes, unchanged
    train = train_samples(out)
    assert np.array_equal(train[0].sample.tokens.numpy(), tokens)
    _, expected = post_process_rewards([big, small], RewardConfig(), prompt_group_sizes=[2])
    assert [t.reward for t in train] == expected
    dlq = joined(read_topic(kafka_bootstrap, topics.dead_letter, min_count=1))
    assert [(r.key, r.value, r.headers["x-dlq-reason"]) for r in dlq] == [
        (group_key(big_invalid), values["invalid"], "invalid_sample")]
