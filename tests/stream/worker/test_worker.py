"""The worker on the real broker: every reason and header, ordering, siblings, fallbacks, zero variance,
exact values."""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict

import pytest

from rollout_stream.clients import Connection
from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.config import WorkerConfig, ZeroVariancePolicy
from rollout_stream.core import post_process_rewards
from rollout_stream.kafka.partitioner import murmur2
from rollout_stream.ops.synth import Expected, FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from rollout_stream.topics import TopicSettings, ensure_topics
from rollout_stream.worker.outputs import DLQ_HEADERS
from tests.stream.helpers import new_topics, read_topic, running_worker, train_samples, wait_until

pytestmark = pytest.mark.kafka


def cfg(bootstrap, topics, **kw) -> WorkerConfig:
    kw.setdefault("group_timeout_s", 3.0)
    kw.setdefault("commit_interval_s", 0.2)
    return WorkerConfig(bootstrap_servers=bootstrap, topics=topics, group_id=f"g-{topics.input}", **kw)


def s(gi, rid, reward, *, size=2, sc=1, si=0, run="r", **kw) -> Sample:
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=size, sibling_count=sc,
                  sibling_index=si, run_id=run, tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 0],
                  rollout_log_probs=[-0.25, -1.5], **kw)


def send(bootstrap, topic, items, *, ts=None):
    """Send samples or (key, bytes) pairs; return their (partition, offset) in order."""
    with RolloutProducer(bootstrap, topic=topic) as p:
        futures = [p.send(x, timestamp_ms=ts) if isinstance(x, Sample) else p.send_raw(*x, timestamp_ms=ts)
                   for x in items]
        p.flush()
        return [(f.get(10).partition, f.get(10).offset) for f in futures]


def assert_exact(train, config: WorkerConfig):
    """Every published group equals core's batch API on the same samples, bit for bit."""
    by_group = defaultdict(list)
    for t in train:
        by_group[t.group_key].append(t)
    for key, members in by_group.items():
        raw, values = post_process_rewards([m.sample for m in members], config.reward,
                                           prompt_group_sizes=[len(members)])
        assert [m.raw_reward for m in members] == raw, key
        assert [m.reward for m in members] == values, key
    return by_group


def test_publishes_groups_split_over_polls_and_partitions_with_siblings_in_deterministic_order(
    kafka_bootstrap, kafka_client
):
    topics = new_topics(kafka_bootstrap, partitions=3)
    config = cfg(kafka_bootstrap, topics)
    # Eight groups, interleaved member by member; rollout 1 of each has three siblings sent out of order.
    groups = []
    for g in range(8):
        groups.append([s(g, 0, float(g)), s(g, 1, 2.0 * g + 1, sc=3, si=2), s(g, 1, 2.0 * g + 1, sc=3, si=0),
                       s(g, 1, 2.0 * g + 1, sc=3, si=1)])
    interleaved = [grp[i] for i in range(4) for grp in groups]
    with running_worker(config) as worker:
        # Groups time out 3 s after their first member: send once the worker reads, not while it joins.
        wait_until(lambda: worker.ready, 30, "partitions assigned and restored")
        # One producer: a new idempotent librdkafka producer spends ~0.5 s on its first send (it waits for
        # its producer id), and seven of them would outlast the groups' 3 s timeout.
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
            for i in range(0, len(interleaved), 5):  # many small batches → many polls
                for sample in interleaved[i:i + 5]:
                    producer.send(sample)
                producer.flush()
                time.sleep(0.05)
        wait_until(lambda: worker.stats.groups_published == 8, 30, "8 groups published")
    reads = read_topic(kafka_bootstrap, topics.output, min_count=32)
    train = train_samples(reads)
    assert len(train) == 32
    by_group = assert_exact(train, config)
    for key, members in by_group.items():
        # Rollouts by first arrival, siblings by sibling_index (they were sent 2, 0, 1).
        assert [(m.sample.rollout_id, m.sample.sibling_index) for m in members] == [
            (0, 0), (1, 0), (1, 1), (1, 2)
        ]
        assert {r.key for r in reads if r.value and r.key.decode() == key} == {key.encode()}
        assert members[1].reward == members[2].reward == members[3].reward
        assert members[0].group_rollout_count == 2 and members[0].group_sample_count == 4
    # Outputs keyed by group: all of a group in the partition Java's partitioner gives its key.
    parts = defaultdict(set)
    for r in reads:
        parts[r.key].add(r.partition)
    assert parts and all(p == {(murmur2(k) & 0x7FFFFFFF) % 3} for k, p in parts.items())


