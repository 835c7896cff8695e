"""A rollout record decoded for the stage: every field of `Sample`, its packed arrays left as ext payloads.

The stage reads a sample's scalars and the sizes of its arrays, nothing more. Decoding a record as a
`Sample` makes an `Array` of each packed array through two Python hooks (msgspec calls the ext hook, then
the dec hook for the custom type) and runs `__post_init__`: most of what a short sample's decode costs
(docs/benchmarks.md). `SampleHead` has the same fields, names, types and defaults, built from `Sample`'s
own definition, except that a packed array stays the `msgspec.msgpack.Ext` msgspec made of it, in C.

msgspec copies an `Ext` payload into a new bytes object, where the hook got a view: for large records
the copy costs more than the hooks it saves (docs/benchmarks.md has where they cross). So records over
`HEAD_MAX_BYTES` are decoded whole.

`decode_head` is a shortcut, never a second judge: it returns a head only for a record `decode_sample`
decodes too, with the same values; for anything else (an array sent as a plain list, MoE routing arrays, a
bad payload, any decode error, a large record) it returns None, and the caller decodes the record whole,
which gives the record's error message. tests/codec/test_head.py checks both on random and corrupted
records.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

import msgspec
from msgspec.msgpack import Ext

from rollout_stream.codec.arrays import _ITEMS_BY_CODE, Array, ShapedArray, array_ext_hook
from rollout_stream.codec.records import SCHEMA_VERSION, Sample

__all__ = ["HEAD_MAX_BYTES", "SampleHead", "RolloutFields", "decode_head", "item_count", "ext_all_finite",
           "ext_integers"]

HEAD_MAX_BYTES = 32 * 1024
"""Larger records are decoded whole (the module's docstring says why)."""


class RolloutFields(Protocol):
    """What the stage reads of a rollout record, on a `Sample` and a `SampleHead` alike."""

    group_index: int | None
    index: int | None
    rollout_id: int | str | None
    reward: float | dict[str, float] | None
    group_size: int | None
    sibling_count: int
    sibling_index: int
    run_id: str | None
    response_length: int
    tokens: Any  # an Array in a Sample, an Ext in a SampleHead
    loss_mask: Any
    rollout_log_probs: Any
    rollout_sampling_mask_ids: Any
    rollout_sampling_mask_offsets: Any
    weight_versions: list[str]
    weight_version_offsets: Any


def _head_fields() -> list[tuple[str, Any, Any]]:
    fields: list[tuple[str, Any, Any]] = []
    for f in msgspec.structs.fields(Sample):
        tp: Any = f.type
        if tp == Array | None:
            tp = Ext | None
        elif tp == ShapedArray | None:
            tp = None  # routing replay arrays are decoded whole: a head takes only records without them
        default = f.default if f.default_factory is msgspec.NODEFAULT \
            else msgspec.field(default_factory=f.default_factory)
        fields.append((f.name, tp, default))
    return fields


SampleHead: Any = msgspec.defstruct(
    "SampleHead", _head_fields(), kw_only=True, tag="rollout_sample", tag_field="type", module=__name__,
)
"""`Sample`'s fields with packed arrays as `Ext` payloads (`item_count` gives their lengths)."""

_head_decoder = msgspec.msgpack.Decoder(SampleHead, ext_hook=array_ext_hook)  # the hook: exts in metadata
_ITEM_SIZE: dict[int, int] = {code: size for code, (_, size) in _ITEMS_BY_CODE.items()}


def decode_head(data: bytes | memoryview) -> RolloutFields | None:
    """The record's `SampleHead` when `decode_sample` would decode it to the same values, else None."""
    if len(data) > HEAD_MAX_BYTES:
        return None
    try:
        head = _head_decoder.decode(data)
    except (msgspec.DecodeError, ValueError, TypeError, OverflowError, RecursionError):
        return None
    if not 1 <= head.schema_version <= SCHEMA_VERSION:
        return None
    size = _ITEM_SIZE.get
    for ext in (head.tokens, head.loss_mask, head.rollout_log_probs, head.teacher_log_probs,
                head.opd_reverse_kl, head.rollout_sampling_mask_ids, head.rollout_sampling_mask_offsets,
                head.weight_version_offsets):
        if ext is not None:
            itemsize = size(ext.code)
            if itemsize is None or len(ext.data) % itemsize:
                return None  # array_ext_hook refuses it: the whole decode says why
    return head  # type: ignore[no-any-return]


def item_count(ext: Ext) -> int:
    """How many items a head's packed array holds (its payload was checked by `decode_head`)."""
    return len(ext.data) // _ITEM_SIZE[ext.code]  # type: ignore[arg-type]  # decoded: bytes


def ext_all_finite(ext: Ext) -> bool:
    """Whether a head's packed array certainly holds no NaN or infinity (integer and bool arrays always).

    A float is NaN or infinite only when its exponent bits are all ones, so its most significant byte (the
    last, little-endian) is 0x7F or 0xFF. Looking at those bytes alone is a C-speed slice and translate,
    where numpy's `isfinite` cost more than the rest of a short record's validation. A finite value that
    large (above 1.7e38 in float32) is rare: it answers False too, and the full check decides.
    """
    itemsize = _FLOAT_SIZE.get(ext.code)
    if itemsize is None:
        return True
    data: bytes = ext.data  # type: ignore[assignment]  # decoded: bytes
    return not data[itemsize - 1::itemsize].translate(None, _NOT_TOP_EXPONENT)


def ext_integers(ext: Ext) -> list[int] | None:
    """A head's packed integer array as Python ints (little-endian on any host); None for a float or bool
    array. For short arrays (one item per weight version): it unpacks every item."""
    layout = _INT_FORMAT.get(ext.code)
    if layout is None:
        return None
    data: bytes = ext.data  # type: ignore[assignment]  # decoded: bytes
    return list(struct.unpack(f"<{len(data) // layout[1]}{layout[0]}", data))


# struct's standard sizes (with "<"), by kind and item size: numpy's own type chars name native C types
_INT_CHAR = {("u", 1): "B", ("u", 2): "H", ("u", 4): "I", ("u", 8): "Q",
             ("i", 1): "b", ("i", 2): "h", ("i", 4): "i", ("i", 8): "q"}
_INT_FORMAT: dict[int, tuple[str, int]] = {code: (_INT_CHAR[dtype.kind, size], size)
                                           for code, (dtype, size) in _ITEMS_BY_CODE.items()
                                           if dtype.kind in "iu"}
_FLOAT_SIZE: dict[int, int] = {code: size for code, (dtype, size) in _ITEMS_BY_CODE.items()
                               if dtype.kind == "f"}
# Every most significant byte of a float except those whose exponent bits are all ones (deleted by translate).
_NOT_TOP_EXPONENT = bytes(b for b in range(256) if b & 0x7F != 0x7F)
