"""Properties of the window state machine over random interleavings with faults: nothing lost, values
exact."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.codec import DecodeError, Sample, decode_sample, encode_sample, group_key
from rollout_stream.core import RewardConfig, post_process_rewards
from rollout_stream.core.records import DeadLettered, DuplicateDropped, InputRecord, Published
from rollout_stream.core.windows import WindowConfig, WindowStore

rewards = st.sampled_from([0.0, 0.5, 1.0, 2.0, math.nan])


@st.composite
def streams(draw):
    groups = draw(st.integers(1, 6))
    records: list[tuple[bytes | None, bytes]] = []
    for g in range(groups):
        size = draw(st.integers(1, 4))
        for r in range(size + draw(st.integers(0, 1))):  # sometimes one rollout too many
            nsib = draw(st.integers(1, 3))
            base = draw(rewards)
            for si in range(nsib):
                reward = draw(st.one_of(st.just(base), rewards))
                sample = Sample(group_index=g, rollout_id=r, reward=reward, group_size=size,
                                sibling_count=nsib, sibling_index=si)
                if draw(st.integers(0, 9)) == 0:
                    continue  # a member that never arrives
                value = encode_sample(sample)
                records.append((group_key(sample), value))
                if draw(st.integers(0, 9)) == 0:
                    records.append((group_key(sample), value))  # identical copy
        if draw(st.integers(0, 9)) == 0:
            records.append((str(g).encode(), b"\x92garbage"))
    order = draw(st.permutations(range(len(records))))
    return [records[i] for i in order]


@settings(max_examples=150, deadline=None)
@given(streams(), st.sampled_from(["grpo", "gspo", "reinforce_plus_plus_baseline", "ppo"]))
def test_every_record_is_resolved_exactly_once_and_published_values_equal_the_batch_api(records, estimator):
    cfg = RewardConfig(advantage_estimator=estimator)
    store = WindowStore(WindowConfig(reward=cfg, group_timeout_ms=1_000))
    resolved: list[int] = []
    outcomes = []
    for offset, (key, value) in enumerate(records):
        rec = InputRecord("in", 0, offset, 0, key, value)
        try:
            decoded = decode_sample(value)
        except DecodeError as e:
            decoded = e
        outcomes += store.accept(rec, decoded, now_ms=0)
    outcomes += store.expire(now_ms=10**12, partitions={0})
    for out in outcomes:
        resolved += [r.offset for r in out.records]
        if isinstance(out, Published):
            samples = [m.sample for m in out.members]
            raw, values = post_process_rewards(samples, cfg, prompt_group_sizes=[len(samples)])
            assert out.rewards.rewards == values and out.rewards.raw == raw
        elif isinstance(out, DeadLettered):
            assert out.message
        else:
            assert isinstance(out, DuplicateDropped)
    assert sorted(resolved) == list(range(len(records)))
    assert store.open_count() == 0 and store.open_bytes == 0
