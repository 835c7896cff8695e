"""Packed numeric arrays: MessagePack ext records that decode without per-element Python work."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Annotated, Any

import msgspec
import numpy as np

__all__ = ["Array", "ShapedArray", "array_enc_hook", "array_ext_hook", "array_dec_hook"]

# Ext type codes are part of the wire format: never renumber, only add.
_CODE_BY_DTYPE: dict[np.dtype, int] = {
    np.dtype("<u1"): 10,
    np.dtype("<i4"): 11,
    np.dtype("<i8"): 12,
    np.dtype("<f4"): 13,
    np.dtype("<f8"): 14,
    np.dtype("?"): 15,
    # Routing replay of up to 65,536 experts (256 fit uint8): half of int32's bytes, carried as given.
    np.dtype("<u2"): 16,
}
_DTYPE_BY_CODE = {code: dtype for dtype, code in _CODE_BY_DTYPE.items()}


_INT32 = np.iinfo(np.int32)
_INT64 = np.iinfo(np.int64)


def _as_ndarray(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray):
        arr = values
    elif isinstance(values, Array):
        return values.values
    else:
        seq = values if isinstance(values, list | tuple) else list(values)
        arr = np.asarray(seq)
        if arr.size == 0:
            arr = arr.astype("<i4")
        elif arr.dtype.kind in "iu":
            lo, hi = int(arr.min()), int(arr.max())
            if lo < _INT64.min or hi > _INT64.max:
                # numpy infers uint64 for ints in [2**63, 2**64): casting would silently wrap them.
                raise OverflowError(f"integers out of int64 range (min {lo}, max {hi})")
            arr = arr.astype("<i4" if lo >= _INT32.min and hi <= _INT32.max else "<i8")
        elif arr.dtype.kind == "f":
            if not any(isinstance(x, float | np.floating) for x in seq):
                # numpy 2 turns ints that fit neither int64 nor uint64 (e.g. [-1, 2**63]) into rounded
                # float64; an all-int list must stay exact or be refused. The scan stops at the first float.
                raise OverflowError("integers out of int64 range")
            # Python floats are doubles: keep them exact rather than silently rounding to float32.
            arr = arr.astype("<f8")
    if arr.ndim != 1:
        raise ValueError(f"arrays must be one-dimensional, got shape {arr.shape}")
    dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    if dtype not in _CODE_BY_DTYPE:
        raise TypeError(
            f"unsupported array dtype {arr.dtype}; use one of uint8, uint16, int32, int64, float32, float64, "
            "bool"
        )
    return arr.astype(dtype, copy=False)


class Array:
    """A 1-D numeric array (tokens, log-probs, masks) that travels as raw little-endian bytes.

    A decoded Array holds a view of the message's bytes and makes the numpy array on first use: the stream
    stage only needs lengths, and making the arrays was much of a short sample's decode (docs/benchmarks.md).
    """

    __slots__ = ("_values", "_data", "_dtype")

    def __init__(self, values: Iterable[Any] | np.ndarray) -> None:
        self._values: np.ndarray | None = _as_ndarray(values)
        self._data: memoryview | None = None
        self._dtype: np.dtype = self._values.dtype

    @classmethod
    def _view(cls, data: memoryview, dtype: np.dtype) -> Array:
        arr = cls.__new__(cls)
        arr._values, arr._data, arr._dtype = None, data, dtype
        return arr

    @property
    def values(self) -> np.ndarray:
        if self._values is None:
            # Zero-copy view into the message buffer; read-only, which is what a decoded record should be.
            self._values = np.frombuffer(self._data, dtype=self._dtype)  # type: ignore[arg-type]
            self._data = None
        return self._values

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def nbytes(self) -> int:
        return len(self._data) if self._data is not None else int(self.values.nbytes)

    def numpy(self) -> np.ndarray:
        """The values as a (possibly read-only, zero-copy) numpy array."""
        return self.values

    def tensor(self) -> Any:
        """The values as a torch tensor (one bulk memory copy, no per-element work)."""
        import torch

        return torch.from_numpy(np.array(self.values, copy=True))

    def tolist(self) -> list[Any]:
        values: list[Any] = self.values.tolist()  # numpy types tolist() as Any
        return values

    def __len__(self) -> int:
        if self._data is not None:
            return len(self._data) // self._dtype.itemsize
        return int(self.values.shape[0])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values.tolist())

    def __getitem__(self, item: Any) -> Any:
        return self.values[item]

    def __eq__(self, other: object) -> bool:
        """Same dtype and values against an Array; same values against a list/tuple/ndarray.

        NaN equals NaN here so that a record equals its own decoded copy (duplicate detection).
        """
        if isinstance(other, Array):
            return self.values.dtype == other.values.dtype and _values_equal(self.values, other.values)
        if isinstance(other, list | tuple | np.ndarray):
            try:
                other_values = np.asarray(other)
            except (ValueError, TypeError, OverflowError):
                return False  # ragged or non-numeric: not an equal array
            return _values_equal(self.values, other_values)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Array({self.values.dtype}, len={len(self)})"


class ShapedArray(msgspec.Struct, kw_only=True):
    """An n-dimensional array (MoE routing replay, indexer top-k): its values packed flat, row-major.

    On the wire a map `{values: <packed Array>, shape: [d0, d1, ...]}`; `numpy()` restores the shape.
    """

    values: Array
    shape: tuple[Annotated[int, msgspec.Meta(ge=0)], ...]

    def __post_init__(self) -> None:
        if not isinstance(self.values, Array):
            self.values = Array(self.values)
        self.shape = tuple(self.shape)
        count = math.prod(self.shape)
        if count != len(self.values):
            # Also runs on decode: msgspec reports it as a validation error with the field's path.
            raise ValueError(f"shape {list(self.shape)} holds {count} items, not {len(self.values)}")

    @classmethod
    def of(cls, values: Any) -> ShapedArray:
        """Pack an array of any shape (an ndarray keeps its dtype; nested lists get `Array`'s inference)."""
        if isinstance(values, np.ndarray):
            return cls(values=Array(np.ascontiguousarray(values).reshape(-1)), shape=values.shape)
        arr = np.asarray(values)
        return cls(values=Array(arr.reshape(-1).tolist()), shape=arr.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    def numpy(self) -> np.ndarray:
        """The values in their shape (a read-only, zero-copy view for a decoded record)."""
        return self.values.numpy().reshape(self.shape)


def _values_equal(a: np.ndarray, b: np.ndarray) -> bool:
    equal_nan = a.dtype.kind == "f" and b.dtype.kind == "f"
    return bool(np.array_equal(a, b, equal_nan=equal_nan))


def array_enc_hook(obj: Any) -> Any:
    if isinstance(obj, Array):
        if obj._data is not None:  # still the bytes it was decoded from
            return msgspec.msgpack.Ext(_CODE_BY_DTYPE[obj._dtype], obj._data)
        return msgspec.msgpack.Ext(_CODE_BY_DTYPE[obj.values.dtype], obj.values.tobytes())
    if isinstance(obj, np.ndarray):
        return array_enc_hook(Array(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot encode objects of type {type(obj).__name__}")


# (dtype, item size) by ext code: the hook runs for every array of every decoded record (3 per sample), so
# it reads both with one lookup instead of asking the dtype.
_ITEMS_BY_CODE: dict[int, tuple[np.dtype, int]] = {
    code: (dtype, dtype.itemsize) for code, dtype in _DTYPE_BY_CODE.items()
}
_new_object = object.__new__


def array_ext_hook(code: int, data: memoryview) -> Any:
    items = _ITEMS_BY_CODE.get(code)
    if items is None:
        raise ValueError(f"unknown ext type code {code}")
    dtype, itemsize = items
    if len(data) % itemsize:
        raise ValueError(
            f"ext type {code} ({dtype}) payload of {len(data)} bytes is not a whole number of items"
        )
    # Array._view, inlined: the classmethod call was a large part of the hook, which runs per packed array.
    arr: Array = _new_object(Array)
    arr._values, arr._data, arr._dtype = None, data, dtype
    return arr


def array_dec_hook(tp: type, obj: Any) -> Any:
    if tp is Array:
        if isinstance(obj, Array):
            return obj
        if isinstance(obj, list):
            # Interop: producers in other languages may send plain MessagePack arrays of numbers.
            if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in obj):
                raise ValueError("array elements must be numbers")
            try:
                return Array(obj)
            except OverflowError as exc:
                raise ValueError(str(exc)) from None  # ValueError: msgspec adds the `$.field` path
        raise ValueError(f"expected a packed array or a list of numbers, got {type(obj).__name__}")
    raise NotImplementedError(f"cannot decode type {tp!r}")