def test_every_dead_letter_reason_with_headers_and_original_bytes(kafka_bootstrap):
    topics = new_topics(kafka_bootstrap, partitions=1)
    config = cfg(kafka_bootstrap, topics)
    garbage = (b"r/50", b"\xc1\x00garbage")
    items = [
        garbage,  # decode_error
        s(51, 0, math.nan), s(51, 1, 1.0),  # invalid_sample, whole group (second tagged with the same reason)
        s(52, 11, 2.0, sc=2, si=0), s(52, 12, 1.0), s(52, 11, 6.0, sc=2, si=1),  # shared_reward_violation
        s(53, 0, 1.0, prompt="a"), s(53, 0, 1.0, prompt="b"),  # conflicting_duplicate
        s(54, 0, 1.0),  # incomplete_group (rollout 1 never comes)
        s(55, 0, 1.0), s(55, 1, 0.0), s(55, 2, 0.5),  # published, then late_member
        s(56, 0, 1.0, size=1), s(56, 0, 1.0, size=1),  # identical copy after publication: dropped, counted
    ]
    with running_worker(config) as worker:
        coords = send(kafka_bootstrap, topics.input, items)
        wait_until(
            lambda: worker.stats.dead_lettered[R.INCOMPLETE_GROUP] == 1, 30, "incomplete group timeout"
        )
        assert worker.stats.duplicates == 1
    dlq = read_topic(kafka_bootstrap, topics.dead_letter, min_count=10)
    by_offset = {int(r.headers["x-original-offset"]): r for r in dlq}
    expected = {0: R.DECODE_ERROR, 1: R.INVALID_SAMPLE, 2: R.INVALID_SAMPLE, 3: R.SHARED_REWARD_VIOLATION,
                4: R.SHARED_REWARD_VIOLATION, 5: R.SHARED_REWARD_VIOLATION, 6: R.CONFLICTING_DUPLICATE,
                7: R.CONFLICTING_DUPLICATE, 8: R.INCOMPLETE_GROUP, 11: R.LATE_MEMBER}
    assert {o: R(r.headers["x-dlq-reason"]) for o, r in by_offset.items()} == expected
    for offset, r in by_offset.items():
        assert set(DLQ_HEADERS) <= set(r.headers)
        original = items[offset]
        value = original[1] if isinstance(original, tuple) else encode_sample(original)
        key = original[0] if isinstance(original, tuple) else group_key(original)
        assert (r.key, r.value) == (key, value)  # original bytes unchanged
        assert r.headers["x-original-topic"] == topics.input
        assert int(r.headers["x-original-partition"]) == coords[offset][0]
        assert r.headers["x-stage-version"] and r.headers["x-failed-at"].endswith("Z")
        assert int(r.headers["x-original-timestamp"]) > 0
    assert by_offset[3].headers["x-dlq-message"] == (
        "all samples in rollout 11 must share one reward; rows [0, 1] have rewards [2.0, 6.0]")
    assert by_offset[3].headers["x-group-key"] == "r/52"
    assert "finite" in by_offset[1].headers["x-dlq-message"]
    train = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=3))
    # r/55 published (its third rollout came late); r/56 published once, its identical copy dropped.
    assert Counter(t.group_key for t in train) == {"r/55": 2, "r/56": 1}


@pytest.mark.any_client  # the window rule; the clients only carry the records
def test_group_size_fallback_from_the_stage_setting(kafka_bootstrap):
    topics = new_topics(kafka_bootstrap, partitions=1)
    config = cfg(kafka_bootstrap, topics, group_size=3)
    with running_worker(config) as worker:
        send(kafka_bootstrap, topics.input, [s(1, i, float(i), size=None) for i in range(3)])
        wait_until(lambda: worker.stats.groups_published == 1, 20, "group published")
    train = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=3))
    assert [t.group_rollout_count for t in train] == [3, 3, 3]
    assert_exact(train, config)


