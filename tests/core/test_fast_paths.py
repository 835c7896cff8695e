"""The record path's fast paths against the full rules they shortcut, on random valid and invalid input.

* `plainly_valid` may only accept what `validate_sample` accepts, with the same group key, and must accept
  the common case (a finite float reward without a reward key), or it saves nothing.
* A `WindowStore` with its fast paths (`plainly_valid`, `_add_rollout`) decides exactly what one without
  them decides: same outcomes (reasons, messages, records, reward bits), same closed-group memory; and so
  does one fed the records' bytes through `take` (a head decode where it is enough, the whole one else).
"""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_stream.codec import DecodeError, Sample, decode_sample, encode_sample, group_key_of
from rollout_stream.core import RewardConfig
from rollout_stream.core.records import InputRecord
from rollout_stream.core.validate import SampleLimits, plainly_valid, validate_sample
from rollout_stream.core.windows import REPLAY_ID_HEADER, WindowConfig, WindowStore

_rewards = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([0.0, -0.0, 0.25, 1.0, -2.5, 1e300]),
    st.sampled_from([math.nan, math.inf, -math.inf]), st.floats(allow_nan=True, allow_infinity=True),
    st.dictionaries(st.sampled_from(["acc", "len"]), st.one_of(st.floats(), st.integers(-2, 2)), max_size=2),
)


def _edges(rl: int) -> dict[str, list[object]]:
    """Values of each field at and beyond its limits (response length `rl`)."""
    return {
        "group_index": [None], "reward": [None, True, 1, math.nan, math.inf, -math.inf, {"acc": 1.0}],
        "response_length": [-1, rl + 1, rl + 3], "group_size": [None, 0, -1, 4, 5, 4096, 4097],
        "sibling_count": [0, -1, 1, 2, 3, 1024, 1025], "sibling_index": [-1, 0, 2, 3],
        "tokens": [None, [1] * max(rl - 1, 0)], "loss_mask": [None, [1] * (rl + 1), [1] * max(rl - 1, 0)],
        "rollout_log_probs": [[1.0] * rl, [1.0] * (rl + 1), [math.nan] * rl, [-math.inf] * rl],
        # half a sampling mask: the full check refuses it
        "rollout_sampling_mask_ids": [[5] * rl], "rollout_sampling_mask_offsets": [list(range(rl + 1))],
        # against the sample's one version ("1"): fits, too many, not from 0, past the response, not integers
        "weight_version_offsets": [[0], [0, 0], [1], [rl + 1], [0.0]],
        "weight_versions": [[], ["1", "2"], ["1", "2", "3"]],
    }


def _sampling_mask(kind: str, rl: int) -> dict[str, object]:
    """A CSR sampling mask over `rl` response tokens: valid, or broken one way."""
    offsets = [2 * t for t in range(rl + 1)]
    ids = [7] * offsets[-1]
    if kind == "decreasing" and rl >= 2:
        offsets[1] = offsets[2] + 1
        ids = [7] * offsets[-1]
    elif kind == "short":
        offsets = offsets[:-1]
    elif kind == "end":
        ids = ids + [7]
    elif kind == "start":
        offsets = [1 + o for o in offsets]
        ids = [7] * offsets[-1]
    return {"rollout_sampling_mask_ids": ids, "rollout_sampling_mask_offsets": offsets}


def _version_spans(draw: st.DrawFn, rl: int) -> dict[str, object]:
    """Weight versions with the response token each started at, in any integer dtype the wire carries."""
    count = draw(st.integers(1, 3))
    offsets = sorted(draw(st.lists(st.integers(0, rl), min_size=count - 1, max_size=count - 1)))
    dtype = draw(st.sampled_from(["<i4", "<i8", "<u1", "<u2"]))
    return {"weight_versions": [str(v) for v in range(count)],
            "weight_version_offsets": np.array([0, *offsets], dtype=dtype)}


@st.composite
def samples(draw: st.DrawFn) -> tuple[Sample, bytes | None]:
    """A valid sample with up to two fields set out of line (each check is exercised at its edge)."""
    rl = draw(st.integers(0, 4))
    fields: dict[str, object] = {
        "group_index": draw(st.integers(0, 3)), "rollout_id": draw(st.sampled_from([None, 1, "r0"])),
        "reward": draw(st.sampled_from([0.0, -0.0, 0.25, -2.5, 1e300])), "response_length": rl,
        "group_size": draw(st.sampled_from([1, 4, None])), "sibling_count": 2, "sibling_index": 1,
        "run_id": draw(st.sampled_from([None, "", "run", "rün"])),
        "tokens": [1] * (rl + draw(st.integers(0, 2))), "loss_mask": [1] * rl, "rollout_log_probs": None,
        "weight_versions": ["1"],
    }
    mask = draw(st.sampled_from(["none", "none", "none", "valid", "decreasing", "short", "end", "start"]))
    if mask != "none":
        fields.update(_sampling_mask(mask, rl))
    if draw(st.booleans()):
        fields.update(_version_spans(draw, rl))
    edges = _edges(rl)
    for name in draw(st.lists(st.sampled_from(sorted(edges)), max_size=2)):
        fields[name] = draw(st.sampled_from(edges[name]))
    sample = Sample(**fields)  # type: ignore[arg-type]
    right = None if sample.group_index is None else group_key_of(sample.run_id, sample.group_index).encode()
    key = draw(st.sampled_from([right, right, right, None, b"other", b"\xff"]))
    return sample, key


