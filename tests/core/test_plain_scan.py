"""`plain_head` (core/_plain_scan.c, core/plain_scan.py) against what it shortcuts: `decode_sample` and then
`plainly_valid`. A head only for a record both take, with the same values and the same group key; None for
anything else. And it must take the common record, or it saves nothing.

It exists where the package was installed with a C compiler (setup.py): `make test`'s pass over the Python
path has none (skipped), and under CI the other pass must have it (failed otherwise).
"""

from __future__ import annotations

import math
import os
import struct
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_stream.codec import DecodeError, Sample, compiled, decode_sample, encode_sample, group_key_of
from rollout_stream.core.plain_scan import scanner
from rollout_stream.core.structs import PlainHead
from rollout_stream.core.validate import SampleLimits, plainly_valid
from tests.codec.test_head import _corrupt
from tests.codec.test_head import samples as any_samples
from tests.core.test_fast_paths import _limits
from tests.core.test_fast_paths import samples as edge_samples

IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
scan = scanner()


def test_ci_runs_the_scan_in_c() -> None:
    if not compiled.enabled():
        assert scan is None  # the Python path, and nothing else
        return
    if not IN_CI and scan is None:
        pytest.skip(f"not in CI, and this checkout runs {compiled.status().describe()}")
    assert scan is not None, (
        f"make venv builds rollout_stream.core._plain_scan, but this run has {compiled.status()}")


needs_scan = pytest.mark.skipif(scan is None,
                                reason="rollout_stream.core._plain_scan is not in use in this run")

LIMITS = SampleLimits()


def _scan(value: bytes, key: bytes | None, limits: SampleLimits = LIMITS) -> PlainHead | None:
    assert scan is not None
    return scan(value, key, limits.default_group_size, limits.max_group_size, limits.max_sibling_count)


def _reference(value: bytes, key: bytes | None, limits: SampleLimits) -> tuple[str, Sample] | None:
    try:
        sample = decode_sample(value)
    except DecodeError:
        return None
    gkey = plainly_valid(sample, key, None, limits)
    return None if gkey is None else (gkey, sample)


def _agrees(value: bytes, key: bytes | None, limits: SampleLimits) -> PlainHead | None:
    """The scan's head, checked against the reference (None where both decline)."""
    head = _scan(value, key, limits)
    if head is None:
        return None
    reference = _reference(value, key, limits)
    assert reference is not None, "a head for a record the Python path refuses or does not find plainly valid"
    gkey, sample = reference
    assert head.group_key == gkey
    assert type(head.reward) is float and struct.pack("<d", head.reward) == struct.pack("<d", sample.reward)
    for name in ("rollout_id", "index", "group_size", "sibling_count", "sibling_index"):
        mine, theirs = getattr(head, name), getattr(sample, name)
        assert type(mine) is type(theirs) and mine == theirs, name
    return head


# Each field of `Sample` as core/_plain_scan.c reads it. A field added, removed or retyped (a narrower type,
# a constraint) must change the C too: the scan would otherwise accept what `decode_sample` refuses.
SCANNED = {
    "schema_version": "<class 'int'>", "group_index": "int | None", "index": "int | None",
    "rollout_id": "int | str | None", "prompt": "<class 'str'>", "response": "<class 'str'>",
    "label": "str | None", "tokens": "rollout_stream.codec.arrays.Array | None",
    "response_length": "<class 'int'>",
    "reward": "float | dict[str, float] | None", "loss_mask": "rollout_stream.codec.arrays.Array | None",
    "rollout_log_probs": "rollout_stream.codec.arrays.Array | None", "status": "<class 'str'>",
    "remove_sample": "<class 'bool'>", "weight_versions": "list[str]", "metadata": "dict[str, typing.Any]",
    "group_size": "int | None", "sibling_count": "<class 'int'>", "sibling_index": "<class 'int'>",
    "run_id": "str | None", "teacher_log_probs": "rollout_stream.codec.arrays.Array | None",
    "opd_reverse_kl": "rollout_stream.codec.arrays.Array | None",
    "rollout_routed_experts": "rollout_stream.codec.arrays.ShapedArray | None",
    "rollout_indexer_topk": "rollout_stream.codec.arrays.ShapedArray | None",
    "train_metadata": "dict[str, typing.Any] | None",
    "rollout_sampling_mask_ids": "rollout_stream.codec.arrays.Array | None",
    "rollout_sampling_mask_offsets": "rollout_stream.codec.arrays.Array | None",
    "weight_version_offsets": "rollout_stream.codec.arrays.Array | None",
}


