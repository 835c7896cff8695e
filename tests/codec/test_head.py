"""`decode_head` (codec/head.py) is a shortcut of `decode_sample`: a head only for a record the whole decode
takes too, with the same values; None for everything else, which is then decoded whole."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext

from rollout_stream.codec import Array, DecodeError, Sample, ShapedArray, decode_sample, encode_sample
from rollout_stream.codec.head import HEAD_MAX_BYTES, SampleHead, decode_head, ext_all_finite, item_count

_ARRAY_FIELDS = ("tokens", "loss_mask", "rollout_log_probs", "teacher_log_probs", "opd_reverse_kl",
                 "rollout_sampling_mask_ids", "rollout_sampling_mask_offsets", "weight_version_offsets")
_DTYPES = ["<u1", "<u2", "<i4", "<i8", "<f4", "<f8", "?"]


def _same(head: Any, sample: Sample) -> None:
    """Every field of the head equals the sample's; a packed array as its payload, dtype and length."""
    for f in msgspec.structs.fields(Sample):
        mine, theirs = getattr(head, f.name), getattr(sample, f.name)
        if isinstance(theirs, Array):
            assert isinstance(mine, Ext), f.name
            assert item_count(mine) == len(theirs), f.name
            assert bytes(mine.data) == theirs.values.tobytes(), f.name
        elif isinstance(theirs, float) and math.isnan(theirs):
            assert isinstance(mine, float) and math.isnan(mine), f.name
        else:
            assert type(mine) is type(theirs) and repr(mine) == repr(theirs), f.name


def test_a_head_has_the_fields_of_a_sample_with_packed_arrays_as_ext_payloads():
    mapped = {Array | None: Ext | None, ShapedArray | None: type(None)}
    sample_fields = msgspec.structs.fields(Sample)
    head_fields = msgspec.structs.fields(SampleHead)
    assert [f.name for f in head_fields] == [f.name for f in sample_fields]
    for h, s in zip(head_fields, sample_fields, strict=True):
        assert h.type == mapped.get(s.type, s.type), s.name
        assert (h.default, h.default_factory) == (s.default, s.default_factory), s.name
    assert SampleHead.__struct_config__.tag == Sample.__struct_config__.tag
    assert SampleHead.__struct_config__.tag_field == Sample.__struct_config__.tag_field


@st.composite
def samples(draw: st.DrawFn) -> Sample:
    arrays = {
        name: draw(st.one_of(st.none(), st.builds(
            lambda dtype, n: np.arange(n).astype(dtype), st.sampled_from(_DTYPES), st.integers(0, 6))))
        for name in _ARRAY_FIELDS
    }
    reward = draw(st.one_of(st.none(), st.floats(), st.integers(-3, 3),
                            st.dictionaries(st.sampled_from(["a", "b"]), st.floats(), max_size=2)))
    metadata = draw(st.dictionaries(st.sampled_from(["k", "v"]), st.one_of(
        st.integers(-(2**63), 2**64 - 1), st.text(max_size=3), st.lists(st.integers(0, 9), max_size=2)),
        max_size=2))
    if draw(st.booleans()):
        metadata["arr"] = np.arange(3, dtype="<i4")  # an ext inside metadata: decoded by the hook either way
    experts = draw(st.sampled_from([None, None, np.zeros((2, 1, 2), dtype="<i4")]))
    return Sample(
        group_index=draw(st.one_of(st.none(), st.integers(-1, 2**63))),
        index=draw(st.none() | st.integers(0, 9)),
        rollout_id=draw(st.one_of(st.none(), st.integers(0, 9), st.text(max_size=3))),
        prompt=draw(st.text(max_size=5)), reward=reward, response_length=draw(st.integers(-1, 6)),
        group_size=draw(st.none() | st.integers(0, 9)), sibling_count=draw(st.integers(0, 3)),
        sibling_index=draw(st.integers(-1, 3)), run_id=draw(st.none() | st.text(max_size=3)),
        weight_versions=draw(st.lists(st.text(max_size=2), max_size=2)), metadata=metadata,
        rollout_routed_experts=experts, train_metadata=draw(st.none() | st.just({"loss": "x"})),
        **arrays,
    )


@settings(max_examples=500, deadline=None)
@given(samples())
def test_a_valid_record_decodes_to_a_head_equal_to_its_whole_decode(sample):
    value = encode_sample(sample)
    head = decode_head(value)
    if sample.rollout_routed_experts is not None:
        assert head is None  # routing replay arrays are decoded whole
        return
    assert head is not None
    _same(head, decode_sample(value))


def _corrupt(value: bytes, draw: st.DrawFn) -> bytes:
    data = bytearray(value)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:at + draw(st.integers(1, 4))]
        else:
            data[at:at] = bytes([draw(st.integers(0, 255))])
    return bytes(data)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples(), st.data())
def test_a_corrupted_record_gets_a_head_only_when_the_whole_decode_takes_it_alike(sample, data):
    value = _corrupt(encode_sample(sample), data.draw)
    head = decode_head(value)
    if head is None:
        return
    try:
        whole = decode_sample(value)
    except DecodeError as exc:
        pytest.fail(f"a head for a record the whole decode refuses: {exc}")
    _same(head, whole)


@pytest.mark.parametrize("value", [
    msgspec.msgpack.encode({"type": "rollout_sample", "tokens": [1, 2]}),  # a plain list (interop)
    msgspec.msgpack.encode({"tokens": Ext(99, b"abcd")}),  # unknown ext code
    msgspec.msgpack.encode({"tokens": Ext(11, b"abc")}),  # not a whole number of int32 items
    msgspec.msgpack.encode({"schema_version": 2}),  # newer than this stage reads
    msgspec.msgpack.encode({"type": "train_sample"}),
    msgspec.msgpack.encode({"group_index": "1"}),
    b"\xc1",
    b"",
])
def test_what_a_head_cannot_say_is_left_to_the_whole_decode(value):
    assert decode_head(value) is None


def test_a_record_over_the_head_size_is_decoded_whole():
    small = encode_sample(Sample(group_index=1, tokens=np.arange(100, dtype="<i4")))
    large = encode_sample(Sample(group_index=1, tokens=np.arange(HEAD_MAX_BYTES // 4, dtype="<i4")))
    assert decode_head(small) is not None and len(large) > HEAD_MAX_BYTES and decode_head(large) is None


def test_item_count_is_the_array_length_for_every_dtype():
    for dtype in _DTYPES:
        arr = np.arange(5).astype(dtype)
        head = decode_head(encode_sample(Sample(tokens=arr)))
        assert head is not None and item_count(head.tokens) == 5


@pytest.mark.parametrize(("values", "dtype", "finite"), [
    ([1.0, -2.5, 0.0, -0.0, 1e-45], "<f4", True), ([1.0, math.nan], "<f4", False), ([math.inf], "<f8", False),
    ([-math.inf, 1.0], "<f8", False), ([], "<f4", True), ([1, 2**31 - 1, -1], "<i4", True),
    ([3e38], "<f4", False),  # finite but with a near-maximal exponent: declined, the full check decides
    ([1.7e308], "<f8", False),
])
def test_ext_all_finite_is_sure_or_says_no(values: list[float], dtype: str, finite: bool) -> None:
    log_probs = np.array(values, dtype=dtype)
    value = encode_sample(Sample(rollout_log_probs=log_probs, response_length=len(values)))  # type: ignore[arg-type]
    head = decode_head(value)
    assert head is not None
    assert ext_all_finite(head.rollout_log_probs) is finite
