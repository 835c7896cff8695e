"""Wire records (codec/wire.py, codec/records.py): round trips, evolution, tags, train samples, fuzzing."""

from __future__ import annotations

import math
import struct
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rollout_stream.codec import (
    SCHEMA_VERSION,
    Array,
    DecodeError,
    Sample,
    TrainSample,
    decode_sample,
    decode_train_sample,
    encode_sample,
    encode_train_sample,
    group_key,
    group_key_of,
)

TAG = {"type": "rollout_sample"}


def full_sample(**overrides: Any) -> Sample:
    fields: dict[str, Any] = dict(
        group_index=3,
        index=17,
        rollout_id="r-17",
        prompt="2+2?",
        response="4",
        label="4",
        tokens=np.arange(12, dtype=np.int32),
        response_length=4,
        reward=1.0,
        loss_mask=[1, 1, 0, 1],
        rollout_log_probs=np.array([-0.1, -0.2, -0.3, -0.4], dtype=np.float32),
        status="completed",
        remove_sample=False,
        weight_versions=["v1", "v2"],
        metadata={"turn": 2, "tool": None, "nested": {"a": [1, 2.5, "x"]}},
        group_size=8,
        sibling_count=2,
        sibling_index=1,
        run_id="run-a",
    )
    fields.update(overrides)
    return Sample(**fields)


def train_sample(sample: Sample, **overrides: Any) -> TrainSample:
    fields: dict[str, Any] = dict(
        sample=sample,
        raw_reward=1.0,
        reward=0.5,
        group_key="run-a/3",
        group_rollout_count=8,
        group_sample_count=9,
        group_mean=0.5,
        group_std=0.25,
        zero_variance=False,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        source_topic="rollouts",
        source_partition=2,
        source_offset=12345,
        stage_version="0.1.0",
    )
    fields.update(overrides)
    return TrainSample(**fields)


def raw_map(data: bytes) -> dict[str, Any]:
    """Decode without schema or hooks: what a generic MessagePack reader sees."""
    return msgspec.msgpack.decode(data)


# --- round trips ------------------------------------------------------------------------------------


def test_full_sample_roundtrips_equal_and_byte_stable():
    sample = full_sample()
    encoded = encode_sample(sample)
    decoded = decode_sample(encoded)
    assert decoded == sample
    assert encode_sample(decoded) == encoded
    assert decoded.tokens.dtype == np.dtype("<i4")
    assert decoded.loss_mask.dtype == np.dtype("<i4")
    assert decoded.rollout_log_probs.dtype == np.dtype("<f4")


def test_default_sample_roundtrips_and_carries_tag_and_version():
    encoded = encode_sample(Sample())
    assert decode_sample(encoded) == Sample()
    on_wire = raw_map(encoded)
    assert on_wire["type"] == "rollout_sample"
    assert on_wire["schema_version"] == SCHEMA_VERSION == 1


@pytest.mark.parametrize("reward", [2.5, {"acc": 1.0, "format": 0.0}, None])
def test_reward_float_mapping_or_missing(reward):
    assert decode_sample(encode_sample(full_sample(reward=reward))).reward == reward


def test_integer_reward_on_the_wire_decodes_as_float():
    decoded = decode_sample(msgspec.msgpack.encode({**TAG, "reward": 3}))
    assert decoded.reward == 3.0
    assert isinstance(decoded.reward, float)


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_rewards_decode_and_are_left_to_validation(reward):
    # §2/§4.4: non-finite rewards are `invalid_sample` (a validation decision), not a decode error.
    decoded = decode_sample(encode_sample(full_sample(reward=reward)))
    assert struct.pack("<d", decoded.reward) == struct.pack("<d", reward)
    assert math.isnan(decode_sample(encode_sample(full_sample(reward={"acc": reward}))).reward["acc"]) == (
        math.isnan(reward)
    )


