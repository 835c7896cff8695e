"""`train_records` builds each member's record from one shared template: its bytes must be exactly those of
the plain path (one `TrainSample` per member, `encode_train_sample` embedding the raw input bytes). A group's
head, planned from the group, is exactly the one its decoded train records would give."""

from __future__ import annotations

from itertools import groupby

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.codec import Sample, TrainSample, decode_train_sample, encode_sample, encode_train_sample
from rollout_stream.codec.group_heads import HeadSample, encode_group_head
from rollout_stream.core.assembly import loss_tokens
from rollout_stream.core.collate import collation_problem
from rollout_stream.core.config import RewardConfig
from rollout_stream.core.records import InputRecord, Member, Published
from rollout_stream.core.rewards import GroupRewards
from rollout_stream.core.windows import HeldSample
from rollout_stream.worker.heads import plan_head
from rollout_stream.worker.outputs import STAGE_VERSION, OutputRecord, chunked, train_records

_floats = st.one_of(st.floats(allow_nan=False), st.integers(-5, 5), st.sampled_from([0.0, -0.0, 0.5]))


def _plain(group: Published, reward: RewardConfig, topic: str, partition: int | None) -> list[OutputRecord]:
    """train_records as it was before the template: the definition the fast one is held to."""
    key = group.group_key.encode()
    stats = group.rewards
    out = []
    for member, raw, value in zip(group.members, stats.raw, stats.rewards, strict=True):
        src = member.record
        train = TrainSample(
            sample=member.sample, raw_reward=raw, reward=value, group_key=group.group_key,
            group_rollout_count=stats.rollout_count, group_sample_count=len(group.members),
            group_mean=stats.mean, group_std=stats.std, zero_variance=stats.zero_variance,
            advantage_estimator=reward.advantage_estimator,
            rewards_normalization=reward.rewards_normalization,
            grpo_std_normalization=reward.grpo_std_normalization, reward_key=reward.reward_key,
            source_topic=src.topic, source_partition=src.partition, source_offset=src.offset,
            stage_version=STAGE_VERSION,
        )
        value = encode_train_sample(train, raw_sample=src.value)
        out.append(OutputRecord(topic, key, value, (), src, partition))
    return out


@st.composite
def groups(draw: st.DrawFn) -> Published:
    n = draw(st.integers(1, 5))
    gkey = draw(st.sampled_from(["7", "run/7", "rün/123456789"]))
    members = []
    for i in range(n):
        prompt = "p" * draw(st.integers(0, 40))
        tokens = draw(st.integers(0, 6))
        response = draw(st.integers(0, 7))
        mask = draw(st.none() | st.lists(st.integers(0, 1), min_size=response, max_size=response))
        metadata = draw(st.sampled_from([{}, {"raw_reward": None}, {"raw_reward": 0.25, "k": "v"}]))
        value = encode_sample(Sample(group_index=7, rollout_id=i, reward=0.5, prompt=prompt,
                                     tokens=list(range(tokens)), response_length=response, loss_mask=mask,
                                     remove_sample=draw(st.booleans()), metadata=metadata,
                                     weight_versions=draw(st.lists(st.sampled_from(["3", "4"]), max_size=2))))
        record = InputRecord(draw(st.sampled_from(["rollouts", "t"])), draw(st.integers(0, 300)),
                             draw(st.integers(0, 2**40)), 0, gkey.encode(), value)
        members.append(Member(record, HeldSample(0.5, i, None, 0), i))
    rewards = GroupRewards(raw=[draw(_floats) for _ in range(n)], rewards=[draw(_floats) for _ in range(n)],
                           rollout_count=draw(st.integers(1, 5)), mean=draw(_floats), std=draw(_floats),
                           zero_variance=draw(st.booleans()))
    return Published(gkey, 0, tuple(members), rewards)


@settings(max_examples=300, deadline=None)
@given(groups(), st.sampled_from([RewardConfig(),
                                  RewardConfig(advantage_estimator="reinforce_plus_plus_baseline"),
                                  RewardConfig(reward_key="acc", grpo_std_normalization=False)]),
       st.sampled_from([None, 0, 5]))
def test_train_records_are_byte_identical_to_one_train_sample_per_member(group, reward, partition):
    fast = train_records(group, reward, "train-data", partition)
    plain = _plain(group, reward, "train-data", partition)
    assert [(o.topic, o.key, o.value, o.headers, o.source, o.partition) for o in fast] == \
        [(o.topic, o.key, o.value, o.headers, o.source, o.partition) for o in plain]


def _read_off(head: HeadSample, t: TrainSample) -> HeadSample:
    """`head` with every field its train record tells, read off the decoded record."""
    s = t.sample
    return msgspec.structs.replace(
        head, source_topic=t.source_topic, source_partition=t.source_partition, source_offset=t.source_offset,
        rollout_id=s.rollout_id, index=s.index, tokens=len(s.tokens) if s.tokens is not None else 0,
        response_length=s.response_length, loss_tokens=loss_tokens(t),
        weight_versions=list(s.weight_versions), raw_reward=t.raw_reward, reward=t.reward,
        metadata_raw_reward=s.metadata.get("raw_reward"),
        has_metadata_raw_reward="raw_reward" in s.metadata)


@settings(max_examples=300, deadline=None)
@given(groups(), st.sampled_from([1 << 20, 40, 7]))
def test_a_head_planned_from_the_group_is_the_one_its_train_records_give(group, chunk_bytes):
    train = train_records(group, RewardConfig(), "train-data", 0)
    outs = chunked(train, chunk_bytes)
    pending = plan_head(group, outs)
    assert pending is not None
    decoded = [decode_train_sample(o.value or b"") for o in train]
    head = pending.head
    expected = msgspec.structs.replace(
        head, samples=[_read_off(h, t) for h, t in zip(head.samples, decoded, strict=True)],
        problem=next((p for p in map(collation_problem, decoded) if p is not None), None))
    assert encode_group_head(head) == encode_group_head(expected)
    assert [h.nbytes for h in head.samples] == [len(o.value or b"") for o in train]
    assert [len(list(g)) for _, g in groupby(pending.sample_of)] == [
        -(-len(o.value or b"") // chunk_bytes) for o in train]
