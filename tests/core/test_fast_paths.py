"""The record path's fast paths against the full rules they shortcut, on random valid and invalid input.

* `plainly_valid` may only accept what `validate_sample` accepts, with the same group key, and must accept
  the common case (a finite float reward without a reward key), or it saves nothing.
* A `WindowStore` with its fast paths (`plainly_valid`, `_add_rollout`) decides exactly what one without
  them decides: same outcomes (reasons, messages, records, reward bits), same closed-group memory.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec import DecodeError, Sample, decode_sample, encode_sample, group_key_of
from core import RewardConfig
from core.records import InputRecord
from core.validate import SampleLimits, plainly_valid, validate_sample
from core.windows import REPLAY_ID_HEADER, WindowConfig, WindowStore

_lengths = st.one_of(st.none(), st.integers(0, 6))
_rewards = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, -0.0, 0.25, 1.0, -2.5, 1e300]),
    st.sampled_from([math.nan, math.inf, -math.inf]), st.floats(allow_nan=True, allow_infinity=True),
    st.dictionaries(st.sampled_from(["acc", "len"]), st.one_of(st.floats(), st.integers(-2, 2)), max_size=2),
)


@st.composite
def samples(draw: st.DrawFn) -> tuple[Sample, bytes | None]:
    response_length = draw(st.integers(-1, 5))
    arrays = {name: (None if n is None else [1] * n)
              for name, n in (("tokens", draw(_lengths)), ("loss_mask", draw(_lengths)),
                              ("rollout_log_probs", draw(_lengths)))}
    sample = Sample(
        group_index=draw(st.one_of(st.none(), st.integers(0, 3))),
        rollout_id=draw(st.one_of(st.none(), st.integers(0, 3), st.just("r0"))),
        reward=draw(_rewards),
        response_length=response_length,
        group_size=draw(st.one_of(st.none(), st.integers(-1, 5), st.just(5000))),
        sibling_count=draw(st.one_of(st.integers(-1, 3), st.just(2000))),
        sibling_index=draw(st.integers(-1, 3)),
        run_id=draw(st.sampled_from([None, "", "run", "rün"])),
        **arrays,
    )
    right = None if sample.group_index is None else group_key_of(sample.run_id, sample.group_index).encode()
    key = draw(st.sampled_from([right, right, None, b"other", b"\xff"]))
    return sample, key


_limits = st.builds(SampleLimits, default_group_size=st.one_of(st.none(), st.integers(0, 4)),
                    max_group_size=st.sampled_from([4, 4096]), max_sibling_count=st.sampled_from([2, 1024]))


@settings(max_examples=2000, deadline=None)
@given(samples(), st.sampled_from([None, "", "acc"]), _limits)
def test_plainly_valid_accepts_only_valid_samples_with_their_group_key(drawn, reward_key, limits):
    sample, key = drawn
    fast = plainly_valid(sample, key, reward_key, limits)
    problem = validate_sample(sample, key=key, reward_key=reward_key, limits=limits)
    if fast is not None:
        assert problem is None
        assert fast == group_key_of(sample.run_id, sample.group_index)
    elif problem is None and not reward_key and type(sample.reward) is float:
        pytest.fail("a valid sample with a plain float reward took the slow path")


def _without_fast_paths(store: WindowStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("core.windows.plainly_valid", lambda *args: None)
    monkeypatch.setattr(store, "_add_rollout", lambda wkey, window, record, sample, rkey, group_size, now_ms:
                        store._add_member(wkey, window, record, sample, rkey, None, group_size, now_ms))


@st.composite
def streams(draw: st.DrawFn) -> list[tuple[bytes | None, bytes, int]]:
    """Records of a few groups: valid ones, invalid ones, copies, conflicts, siblings, late ones."""
    records: list[tuple[bytes | None, bytes, int]] = []
    for g in range(draw(st.integers(1, 4))):
        size = draw(st.integers(1, 3))
        for r in range(size + draw(st.integers(0, 1))):
            nsib = draw(st.integers(1, 2))
            base = draw(st.sampled_from([0.0, 0.5, 1.0]))
            for si in range(nsib):
                reward = draw(st.one_of(st.just(base), _rewards))
                sample = Sample(
                    group_index=g, rollout_id=draw(st.sampled_from([r, r, None])),
                    index=draw(st.sampled_from([r, None])),
                    reward=reward, group_size=draw(st.sampled_from([size, size, size, None, size + 1, 0])),
                    sibling_count=draw(st.sampled_from([nsib, nsib, nsib, nsib + 1])),
                    sibling_index=si, run_id=draw(st.sampled_from(["run", "run", None])),
                    tokens=[1, 2], response_length=draw(st.sampled_from([1, 1, 1, 3])), loss_mask=[1],
                )
                key = draw(st.sampled_from([group_key_of(sample.run_id, g).encode()] * 4 + [b"x"]))
                ts = draw(st.sampled_from([0, 0, 0, 5_000]))
                value = encode_sample(sample)
                records.append((key, value, ts))
                if draw(st.integers(0, 5)) == 0:
                    records.append((key, value, ts))
    order = draw(st.permutations(range(len(records))))
    return [records[i] for i in order]


def _run(store: WindowStore, records: list[tuple[bytes | None, bytes, int]], headers: bool) -> list[str]:
    out = []
    for offset, (key, value, ts) in enumerate(records):
        hdrs = (((REPLAY_ID_HEADER, b"r1"),) if headers and offset % 2 else ())
        rec = InputRecord("in", offset % 2, offset, ts, key, value, hdrs)
        try:
            decoded: Sample | DecodeError = decode_sample(value)
        except DecodeError as exc:
            decoded = exc
        out += [repr(o) for o in store.accept(rec, decoded, now_ms=1)]
    out += [repr(o) for o in store.expire(now_ms=10**9, partitions={0, 1})]
    return out


@settings(max_examples=300, deadline=None)
@given(streams(), st.sampled_from(["grpo", "reinforce_plus_plus_baseline"]), st.sampled_from([None, 2]),
       st.sampled_from([1 << 30, 300]), st.booleans())
def test_a_window_store_decides_the_same_with_and_without_its_fast_paths(
    records, estimator, default_size, max_bytes, headers
):
    config = WindowConfig(reward=RewardConfig(advantage_estimator=estimator), group_timeout_ms=1_000,
                          limits=SampleLimits(default_group_size=default_size), max_group_bytes=max_bytes)
    fast = WindowStore(config)
    slow = WindowStore(config)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _without_fast_paths(slow, monkeypatch)
        expected = _run(slow, records, headers)
    assert _run(fast, records, headers) == expected
    assert repr(fast.closed) == repr(slow.closed) and fast.open_bytes == slow.open_bytes == 0
    assert repr(fast.drain_changes()) == repr(slow.drain_changes())