def test_the_scan_reads_every_field_of_a_sample_as_its_type() -> None:
    assert {f.name: str(f.type) for f in msgspec.structs.fields(Sample)} == SCANNED


@needs_scan
def test_the_scan_knows_every_field_of_a_sample_and_no_other() -> None:
    from rollout_stream.core import _plain_scan
    assert set(_plain_scan.FIELDS) == {"type"} | set(SCANNED)


@needs_scan
def test_a_limit_beyond_int64_is_left_to_the_python() -> None:
    assert scan is not None
    assert scan(encode_sample(_plain()), b"run/7", 2**63, 4096, 1024) is None


@needs_scan
@settings(max_examples=1500, deadline=None)
@given(edge_samples(), _limits)
def test_a_head_only_for_a_plainly_valid_sample_and_always_for_one(drawn: Any, limits: SampleLimits) -> None:
    sample, key = drawn
    value = encode_sample(sample)
    head = _agrees(value, key, limits)
    # msgspec reads an int reward as a float; the scan leaves ints to the Python path (not the common case)
    if head is None and _reference(value, key, limits) is not None and type(sample.reward) is float \
            and sample.rollout_sampling_mask_ids is None:
        pytest.fail("a plainly valid sample with nothing unusual in it took the Python path")


@needs_scan
@settings(max_examples=800, deadline=None)
@given(any_samples(), st.booleans(), _limits)
def test_a_head_for_any_sample_only_where_the_python_path_agrees(sample: Sample, keyed: bool,
                                                                 limits: SampleLimits) -> None:
    key = group_key_of(sample.run_id, sample.group_index).encode() \
        if keyed and sample.group_index is not None else b"0"
    _agrees(encode_sample(sample), key, limits)


@needs_scan
@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edge_samples(), st.data())
def test_a_corrupted_record_gets_a_head_only_when_the_python_path_takes_it_alike(drawn: Any,
                                                                                data: Any) -> None:
    sample, key = drawn
    _agrees(_corrupt(encode_sample(sample), data.draw), key, LIMITS)


def _plain(**fields: Any) -> Sample:
    base: dict[str, Any] = {
        "group_index": 7, "rollout_id": 3, "index": 3, "reward": 0.5, "response_length": 2,
        "tokens": np.arange(4, dtype="<i4"), "loss_mask": np.ones(2, dtype="u1"),
        "rollout_log_probs": np.zeros(2, dtype="<f4"), "group_size": 8, "sibling_count": 2,
        "sibling_index": 1,
        "run_id": "run", "prompt": "p", "weight_versions": ["1"],
    }
    return Sample(**(base | fields))


@needs_scan
@pytest.mark.parametrize("fields", [
    {}, {"run_id": None}, {"run_id": ""}, {"run_id": "rün/ß"}, {"rollout_id": "r-1"}, {"rollout_id": None},
    {"index": None}, {"group_size": None}, {"group_index": -3}, {"group_index": 2**63 - 1},
    {"reward": -0.0}, {"reward": 1e300}, {"metadata": {"k": [1, "x", None, {"n": 2.5}], "b": b"\x00"}},
    {"train_metadata": {"loss": "x"}}, {"label": "l"}, {"remove_sample": True}, {"prompt": "日本語" * 50},
    {"tokens": None, "loss_mask": None, "rollout_log_probs": None},
    {"teacher_log_probs": np.zeros(2, dtype="<f8")}, {"opd_reverse_kl": np.zeros(2, dtype="<f4")},
    {"weight_version_offsets": [0]},
    {"weight_versions": ["1", "2", "4"], "weight_version_offsets": [0, 1, 2]},
    {"weight_versions": ["1", "2"], "weight_version_offsets": np.array([0, 0], dtype="<i8")},
    {"weight_versions": ["1", "2"], "weight_version_offsets": np.array([0, 2], dtype="<u2")},
    {"weight_versions": ["1", "2"], "weight_version_offsets": np.array([0, 1], dtype="<u1")},
    {"weight_versions": [], "weight_version_offsets": []},
])
def test_the_common_records_take_the_scan(fields: dict[str, Any]) -> None:
    sample = _plain(**fields)
    key = group_key_of(sample.run_id, sample.group_index).encode()
    limits = SampleLimits(default_group_size=8)
    assert _agrees(encode_sample(sample), key, limits) is not None


@needs_scan
def test_a_float32_reward_is_read_as_msgspec_reads_it() -> None:
    value = bytearray(encode_sample(_plain(reward=0.1)))
    at = value.index(b"\xa6reward\xcb") + 7
    value[at:at + 9] = b"\xca" + struct.pack(">f", 0.1)  # the same record with a float32 reward
    head = _agrees(bytes(value), b"run/7", LIMITS)
    assert head is not None and head.reward == float(np.float32(0.1))


