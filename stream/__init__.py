"""The stream stage and its trainer-side reader; `from stream import TrainDataReader`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["TrainDataReader"]

if TYPE_CHECKING:
    from rollout_stream.reader import TrainDataReader


def __getattr__(name: str) -> Any:
    # Lazy: the reader pulls in torch, which commands that never read train data should not pay for.
    if name == "TrainDataReader":
        from rollout_stream.reader import TrainDataReader

        return TrainDataReader
    raise AttributeError(f"module 'stream' has no attribute {name!r}")
