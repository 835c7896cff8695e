"""Small file chores of the broker: JSON state written atomically, log reading, a failure's cause line."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["failure_cause", "file_size", "read_json", "read_lines_from", "write_json"]

_EXCEPTION_LINE = re.compile(r"^\s*(Caused by: )?([\w$]+\.)*[\w$]*(Exception|Error)(: .*)?$")
_LOG4J_ERROR = re.compile(r"^\[[^\]]+\] (ERROR|FATAL) (?P<msg>.*?)( \([\w.$]+\))?$")


def failure_cause(lines: list[str]) -> str:
    """The root cause if a Java exception was printed, else the first ERROR line, else the last line."""
    exceptions = [line.strip().removeprefix("Caused by: ") for line in lines if _EXCEPTION_LINE.match(line)]
    if exceptions:
        return exceptions[-1][:300]
    for line in lines:
        match = _LOG4J_ERROR.match(line)
        if match:
            return match.group("msg")[:300]
    nonblank = [line.strip() for line in lines if line.strip()]
    return nonblank[-1][:300] if nonblank else "no output"


def file_size(path: Path) -> int:
    """Size in bytes, 0 if missing."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def read_lines_from(path: Path, offset: int) -> list[str]:
    """The lines written after byte `offset` (what this start added to an appended log)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace").splitlines()
    except OSError:
        return []


def read_json(path: Path) -> dict[str, Any]:
    """The object in a JSON file; {} if missing or unreadable (a stale state file is not an error)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)