def test_large_sample_roundtrips_zero_copy():
    n = 32768
    sample = full_sample(
        tokens=np.arange(n, dtype=np.int32),
        response_length=n // 2,
        loss_mask=np.ones(n // 2, dtype=np.int32),
        rollout_log_probs=np.linspace(-5, 0, n // 2, dtype=np.float32),
    )
    encoded = encode_sample(sample)
    decoded = decode_sample(encoded)
    assert decoded == sample
    whole = np.frombuffer(encoded, dtype=np.uint8)
    for arr in (decoded.tokens, decoded.loss_mask, decoded.rollout_log_probs):
        assert np.shares_memory(arr.numpy(), whole)
    assert decoded.tokens.tensor().shape == (n,)


@pytest.mark.parametrize("buffer_type", [bytes, bytearray, memoryview])
def test_decode_accepts_any_bytes_like(buffer_type):
    assert decode_sample(buffer_type(encode_sample(full_sample()))) == full_sample()


# --- interop and schema evolution ------------------------------------------------------------------


def test_plain_lists_from_another_language_decode_to_arrays():
    data = msgspec.msgpack.encode(
        {
            **TAG,
            "group_index": 1,
            "tokens": [101, 102, 2**33],
            "loss_mask": [1, 0],
            "rollout_log_probs": [-0.5, -1.25],
            "reward": 1,
        }
    )
    decoded = decode_sample(data)
    assert isinstance(decoded.tokens, Array) and decoded.tokens.dtype == np.dtype("<i8")
    assert decoded.tokens == [101, 102, 2**33]
    assert decoded.loss_mask == Array([1, 0])
    assert decoded.rollout_log_probs.dtype == np.dtype("<f8")
    assert decoded.rollout_log_probs.tolist() == [-0.5, -1.25]


def test_missing_schema_version_defaults_to_1():
    assert decode_sample(msgspec.msgpack.encode({**TAG, "group_index": 4})).schema_version == 1


def test_missing_tag_is_accepted_by_the_single_type_decoder():
    # A hand-written producer may omit `type`; only a *different* tag is refused.
    assert decode_sample(msgspec.msgpack.encode({"group_index": 4})).group_index == 4


@pytest.mark.parametrize("version", [0, -1, SCHEMA_VERSION + 1, 2**64 - 1])
def test_unknown_schema_version_is_a_decode_error(version):
    with pytest.raises(DecodeError, match="unsupported schema_version"):
        decode_sample(msgspec.msgpack.encode({**TAG, "schema_version": version}))


def test_unknown_fields_from_a_newer_producer_are_ignored():
    assert Sample.__struct_config__.forbid_unknown_fields is False
    data = msgspec.msgpack.encode(
        {
            **TAG,
            "group_index": 9,
            "novel_field": {"deep": [1, 2]},
            "novel_tensor": msgspec.msgpack.Ext(11, b"\0" * 4),
        }
    )
    assert decode_sample(data) == Sample(group_index=9)


def test_tag_mismatch_is_a_decode_error():
    train_bytes = encode_train_sample(train_sample(full_sample()))
    with pytest.raises(DecodeError, match=r"'train_sample' - at `\$\.type`"):
        decode_sample(train_bytes)
    with pytest.raises(DecodeError, match=r"'rollout_sample' - at `\$\.type`"):
        decode_train_sample(encode_sample(full_sample()))
    with pytest.raises(DecodeError):
        decode_sample(msgspec.msgpack.encode({"type": "rollout_sample_v9"}))


@pytest.mark.parametrize(
    ("record", "path"),
    [
        ({"group_index": "3"}, "$.group_index"),
        ({"group_index": 1.5}, "$.group_index"),
        ({"sibling_count": True}, "$.sibling_count"),
        ({"reward": "high"}, "$.reward"),
        ({"reward": {"acc": "x"}}, "$.reward"),
        ({"tokens": "abc"}, "$.tokens"),
        ({"tokens": [1, None]}, "$.tokens"),
        ({"tokens": [2**64 - 1, -1]}, "$.tokens"),  # beyond int64: refused, not rounded to float
        ({"weight_versions": "v1"}, "$.weight_versions"),
        ({"metadata": [1, 2]}, "$.metadata"),
    ],
)
def test_wrong_field_types_are_decode_errors_with_a_path(record, path):
    with pytest.raises(DecodeError) as info:
        decode_sample(msgspec.msgpack.encode({**TAG, **record}))
    assert isinstance(info.value, ValueError)
    assert path in info.value.message
    assert str(info.value) == info.value.message


@pytest.mark.parametrize(
    "record",
    [
        {"group_index": -(2**63), "index": 2**64 - 1, "sibling_count": -5, "sibling_index": 2**63},
        {"response_length": -1, "group_size": 0, "rollout_id": -(2**63)},
    ],
)
def test_absurd_ints_decode_and_are_left_to_validation(record):
    decoded = decode_sample(msgspec.msgpack.encode({**TAG, **record}))
    for name, value in record.items():
        assert getattr(decoded, name) == value


@pytest.mark.parametrize(
    ("ext", "match"),
    [
        (msgspec.msgpack.Ext(11, b"\0" * 5), "whole number of items"),
        (msgspec.msgpack.Ext(14, b"\0" * 12), "whole number of items"),
        (msgspec.msgpack.Ext(42, b"\0" * 8), "unknown ext type code 42"),
    ],
)
def test_bad_ext_payloads_are_decode_errors(ext, match):
    with pytest.raises(DecodeError, match=match):
        decode_sample(msgspec.msgpack.encode({**TAG, "tokens": ext}))
    with pytest.raises(DecodeError, match=match):
        decode_sample(msgspec.msgpack.encode({**TAG, "metadata": {"x": ext}}))


# --- train samples ----------------------------------------------------------------------------------


def test_train_sample_roundtrips():
    ts = train_sample(full_sample(), reward_key="acc")
    decoded = decode_train_sample(encode_train_sample(ts))
    assert decoded == ts
    assert raw_map(encode_train_sample(ts))["type"] == "train_sample"


def test_train_sample_embeds_the_original_bytes_verbatim_including_unknown_fields():
    newer_producer = {
        **raw_map(encode_sample(full_sample())),
        "novel_field": {"judge": "gpt-x", "scores": [0.1, 0.9]},
        "novel_array": msgspec.msgpack.Ext(13, np.array([1.5], dtype="<f4").tobytes()),
    }
    original = msgspec.msgpack.encode(newer_producer)
    sample = decode_sample(original)  # this stage does not know the new fields: they are ignored...
    out = encode_train_sample(train_sample(sample), raw_sample=original)

    class Envelope(msgspec.Struct):
        sample: msgspec.Raw

    assert original in out
    assert bytes(msgspec.msgpack.decode(out, type=Envelope).sample) == original  # ...but survive verbatim
    inner = raw_map(out)["sample"]
    assert inner["novel_field"] == {"judge": "gpt-x", "scores": [0.1, 0.9]}
    assert inner["novel_array"].code == 13
    decoded = decode_train_sample(out)
    assert decoded.sample == sample
    assert decoded.group_key == "run-a/3"


def test_train_sample_accepts_raw_memoryview():
    original = encode_sample(full_sample())
    out = encode_train_sample(train_sample(full_sample()), raw_sample=memoryview(original))
    assert decode_train_sample(out).sample == full_sample()


def test_train_sample_with_future_embedded_sample_version_is_a_decode_error():
    original = msgspec.msgpack.encode({**TAG, "schema_version": SCHEMA_VERSION + 1})
    out = encode_train_sample(train_sample(Sample()), raw_sample=original)
    with pytest.raises(DecodeError, match=r"schema_version .* at `\$.sample`"):
        decode_train_sample(out)


def test_train_sample_missing_required_field_is_a_decode_error():
    record = raw_map(encode_train_sample(train_sample(full_sample())))
    del record["source_offset"]
    with pytest.raises(DecodeError, match="source_offset"):
        decode_train_sample(msgspec.msgpack.encode(record))


# --- group keys -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_id", "group_index", "key"),
    [
        (None, 7, b"7"),
        ("", 7, b"7"),
        ("run-a", 7, b"run-a/7"),
        ("exp/1", 0, b"exp/1/0"),
        (None, -3, b"-3"),
        ("ü", 2**40, "ü/1099511627776".encode()),
    ],
)
def test_group_key_formats(run_id, group_index, key):
    assert group_key(Sample(run_id=run_id, group_index=group_index)) == key
    assert group_key_of(run_id, group_index) == key.decode()


def test_group_key_needs_a_group_index():
    with pytest.raises(ValueError, match="group_index"):
        group_key(Sample(run_id="run-a"))


# --- property: any sample round-trips ----------------------------------------------------------------

WIRE_DTYPES = ["<u1", "<i4", "<i8", "<f4", "<f8", "?"]
ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
texts = st.text(max_size=20)
finite = st.floats(allow_nan=False)
arrays = st.sampled_from(WIRE_DTYPES).flatmap(
    lambda dt: hnp.arrays(np.dtype(dt), st.integers(0, 40)).map(Array)  # floats include NaN and ±inf
)
int_lists = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=20).map(Array)
json_values = st.recursive(
    st.none() | st.booleans() | ints | finite | texts | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
samples = st.builds(
    Sample,
    group_index=st.none() | ints,
    index=st.none() | ints,
    rollout_id=st.none() | ints | texts,
    prompt=texts,
    response=texts,
    label=st.none() | texts,
    tokens=st.none() | arrays | int_lists,
    response_length=ints,
    reward=st.none() | finite | st.dictionaries(texts, finite, max_size=3),
    loss_mask=st.none() | arrays,
    rollout_log_probs=st.none() | arrays,
    status=texts,
    remove_sample=st.booleans(),
    weight_versions=st.lists(texts, max_size=3),
    metadata=st.dictionaries(texts, json_values, max_size=4),
    group_size=st.none() | ints,
    sibling_count=ints,
    sibling_index=ints,
    run_id=st.none() | texts,
)


@settings(max_examples=300, deadline=None)
@given(samples)
def test_any_sample_roundtrips_equal(sample):
    encoded = encode_sample(sample)
    decoded = decode_sample(encoded)
    assert decoded == sample
    assert encode_sample(decoded) == encoded


@settings(max_examples=100, deadline=None)
@given(samples)
def test_any_train_sample_roundtrips_with_embedded_bytes(sample):
    original = encode_sample(sample)
    out = encode_train_sample(train_sample(sample), raw_sample=original)
    assert original in out
    assert decode_train_sample(out).sample == sample


# --- fuzz: decode_sample returns a Sample or raises DecodeError, quickly and in bounded memory ---------

MAX_DECODE_SECONDS = 1.0  # generous: a hang or quadratic blow-up shows up as seconds, not milliseconds


@contextmanager
def bounded(limit_bytes: int) -> Iterator[None]:
    """Fail if the block allocates more than `limit_bytes` at its peak, or runs too long."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    tracemalloc.reset_peak()
    baseline = tracemalloc.get_traced_memory()[0]
    t0 = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] - baseline
        if started:
            tracemalloc.stop()
    assert peak <= limit_bytes, f"decode allocated {peak} bytes (limit {limit_bytes})"
    assert elapsed < MAX_DECODE_SECONDS, f"decode took {elapsed:.3f} s"


def decode_total(data: bytes) -> Sample | None:
    """decode_sample must return a Sample or raise DecodeError: anything else fails the test."""
    with bounded(64 * len(data) + (1 << 20)):
        try:
            result = decode_sample(data)
        except DecodeError as exc:
            assert isinstance(exc.message, str) and exc.message
            return None
    assert isinstance(result, Sample)
    return result


HEADER = b"\x82\xa4type\xaerollout_sample"  # map of 2: the tag, then one crafted field


def field(name: str, value: bytes) -> bytes:
    return HEADER + bytes([0xA0 | len(name)]) + name.encode() + value


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xc1", id="never-used-byte"),
        pytest.param(b"\xdd\xff\xff\xff\xff" + b"\x01" * 8, id="top-array32-4G-items"),
        pytest.param(b"\xdf\xff\xff\xff\xff" + b"\xa1a\x01" * 4, id="top-map32-4G-entries"),
        pytest.param(b"\xc6\xff\xff\xff\xff" + b"\x00" * 8, id="top-bin32-4GiB"),
        pytest.param(field("tokens", b"\xdd\xff\xff\xff\xff\x01\x02"), id="tokens-array32-4G-items"),
        pytest.param(field("tokens", b"\xc9\xff\xff\xff\xff\x0b\x00\x00"), id="tokens-ext32-4GiB"),
        pytest.param(field("tokens", b"\xc6\xff\xff\xff\xff"), id="tokens-bin32-4GiB"),
        pytest.param(field("prompt", b"\xdb\xff\xff\xff\xff" + b"a" * 8), id="prompt-str32-4GiB"),
        pytest.param(field("metadata", b"\xdf\xff\xff\xff\xff"), id="metadata-map32-4G"),
        pytest.param(field("weight_versions", b"\xdd\xff\xff\xff\xff"), id="weights-array32-4G"),
        pytest.param(field("metadata", b"\x81\xa1a" + b"\x91" * 200_000), id="metadata-nested-200k-deep"),
        pytest.param(field("tokens", b"\xc7\x05\x0b" + b"\x00" * 5), id="ext-int32-5-bytes"),
        pytest.param(field("tokens", b"\xd4\x63\x00"), id="ext-unknown-code"),
        pytest.param(field("metadata", b"\x81\xa1a\xd6\xff\x00\x00"), id="ext-bad-timestamp"),
        pytest.param(field("reward", b"\xcb" + struct.pack(">d", float("nan"))), id="reward-nan"),
        pytest.param(field("reward", b"\xca\x7f\x80\x00\x00"), id="reward-inf-float32"),
        pytest.param(field("group_index", b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff"), id="group-index-u64-max"),
        pytest.param(field("tokens", b"\x92\xcf" + b"\xff" * 9), id="tokens-u64-max-and-minus-1"),
        pytest.param(field("prompt", b"\xa2\xff\xfe"), id="invalid-utf8"),
    ],
)
def test_crafted_hostile_inputs_are_bounded_and_typed(data):
    decode_total(data)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=256))
def test_fuzz_random_bytes(data):
    decode_total(data)


@settings(max_examples=200, deadline=None)
@given(samples, st.data())
def test_fuzz_truncated_valid_records(sample, data):
    encoded = encode_sample(sample)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    assert decode_total(encoded[:cut]) is None  # a strict prefix of a map is never a whole record


@settings(max_examples=200, deadline=None)
@given(samples, st.data())
def test_fuzz_corrupted_valid_records(sample, data):
    encoded = bytearray(encode_sample(sample))
    for _ in range(data.draw(st.integers(1, 4))):
        encoded[data.draw(st.integers(0, len(encoded) - 1))] = data.draw(st.integers(0, 255))
    decode_total(bytes(encoded))


hostile_values = st.recursive(
    st.none()
    | st.booleans()
    | ints
    | st.floats()  # NaN and ±inf included
    | st.text(max_size=8)
    | st.binary(max_size=16)
    | st.builds(msgspec.msgpack.Ext, st.integers(-128, 127), st.binary(max_size=24)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10,
)
field_names = st.sampled_from(list(Sample.__struct_fields__) + ["type", "novel"])


@settings(max_examples=400, deadline=None)
@given(
    st.dictionaries(field_names, hostile_values, max_size=6),
    st.sampled_from(["rollout_sample", "train_sample", None]),
)
def test_fuzz_fields_of_wrong_types(record, tag):
    if tag is not None:
        record["type"] = tag
    result = decode_total(msgspec.msgpack.encode(record))
    if result is not None and tag == "train_sample":
        pytest.fail("a train_sample tag decoded as a rollout sample")


_any_reward = st.one_of(st.floats(), st.integers(-(2**63), 2**64 - 1), st.sampled_from([0.0, -0.0, 1e300]))


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40), _any_reward, _any_reward,
                          st.integers(-5, 2**64 - 1) | st.sampled_from([0, 127, 128, 255, 256, 65535, 65536,
                                                                        2**32 - 1, 2**32, 2**63 - 1])),
                min_size=1, max_size=5),
       st.text(max_size=12), st.one_of(st.none(), st.text(max_size=4)), st.text(max_size=8),
       st.integers(0, 2**31 - 1), _any_reward, st.booleans(), st.text(max_size=6), st.booleans())
def test_a_groups_train_samples_from_one_template_are_the_bytes_of_one_struct_each(
        copies, group_key_text, reward_key, topic, partition, mean, zero_variance, stage_version, native):
    from rollout_stream.codec import encode_train_samples, wire
    shared = TrainSample(sample=msgspec.Raw(b""), raw_reward=0.0, reward=0.0, group_key=group_key_text,
                         group_rollout_count=len(copies), group_sample_count=len(copies), group_mean=mean,
                         group_std=1.0, zero_variance=zero_variance, advantage_estimator="grpo",
                         rewards_normalization=True, grpo_std_normalization=False, reward_key=reward_key,
                         source_topic=topic, source_partition=partition, source_offset=0,
                         stage_version=stage_version)
    samples = [encode_sample(Sample(group_index=1, prompt=raw.hex())) for raw, *_ in copies]
    each = [encode_train_sample(msgspec.structs.replace(shared, raw_reward=raw, reward=value,
                                                        source_offset=offset), raw_sample=sample)
            for sample, (_, raw, value, offset) in zip(samples, copies, strict=True)]
    saved = wire._native_train_values
    if not native:  # the one-struct-per-sample path, where nothing is built
        wire._native_train_values = None
    try:
        assert encode_train_samples(shared, samples, [c[1] for c in copies], [c[2] for c in copies],
                                    [c[3] for c in copies]) == each
    finally:
        wire._native_train_values = saved


def test_a_group_of_float_rewards_is_encoded_in_c_where_it_is_built() -> None:
    from rollout_stream.codec import wire
    if wire._native_train_values is None:
        pytest.skip("rollout_stream.codec._train_values is not in use in this run")
    shared = TrainSample(sample=msgspec.Raw(b""), raw_reward=0.0, reward=0.0, group_key="g",
                         group_rollout_count=2, group_sample_count=2, group_mean=0.5, group_std=0.5,
                         zero_variance=False, advantage_estimator="grpo", rewards_normalization=True,
                         grpo_std_normalization=True, reward_key=None, source_topic="t",
                         source_partition=1, source_offset=0, stage_version="1")
    samples = [encode_sample(Sample(group_index=1, rollout_id=i)) for i in range(2)]
    each = [encode_train_sample(msgspec.structs.replace(shared, raw_reward=raw, reward=value,
                                                        source_offset=offset), raw_sample=sample)
            for sample, raw, value, offset in zip(samples, [0.0, 1.0], [-1.0, 1.0], [7, 300], strict=True)]
    assert wire._native_train_values(wire._train_pieces(shared), samples, [0.0, 1.0], [-1.0, 1.0], [7, 300]) \
        == each