_limits = st.builds(SampleLimits, default_group_size=st.sampled_from([None, 0, 2, 4, 5000]),
                    max_group_size=st.sampled_from([4096, 4]), max_sibling_count=st.sampled_from([1024, 2]))


@settings(max_examples=2000, deadline=None)
@given(samples(), st.sampled_from([None, "", "acc"]), _limits)
def test_plainly_valid_accepts_only_valid_samples_with_their_group_key(drawn, reward_key, limits):
    sample, key = drawn
    fast = plainly_valid(sample, key, reward_key, limits)
    problem = validate_sample(sample, key=key, reward_key=reward_key, limits=limits)
    if fast is not None:
        assert problem is None
        assert fast == group_key_of(sample.run_id, sample.group_index)
    elif problem is None and not reward_key and type(sample.reward) is float \
            and sample.rollout_sampling_mask_ids is None:  # a sampling mask always takes the full check
        pytest.fail("a valid sample with a plain float reward took the slow path")


@pytest.mark.parametrize("limits", [SampleLimits(), SampleLimits(default_group_size=4, max_group_size=4,
                                                                  max_sibling_count=2)])
def test_plainly_valid_agrees_at_every_single_field_edge(limits):
    for rl in (0, 2):
        for name, values in _edges(rl).items():
            for value in values:
                fields: dict[str, object] = {
                    "group_index": 3, "reward": 0.5, "response_length": rl, "group_size": 2,
                    "sibling_count": 2, "sibling_index": 1, "run_id": "run", "tokens": [1] * rl,
                    "loss_mask": [1] * rl, "weight_versions": ["1"], name: value,
                }
                sample = Sample(**fields)  # type: ignore[arg-type]
                fast = plainly_valid(sample, b"run/3", None, limits)
                problem = validate_sample(sample, key=b"run/3", reward_key=None, limits=limits)
                assert (fast is not None) == (problem is None and type(sample.reward) is float), (name, value)


def _without_fast_paths(config: WindowConfig, monkeypatch: pytest.MonkeyPatch) -> WindowStore:
    """A store that takes neither fast path while `monkeypatch` holds."""
    import rollout_stream.core.windows

    store = WindowStore(config)
    monkeypatch.setattr(rollout_stream.core.windows, "plainly_valid", lambda *args: None)
    monkeypatch.setattr(store, "_add_rollout", lambda wkey, window, record, sample, rkey, group_size, now_ms:
                        store._add_member(wkey, window, record, sample, rkey, None, group_size, now_ms))
    return store


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
                if draw(st.integers(0, 7)) == 0:  # arrays as plain lists: no head, decoded whole
                    fields = {**msgspec.structs.asdict(sample), "tokens": [1, 2], "loss_mask": [1]}
                    value = msgspec.msgpack.encode({**fields, "type": "rollout_sample"})
                elif draw(st.integers(0, 15)) == 0:
                    value = value[:-1]  # cut short: a decode error
                records.append((key, value, ts))
                if draw(st.integers(0, 5)) == 0:
                    records.append((key, value, ts))
    order = draw(st.permutations(range(len(records))))
    return [records[i] for i in order]


def _run(store: WindowStore, records: list[tuple[bytes | None, bytes, int]], headers: bool,
         take: bool = False) -> list[str]:
    out = []
    for offset, (key, value, ts) in enumerate(records):
        hdrs = (((REPLAY_ID_HEADER, b"r1"),) if headers and offset % 2 else ())
        rec = InputRecord("in", offset % 2, offset, ts, key, value, hdrs)
        if take:
            out += [repr(o) for o in store.take(rec, now_ms=1)]
            continue
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
    with pytest.MonkeyPatch.context() as monkeypatch:
        slow = _without_fast_paths(config, monkeypatch)
        expected = _run(slow, records, headers)
    assert _run(fast, records, headers) == expected
    assert repr(fast.closed) == repr(slow.closed) and fast.open_bytes == slow.open_bytes == 0
    assert repr(fast.drain_changes()) == repr(slow.drain_changes())
    taken = WindowStore(config)
    assert _run(taken, records, headers, take=True) == expected
    assert repr(taken.closed) == repr(slow.closed) and taken.open_bytes == 0
