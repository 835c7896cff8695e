"""Packed arrays (codec/arrays.py): dtype inference, ext wire codes, equality, zero-copy decode, torch."""

from __future__ import annotations

import math
import struct

import msgspec
import numpy as np
import pytest
import torch

from rollout_stream.codec.arrays import Array, array_dec_hook, array_enc_hook, array_ext_hook

ENCODER = msgspec.msgpack.Encoder(enc_hook=array_enc_hook)
DECODER = msgspec.msgpack.Decoder(Array, dec_hook=array_dec_hook, ext_hook=array_ext_hook)

# (numpy dtype, ext code on the wire, torch dtype, sample values). Codes are part of the wire format.
DTYPES = [
    ("<u1", 10, torch.uint8, [0, 1, 255]),
    ("<i4", 11, torch.int32, [-(2**31), -1, 0, 2**31 - 1]),
    ("<i8", 12, torch.int64, [-(2**63), -1, 0, 2**63 - 1]),
    ("<f4", 13, torch.float32, [-1.5, 0.0, 3.25, float("inf"), -float("inf")]),
    ("<f8", 14, torch.float64, [0.1, 1 / 3, 5e-324, 1.7976931348623157e308, -0.0]),
    ("?", 15, torch.bool, [True, False, True]),
    ("<u2", 16, torch.uint16, [0, 1, 255, 65535]),
]
DTYPE_IDS = [d[0] for d in DTYPES]


def roundtrip(arr: Array, buf_type: type = bytes) -> Array:
    return DECODER.decode(buf_type(ENCODER.encode(arr)))


# --- round trips and dtype inference -------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "code", "torch_dtype", "values"), DTYPES, ids=DTYPE_IDS)
def test_every_dtype_roundtrips_with_its_pinned_ext_code(dtype, code, torch_dtype, values):
    arr = Array(np.array(values, dtype=dtype))
    encoded = ENCODER.encode(arr)
    ext = msgspec.msgpack.decode(encoded)  # no ext_hook: the raw Ext record
    assert isinstance(ext, msgspec.msgpack.Ext)
    assert ext.code == code
    assert ext.data == np.array(values, dtype=dtype).tobytes()
    back = DECODER.decode(encoded)
    assert back.dtype == np.dtype(dtype)
    assert back == arr
    assert back.tolist() == np.array(values, dtype=dtype).tolist()


@pytest.mark.parametrize(("dtype", "code", "torch_dtype", "values"), DTYPES, ids=DTYPE_IDS)
def test_empty_array_of_every_dtype_roundtrips(dtype, code, torch_dtype, values):
    back = roundtrip(Array(np.empty(0, dtype=dtype)))
    assert back.dtype == np.dtype(dtype)
    assert len(back) == 0
    assert back.tolist() == []


def test_empty_list_is_int32():
    arr = Array([])
    assert arr.dtype == np.dtype("<i4")
    assert roundtrip(arr) == Array(np.empty(0, dtype="<i4"))


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        ([1, 2, 3], "<i4"),
        ([-(2**31), 2**31 - 1], "<i4"),
        ([2**31], "<i8"),
        ([-(2**31) - 1, 0], "<i8"),
        ([-(2**63), 2**63 - 1], "<i8"),
        ((1, 2), "<i4"),
        (range(5), "<i4"),
        ([True, False], "?"),
    ],
)
def test_python_int_lists_pick_the_narrowest_exact_dtype(values, dtype):
    arr = Array(values)
    assert arr.dtype == np.dtype(dtype)
    assert roundtrip(arr).tolist() == list(values)


@pytest.mark.parametrize("values", [[2**63], [2**64 - 1], [-1, 2**63], [0, -(2**63) - 1], [2**80]])
def test_ints_beyond_int64_are_refused_not_wrapped_or_rounded(values):
    with pytest.raises((OverflowError, TypeError)):
        Array(values)


def test_python_float_lists_stay_float64_bit_exact():
    values = [0.1, 1 / 3, math.pi, 5e-324, 1e308, -0.0, 2.0**-1074]
    back = roundtrip(Array(values))
    assert back.dtype == np.dtype("<f8")
    assert [struct.pack("<d", x) for x in back.tolist()] == [struct.pack("<d", x) for x in values]


def test_mixed_int_float_list_is_float64():
    assert Array([1, 2.5]).dtype == np.dtype("<f8")


def test_numpy_float32_stays_float32():
    values = np.array([0.1, -2.5, 1e-30], dtype=np.float32)
    back = roundtrip(Array(values))
    assert back.dtype == np.dtype("<f4")
    assert np.array_equal(back.numpy(), values)


def test_big_endian_input_is_stored_little_endian_with_same_values():
    values = np.array([1, 256, -2], dtype=">i4")
    arr = Array(values)
    assert arr.dtype == np.dtype("<i4")
    assert roundtrip(arr).tolist() == [1, 256, -2]


def test_non_contiguous_input_roundtrips():
    values = np.arange(10, dtype=np.int64)[::3]
    assert roundtrip(Array(values)).tolist() == [0, 3, 6, 9]


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (np.zeros((2, 2), dtype=np.int32), ValueError),
        (np.zeros(3, dtype=np.int16), TypeError),
        (np.zeros(3, dtype=np.complex64), TypeError),
        (["a", "b"], TypeError),
    ],
)
def test_unsupported_shapes_and_dtypes_are_refused(values, error):
    with pytest.raises(error):
        Array(values)


