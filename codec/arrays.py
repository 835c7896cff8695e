"""Packed numeric arrays: MessagePack ext records that decode without per-element Python work."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import numpy as np

__all__ = ["Array", "array_enc_hook", "array_ext_hook", "array_dec_hook"]

# Ext type codes are part of the wire format: never renumber, only add.
_CODE_BY_DTYPE: dict[np.dtype, int] = {
    np.dtype("<u1"): 10,
    np.dtype("<i4"): 11,
    np.dtype("<i8"): 12,
    np.dtype("<f4"): 13,
    np.dtype("<f8"): 14,
    np.dtype("?"): 15,
}
_DTYPE_BY_CODE = {code: dtype for dtype, code in _CODE_BY_DTYPE.items()}


def _as_ndarray(values: Any) -> np.ndarray:
    if isinstance(values, np.ndarray):
        arr = values
    elif isinstance(values, Array):
        return values.values
    else:
        arr = np.asarray(list(values) if not isinstance(values, list | tuple) else values)
        if arr.size == 0:
            arr = arr.astype("<i4")
        elif arr.dtype.kind in "iu":
            info = np.iinfo(np.int32)
            fits = int(arr.min()) >= info.min and int(arr.max()) <= info.max
            arr = arr.astype("<i4" if fits else "<i8")
        elif arr.dtype.kind == "f":
            # Python floats are doubles: keep them exact rather than silently rounding to float32.
            arr = arr.astype("<f8")
    if arr.ndim != 1:
        raise ValueError(f"arrays must be one-dimensional, got shape {arr.shape}")
    dtype = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    if dtype not in _CODE_BY_DTYPE:
        raise TypeError(f"unsupported array dtype {arr.dtype}; use one of uint8, int32, int64, float32, float64, bool")
    return arr.astype(dtype, copy=False)


class Array:
    """A 1-D numeric array (tokens, log-probs, masks) that travels as raw little-endian bytes."""

    __slots__ = ("values",)

    def __init__(self, values: Iterable[Any] | np.ndarray) -> None:
        self.values: np.ndarray = _as_ndarray(values)

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes)

    def numpy(self) -> np.ndarray:
        """The values as a (possibly read-only, zero-copy) numpy array."""
        return self.values

    def tensor(self) -> Any:
        """The values as a torch tensor (one bulk memory copy, no per-element work)."""
        import torch

        return torch.from_numpy(np.array(self.values, copy=True))

    def tolist(self) -> list[Any]:
        return self.values.tolist()

    def __len__(self) -> int:
        return int(self.values.shape[0])

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values.tolist())

    def __getitem__(self, item: Any) -> Any:
        return self.values[item]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Array):
            return self.values.dtype == other.values.dtype and bool(np.array_equal(self.values, other.values))
        if isinstance(other, list | tuple | np.ndarray):
            return bool(np.array_equal(self.values, np.asarray(other)))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Array({self.values.dtype}, len={len(self)})"


def array_enc_hook(obj: Any) -> Any:
    if isinstance(obj, Array):
        return msgspec.msgpack.Ext(_CODE_BY_DTYPE[obj.values.dtype], obj.values.tobytes())
    if isinstance(obj, np.ndarray):
        return array_enc_hook(Array(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    raise NotImplementedError(f"cannot encode objects of type {type(obj).__name__}")


def array_ext_hook(code: int, data: memoryview) -> Any:
    dtype = _DTYPE_BY_CODE.get(code)
    if dtype is None:
        raise ValueError(f"unknown ext type code {code}")
    if len(data) % dtype.itemsize:
        raise ValueError(f"ext type {code} ({dtype}) payload of {len(data)} bytes is not a whole number of items")
    arr = Array.__new__(Array)
    # Zero-copy view into the message buffer; read-only, which is what a decoded record should be.
    arr.values = np.frombuffer(data, dtype=dtype)
    return arr


def array_dec_hook(tp: type, obj: Any) -> Any:
    if tp is Array:
        if isinstance(obj, Array):
            return obj
        if isinstance(obj, list):
            # Interop: producers in other languages may send plain MessagePack arrays of numbers.
            if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in obj):
                raise ValueError("array elements must be numbers")
            return Array(obj)
        raise ValueError(f"expected a packed array or a list of numbers, got {type(obj).__name__}")
    raise NotImplementedError(f"cannot decode type {tp!r}")
