"""Header names of dead-letter and replayed records (defined once, in `rollout_stream.codec.headers`) and how
the dlq commands read header values.

The dead-letter headers are written by stream/worker/outputs.py (docs/spec.md §4.4); the replay headers are
written by `dlq replay` and read by the worker to window a replayed group apart from its original
(docs/dlq.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from rollout_stream.codec import headers as _names
from rollout_stream.codec.headers import *  # noqa: F403  the names, re-exported for the dlq modules

__all__ = [*_names.__all__, "header_map"]


def header_map(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """Header values as text (last one wins on repeats); bytes that are not UTF-8 are escaped, not dropped."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        out[name] = (value or b"").decode("utf-8", "backslashreplace")
    return out