def test_numpy_scalars_encode_as_plain_numbers():
    assert msgspec.msgpack.decode(ENCODER.encode([np.int64(3), np.float32(0.5)])) == [3, 0.5]


def test_raw_ndarray_encodes_as_packed_array():
    encoded = ENCODER.encode(np.array([1, 2], dtype=np.int64))
    assert DECODER.decode(encoded) == Array(np.array([1, 2], dtype=np.int64))


# --- equality and container behaviour --------------------------------------------------------------


def test_equality_requires_same_dtype_and_values():
    a = Array(np.array([1, 2, 3], dtype=np.int32))
    assert a == Array([1, 2, 3])
    assert a != Array(np.array([1, 2, 3], dtype=np.int64))  # same values, different wire type
    assert a != Array([1, 2, 4])
    assert a != Array([1, 2])


def test_equality_with_plain_sequences_compares_values_only():
    a = Array(np.array([1, 2, 3], dtype=np.int64))
    assert a == [1, 2, 3]
    assert a == (1, 2, 3)
    assert a == np.array([1.0, 2.0, 3.0])
    assert a != [1, 2]
    assert a != [[1], [2, 3]]  # ragged: not equal, not an exception


def test_nan_equals_nan_so_a_record_equals_its_decoded_copy():
    a = Array(np.array([np.nan, 1.0], dtype=np.float32))
    assert a == a
    assert roundtrip(a) == a
    assert a != Array(np.array([np.nan, 2.0], dtype=np.float32))


def test_comparison_with_other_types_is_not_equal_and_array_is_unhashable():
    a = Array([1])
    assert a != "1"
    assert a != 1
    assert a != None  # noqa: E711
    with pytest.raises(TypeError):
        hash(a)


def test_sequence_protocol():
    a = Array([5, 6, 7])
    assert len(a) == 3
    assert list(a) == [5, 6, 7]
    assert a[1] == 6
    assert a[1:].tolist() == [6, 7]
    assert a.nbytes == 12
    assert repr(a) == "Array(int32, len=3)"


# --- torch ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("dtype", "code", "torch_dtype", "values"), DTYPES, ids=DTYPE_IDS)
def test_tensor_has_matching_dtype_and_values(dtype, code, torch_dtype, values):
    t = roundtrip(Array(np.array(values, dtype=dtype))).tensor()
    assert t.dtype == torch_dtype
    assert t.tolist() == np.array(values, dtype=dtype).tolist()


def test_tensor_of_decoded_array_is_writable_and_does_not_alias_the_message():
    buf = bytearray(ENCODER.encode(Array([1, 2, 3])))
    arr = DECODER.decode(buf)
    t = arr.tensor()
    t[0] = 99
    assert arr.tolist() == [1, 2, 3]
    assert bytes(buf) == ENCODER.encode(Array([1, 2, 3]))


# --- zero-copy decode --------------------------------------------------------------------------------


def test_decode_is_zero_copy_view_of_the_input_buffer():
    buf = ENCODER.encode(Array(np.arange(4096, dtype=np.int32)))
    arr = DECODER.decode(buf).numpy()
    assert np.shares_memory(arr, np.frombuffer(buf, dtype=np.uint8))
    # Base chain: ndarray -> memoryview handed to the ext hook -> the very bytes object we decoded.
    assert isinstance(arr.base, memoryview)
    assert arr.base.obj is buf
    assert not arr.flags.writeable  # bytes are immutable; the view must be too


def test_decoded_view_keeps_its_buffer_alive():
    arr = DECODER.decode(bytes(ENCODER.encode(Array([7, 8, 9]))))  # only the view holds the bytes
    assert arr.tolist() == [7, 8, 9]


# --- hooks: plain-list interop and bad ext records ---------------------------------------------------


def test_plain_msgpack_list_decodes_to_array():
    arr = DECODER.decode(msgspec.msgpack.encode([1, 2, 2**40]))
    assert isinstance(arr, Array)
    assert arr.dtype == np.dtype("<i8")
    assert arr == [1, 2, 2**40]
    floats = DECODER.decode(msgspec.msgpack.encode([0.5, -1.25]))
    assert floats.dtype == np.dtype("<f8")


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ([1, "x"], "array elements must be numbers"),
        ([True, 1], "array elements must be numbers"),
        ([[1, 2]], "array elements must be numbers"),
        ([1, 2**64 - 1], "out of int64 range"),
        ({"a": 1}, "expected a packed array"),
        ("tokens", "expected a packed array"),
    ],
)
def test_bad_plain_values_are_validation_errors(payload, match):
    with pytest.raises(msgspec.ValidationError, match=match):
        DECODER.decode(msgspec.msgpack.encode(payload))


def test_ext_payload_not_a_whole_number_of_items_is_refused():
    with pytest.raises(ValueError, match="not a whole number of items"):
        DECODER.decode(msgspec.msgpack.encode(msgspec.msgpack.Ext(11, b"\x00" * 7)))


@pytest.mark.parametrize("code", [0, 9, 17, 127, -128])
def test_unknown_ext_code_is_refused(code):
    with pytest.raises(ValueError, match="unknown ext type code"):
        DECODER.decode(msgspec.msgpack.encode(msgspec.msgpack.Ext(code, b"\x00" * 8)))


def test_dec_hook_refuses_other_types():
    with pytest.raises(NotImplementedError):
        array_dec_hook(complex, 1)
    with pytest.raises(NotImplementedError):
        array_enc_hook(object())
