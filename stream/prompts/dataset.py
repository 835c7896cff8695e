"""A prompt source's rows, read from local files: JSONL, Parquet, or a Hugging Face `datasets` directory
saved to disk (its Arrow files). No hub: the rows are what the files hold.

Parquet and Arrow need pyarrow, which the package does not install (it is large and only these two formats
use it); JSONL needs nothing. Every process of a run reads the same files, and the fingerprint (a digest of
the rows in order) is what the admission log compares, so a process started on other data is refused.
"""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from rollout_stream.errors import ConfigurationError

__all__ = ["DatasetError", "Row", "fingerprint", "load_rows"]

Row = dict[str, Any]
BOM = b"\xef\xbb\xbf"


class DatasetError(ConfigurationError):
    """The dataset cannot be used: missing, of an unknown format, unreadable, or without rows (the message
    names the path and, for JSONL, the line)."""


def load_rows(path: str | Path) -> list[Row]:
    """Every row of the dataset at `path`, in file order: a `.jsonl` file, a `.parquet` file, or a directory
    saved by `datasets.Dataset.save_to_disk` (its `.arrow` files in the order its state.json lists). A
    UTF-8 byte order mark at the start of a JSONL file is skipped (RFC 8259 lets a parser ignore it)."""
    p = Path(path)
    try:
        if p.is_dir():
            return _arrow_dir(p)
        if not p.exists():
            raise DatasetError(f"dataset {p}: no such file or directory")
        if p.suffix in (".jsonl", ".ndjson"):
            return _jsonl(p)
        if p.suffix == ".parquet":
            pq = _pyarrow("parquet")
            return _arrow_rows(p, lambda: pq.read_table(p), "a Parquet file")
    except OSError as exc:
        raise DatasetError(f"dataset {p}: cannot read it ({type(exc).__name__}: {exc})") from exc
    raise DatasetError(f"dataset {p}: a .jsonl or .parquet file, or a directory saved by datasets, expected")


def _jsonl(p: Path) -> list[Row]:
    rows: list[Row] = []
    with p.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if number == 1 and line.startswith(BOM):
                line = line[len(BOM):]
            if not line.strip():
                continue
            try:
                row = msgspec.json.decode(line)
            except msgspec.DecodeError as exc:
                raise DatasetError(f"dataset {p} line {number}: {_why_not_json(line, exc)}") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"dataset {p} line {number}: a JSON object expected, got "
                                   f"{type(row).__name__}")
            rows.append(row)
    return rows


def _why_not_json(line: bytes, exc: msgspec.DecodeError) -> str:
    """msgspec's message, and what the bytes are where a reader of the file would not guess it."""
    if line.startswith(BOM):
        return "starts with a UTF-8 byte order mark (files concatenated?); save it as UTF-8 without one"
    try:
        json.loads(line)  # Python's json takes NaN and Infinity, which JSON does not have
    except (ValueError, RecursionError):
        return str(exc)
    return f"{exc}: NaN or Infinity is not JSON; write null, a number or a string"


def _arrow_dir(p: Path) -> list[Row]:
    splits = p / "dataset_dict.json"
    if splits.exists():
        try:
            names = json.loads(splits.read_text()).get("splits", [])
        except (ValueError, AttributeError):
            names = []
        where = ", ".join(str(p / name) for name in names) or "one split's directory"
        raise DatasetError(f"dataset {p}: a DatasetDict (several splits); give one split: {where}")
    state = p / "state.json"
    if state.exists():
        try:
            files = [p / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise DatasetError(f"dataset {p}: {state.name} is not the state.json datasets.save_to_disk "
                               f"writes ({type(exc).__name__}: {exc})") from exc
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise DatasetError(f"dataset {p}: {state.name} lists files that are not there: "
                               f"{', '.join(missing[:5])}")
    else:
        files = sorted(p.glob("*.arrow"))
    if not files:
        raise DatasetError(f"dataset {p}: a directory without .arrow files: a directory saved by "
                           f"datasets.Dataset.save_to_disk, a .jsonl or a .parquet file expected")
    ipc = _pyarrow("ipc")
    rows: list[Row] = []
    for f in files:
        rows += _arrow_rows(f, partial(_read_arrow, ipc, f), "an Arrow file")
    return rows


def _read_arrow(ipc: Any, f: Path) -> Any:
    try:
        with ipc.open_stream(f) as reader:  # save_to_disk writes the Arrow streaming format
            return reader.read_all()
    except _pyarrow_lib().ArrowInvalid:
        with ipc.open_file(f) as reader:  # the random-access format, as other tools write
            return reader.read_all()


def _arrow_rows(f: Path, read: Callable[[], Any], what: str) -> list[Row]:
    try:
        return list(read().to_pylist())
    except _pyarrow_lib().ArrowException as exc:
        raise DatasetError(f"dataset {f}: not readable as {what} ({type(exc).__name__}: {exc})") from exc


def _pyarrow_lib() -> Any:
    return _pyarrow("lib")


def _pyarrow(part: str) -> Any:
    try:
        return importlib.import_module(f"pyarrow.{part}")  # optional: not a dependency of the package
    except ImportError as exc:
        raise DatasetError("Parquet and datasets directories need pyarrow (pip install pyarrow); "
                           "JSONL needs nothing") from exc


def fingerprint(rows: Sequence[Row]) -> str:
    """A digest of the rows in order (their JSON, keys sorted)."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(msgspec.json.encode(row, order="sorted"))
        digest.update(b"\n")
    return digest.hexdigest()[:32]