@pytest.mark.any_client  # reward arithmetic in core; the clients only carry the records
@pytest.mark.parametrize("mode", ["keep", "drop", "route"])
def test_zero_variance_modes(kafka_bootstrap, mode):
    topics = new_topics(kafka_bootstrap, partitions=1)
    route = f"{topics.input}-zv"
    if mode == "route":  # topics are never auto-created: `run` requires the route topic to exist, too
        ensure_topics(Connection(kafka_bootstrap), data_topics=[route], dead_letter_topics=[],
                      settings=TopicSettings(partitions=1))
    policy = ZeroVariancePolicy(mode, route if mode == "route" else None)  # type: ignore[arg-type]
    config = cfg(kafka_bootstrap, topics, zero_variance=policy)
    with running_worker(config) as worker:
        send(kafka_bootstrap, topics.input, [s(1, 0, 1.0), s(1, 1, 1.0), s(2, 0, 0.0), s(2, 1, 1.0)])
        wait_until(lambda: worker.stats.zero_variance_groups == 1 and
                   worker.stats.groups_published + worker.stats.zero_variance_dropped // 2 == 2,
                   20, "both groups")
    main = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=2))
    assert {t.group_key for t in main} == ({"r/1", "r/2"} if mode == "keep" else {"r/2"})
    if mode == "keep":
        assert [t.reward for t in main if t.group_key == "r/1"] == [0.0, 0.0]
        assert all(t.zero_variance for t in main if t.group_key == "r/1")
    if mode == "route":
        routed = train_samples(read_topic(kafka_bootstrap, route, min_count=2))
        assert {t.group_key for t in routed} == {"r/1"} and len(routed) == 2
    if mode == "drop":
        assert worker.stats.zero_variance_dropped == 2


@pytest.mark.any_client  # reward arithmetic in core; the pipeline per client is tested above
@pytest.mark.parametrize("estimator,norm,std", [("grpo", True, True), ("gspo", True, False),
                                                ("reinforce_plus_plus_baseline", True, True),
                                                ("ppo", True, True), ("grpo", False, True)])
def test_hundreds_of_groups_with_every_fault_are_accounted_for_and_exact(
    kafka_bootstrap, estimator, norm, std
):
    if estimator != "grpo" and norm is False:
        pytest.skip("covered")
    topics = new_topics(kafka_bootstrap, partitions=3)
    config = cfg(kafka_bootstrap, topics, advantage_estimator=estimator, rewards_normalization=norm,
                 grpo_std_normalization=std)
    plan = SynthPlan(group_size=4, max_siblings=3, faults=FaultRates.uniform(0.05), seed=7, run_id="w",
                     tokens=16)
    expected = Expected()
    items = []
    for records, exp in plan_groups(plan, 300 if estimator == "grpo" and std else 80):
        expected.add(exp)
        items += [(r.key, r.value) for r in records]
    with running_worker(config) as worker:
        send(kafka_bootstrap, topics.input, items)
        st = worker.stats
        wait_until(lambda: st.records_in == len(items) and worker.store.open_count() == 0 and
                   st.samples_published + sum(st.dead_lettered.values()) + st.duplicates == len(items), 60,
                   "all records resolved")
        st = worker.stats
        assert st.samples_published == expected.published_samples
        assert st.dead_lettered == Counter({str(k): v for k, v in expected.dead_letters.items()})
        assert st.duplicates == expected.duplicates
        assert len(items) == st.samples_published + sum(st.dead_lettered.values()) + st.duplicates
    train = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=expected.published_samples))
    assert len(train) == expected.published_samples
    assert_exact(train, config)
    dlq = read_topic(kafka_bootstrap, topics.dead_letter, min_count=sum(expected.dead_letters.values()))
    assert Counter(r.headers["x-dlq-reason"] for r in dlq) == Counter(
        {str(k): v for k, v in expected.dead_letters.items()})
    # One reason per group.
    reasons = defaultdict(set)
    for r in dlq:
        if r.headers["x-dlq-reason"] not in ("decode_error", "late_member"):
            reasons[r.headers["x-group-key"]].add(r.headers["x-dlq-reason"])
    assert all(len(v) == 1 for v in reasons.values())
