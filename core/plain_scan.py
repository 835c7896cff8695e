"""The stage's common case in one pass over a record's bytes, in C (core/_plain_scan.c), where it is built.

Most records are valid samples with a finite float reward, keyed by their group. For those, the window
store ran `rollout_stream.codec.head.decode_head` (a `SampleHead` of some 25 Python objects) and then
`rollout_stream.core.validate.plainly_valid` over its attributes. `plain_head` does both in one pass over the
MessagePack
bytes and builds one small struct, `rollout_stream.core.structs.PlainHead`. It decides nothing of its own: it
returns a
head only for a record `decode_sample` takes, with the same values, and `plainly_valid` accepts (rollout
log-probs all finite, no sampling mask, weight version offsets that fit), with the
same group key; anything else is None, and the store takes the Python path, which says what is wrong.
tests/core/test_plain_scan.py compares it with that path on random and corrupted records.

It is built with the package (setup.py) where a C compiler is found: without one, or with
``ROLLOUT_STREAM_COMPILED=0`` (codec/compiled.py), `scanner()` is None and the stage runs the Python path.
"""

from __future__ import annotations

from collections.abc import Callable

from rollout_stream.codec import compiled
from rollout_stream.codec.arrays import _ITEMS_BY_CODE
from rollout_stream.codec.records import SCHEMA_VERSION
from rollout_stream.core.structs import PlainHead

__all__ = ["PlainScan", "scanner"]

PlainScan = Callable[[bytes, bytes | None, int | None, int, int], PlainHead | None]
"""`plain_head(value, key, default_group_size, max_group_size, max_sibling_count)`"""

try:
    from rollout_stream.core import _plain_scan
except ImportError:  # not built: no C compiler when the package was installed
    _plain_scan = None  # type: ignore[assignment]
if not compiled.enabled():
    _plain_scan = None  # type: ignore[assignment]
if _plain_scan is not None:
    # the packed arrays' item sizes and the schema version from the codec's own tables, not copies in C
    _plain_scan.configure(PlainHead, {code: size for code, (_, size) in _ITEMS_BY_CODE.items()},
                          SCHEMA_VERSION,
                          {code: size for code, (dtype, size) in _ITEMS_BY_CODE.items() if dtype.kind == "f"},
                          {code: -size if dtype.kind == "i" else size
                           for code, (dtype, size) in _ITEMS_BY_CODE.items() if dtype.kind in "iu"})


def scanner() -> PlainScan | None:
    """`plain_head` where the native module is in use, else None."""
    return None if _plain_scan is None else _plain_scan.plain_head
