"""What a prompt source raises (docs/loop.md, "What a rollout process can catch"), and how a failure is
written in the log."""

from __future__ import annotations

from rollout_stream.errors import ConfigurationError, RuntimeFailure
from rollout_stream.pacing import PacingTimeout

__all__ = ["ERROR_CHARS", "DatasetMismatch", "LogNotFolded", "NothingToTake", "SourceFinished",
           "describe_error"]

ERROR_CHARS = 500  # of a failure's `Type: message` in the log (a checkpoint holds the open epochs' attempts)


class DatasetMismatch(ConfigurationError):
    """The log already has a source of this name over other rows (or other seed, epochs, attempts)."""


class SourceFinished(RuntimeFailure):
    """Every epoch of the source has handed out every prompt and none is waiting to be handed out again."""


class NothingToTake(PacingTimeout):
    """A take waited its whole timeout while every prompt that could be handed out was in flight elsewhere."""


class LogNotFolded(RuntimeFailure, TimeoutError):
    """The admission log was not folded up to this process's own record (the message says how far it got)."""


def describe_error(exc: BaseException) -> str:
    """`Type: message` of a failure, as the log keeps it (cut to ERROR_CHARS)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS - 1] + "…"