@needs_scan
@pytest.mark.parametrize(("value", "key"), [
    (encode_sample(_plain(reward=1)), b"run/7"),  # an int reward: the full check
    (encode_sample(_plain(reward=math.nan)), b"run/7"),
    (encode_sample(_plain(reward={"acc": 1.0})), b"run/7"),
    (encode_sample(_plain(reward=None)), b"run/7"),
    (encode_sample(_plain()), None),
    (encode_sample(_plain()), b"run/8"),
    (encode_sample(_plain()), b"run/7 "),
    (encode_sample(_plain(run_id=None)), b"/7"),
    (encode_sample(_plain()) + b"\xc0", b"run/7"),  # trailing bytes
    (encode_sample(_plain(metadata={"a": np.arange(2, dtype="<i4")})), b"run/7"),  # an ext in metadata
    (encode_sample(_plain(group_index=2**63)), b"run/9223372036854775808"),  # beyond int64
    (encode_sample(_plain(rollout_routed_experts=np.zeros((1, 1, 2), dtype="<i4"))), b"run/7"),
    (encode_sample(_plain(schema_version=2)), b"run/7"),
    # weight version offsets that do not fit: one per version, from 0, never decreasing, within the response
    (encode_sample(_plain(weight_version_offsets=[0, 1])), b"run/7"),
    (encode_sample(_plain(weight_versions=["1", "2"], weight_version_offsets=[0])), b"run/7"),
    (encode_sample(_plain(weight_version_offsets=[1])), b"run/7"),
    (encode_sample(_plain(weight_versions=["1", "2"], weight_version_offsets=[0, 3])), b"run/7"),
    (encode_sample(_plain(weight_versions=["1", "2", "3"], weight_version_offsets=[0, 2, 1])), b"run/7"),
    (encode_sample(_plain(weight_versions=["1", "2"], weight_version_offsets=np.array([0, -1], "<i8"))),
     b"run/7"),
    (encode_sample(_plain(weight_version_offsets=np.array([0.0], "<f4"))), b"run/7"),
    (encode_sample(_plain(weight_version_offsets=np.array([False]))), b"run/7"),
    (msgspec.msgpack.encode({"type": "rollout_sample", "group_index": 7, "reward": 0.5, "run_id": "run",
                             "group_size": 8, "weight_versions": ["1"], "weight_version_offsets": [0]}),
     b"run/7"),  # a plain list
    (msgspec.msgpack.encode({"type": "rollout_sample", "group_index": 7, "reward": 0.5, "run_id": "run",
                             "group_size": 8, "unknown": 1}), b"run/7"),
    (msgspec.msgpack.encode({"type": "train_sample", "group_index": 7, "reward": 0.5, "run_id": "run",
                             "group_size": 8}), b"run/7"),
    (msgspec.msgpack.encode({"group_index": 7, "reward": 0.5, "run_id": "run", "group_size": 8}), b"run/7"),
    (msgspec.msgpack.encode({"type": "rollout_sample", "group_index": 7, "reward": 0.5, "run_id": "run",
                             "group_size": 8, "tokens": [1, 2]}), b"run/7"),  # a plain list
    (msgspec.msgpack.encode({"type": "rollout_sample", "group_index": 7, "reward": 0.5, "run_id": b"run",
                             "group_size": 8}), b"run/7"),  # bin, not str
    (b"\x81\xa4type\xaerollout_sample", b"0"),
    (b"", b"0"),
    (b"\xc1", b"0"),
])
def test_what_the_scan_does_not_recognise_it_declines(value: bytes, key: bytes | None) -> None:
    assert _scan(value, key) is None


@needs_scan
def test_a_field_given_twice_is_declined() -> None:
    one = encode_sample(_plain())
    assert one[0] == 0xde  # a map of more than 15 fields: its count in the next two bytes
    twice = b"\xde" + struct.pack(">H", struct.unpack(">H", one[1:3])[0] + 1) + one[3:] + b"\xa6reward\xcb" \
        + struct.pack(">d", 0.75)
    assert decode_sample(twice).reward == 0.75  # msgspec takes the last one
    assert _scan(twice, b"run/7") is None


@needs_scan
def test_invalid_utf8_anywhere_is_declined() -> None:
    value = encode_sample(_plain(prompt="abcd"))
    broken = value.replace(b"\xa4abcd", b"\xa4ab\xed\xa0")  # a lone surrogate: Python's decoder refuses it
    with pytest.raises(DecodeError):
        decode_sample(broken)
    assert _scan(broken, b"run/7") is None
