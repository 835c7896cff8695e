"""Structured log lines: `event=name key=value …` for people, or one JSON object per line for machines."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

__all__ = ["configure_logging", "log_event"]


class _Formatter(logging.Formatter):
    def __init__(self, fmt: str) -> None:
        super().__init__()
        self.json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        event = getattr(record, "event", None) or record.getMessage()
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        if self.json:
            return json.dumps({"ts": ts, "level": record.levelname.lower(), "event": event, **fields},
                              default=str)
        parts = [ts, record.levelname.lower().ljust(5), f"event={event}", *_pairs(fields)]
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _pairs(fields: dict[str, Any]) -> list[str]:
    out = []
    for k, v in fields.items():
        text = str(v)
        if not text or any(c in text for c in ' ="'):
            text = json.dumps(text)
        out.append(f"{k}={text}")
    return out


class _Line:
    """The message of an event: `name key=value …`, rendered only if a handler other than ours formats it (a
    library user's logging, or Python's last-resort handler: `topic.waiting` alone named no topic)."""

    __slots__ = ("event", "fields")

    def __init__(self, event: str, fields: dict[str, Any]) -> None:
        self.event, self.fields = event, fields

    def __str__(self) -> str:
        return " ".join([self.event, *_pairs(self.fields)])


class _StderrHandler(logging.StreamHandler[TextIO]):
    """Writes to `sys.stderr` as it is at each record, not as it was when logging was configured: a command
    run in-process (a CLI test runner, a notebook) swaps stderr and closes its copy, and a handler bound to
    that copy made every later log line of the process fail ("I/O operation on closed file")."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass


def configure_logging(fmt: str = "text", level: str = "info") -> None:
    handler = _StderrHandler()
    handler.setFormatter(_Formatter(fmt))
    root = logging.getLogger("rollout_stream")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    logging.getLogger("kafka").setLevel(logging.ERROR)


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    if logger.isEnabledFor(level):
        logger.log(level, _Line(event, fields), extra={"fields": fields, "event": event})
