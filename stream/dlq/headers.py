"""Header names of dead-letter and replayed records: the contract between `dlq replay` and the worker.

The dead-letter headers are written by stream/outputs.py (SPEC §4.4); the replay headers are written by
`dlq replay` and read by the worker to window a replayed group apart from its original (docs/dlq.md).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "REASON",
    "MESSAGE",
    "ORIGINAL_TOPIC",
    "ORIGINAL_PARTITION",
    "ORIGINAL_OFFSET",
    "ORIGINAL_TIMESTAMP",
    "GROUP_KEY",
    "STAGE_VERSION",
    "FAILED_AT",
    "ORIGINAL_HEADERS",
    "CARRIED_ON_REPLAY",
    "FAILURE_HEADERS",
    "REPLAY_ID",
    "REPLAY_COUNT",
    "REPLAYED_FROM",
    "REPLAY_HEADERS",
    "header_map",
]

from codec.headers import (  # noqa: F401  re-exported for the dlq modules
    REASON,
    MESSAGE,
    ORIGINAL_TOPIC,
    ORIGINAL_PARTITION,
    ORIGINAL_OFFSET,
    ORIGINAL_TIMESTAMP,
    GROUP_KEY,
    STAGE_VERSION,
    FAILED_AT,
    ORIGINAL_HEADERS,
    CARRIED_ON_REPLAY,
    FAILURE_HEADERS,
    REPLAY_ID,
    REPLAY_COUNT,
    REPLAYED_FROM,
    REPLAY_HEADERS,
)


def header_map(headers: Iterable[tuple[str, bytes | None]] | None) -> dict[str, str]:
    """Header values as text (last one wins on repeats); bytes that are not UTF-8 are escaped, not dropped."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        out[name] = (value or b"").decode("utf-8", "backslashreplace")
    return out
