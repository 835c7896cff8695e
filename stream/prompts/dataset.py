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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from rollout_stream.errors import ConfigurationError

__all__ = ["DatasetError", "Row", "fingerprint", "load_rows"]

Row = dict[str, Any]


class DatasetError(ConfigurationError):
    """The dataset cannot be read: missing, of an unknown format, or a row that is not a JSON object."""


def load_rows(path: str | Path) -> list[Row]:
    """Every row of the dataset at `path`, in file order: a `.jsonl` file, a `.parquet` file, or a directory
    saved by `datasets.Dataset.save_to_disk` (its `.arrow` files in the order its state.json lists)."""
    p = Path(path)
    if p.is_dir():
        return _arrow_dir(p)
    if not p.exists():
        raise DatasetError(f"dataset {p}: no such file or directory")
    if p.suffix in (".jsonl", ".ndjson"):
        return _jsonl(p)
    if p.suffix == ".parquet":
        pq = _pyarrow("parquet")
        return list(pq.read_table(p).to_pylist())
    raise DatasetError(f"dataset {p}: a .jsonl or .parquet file, or a directory saved by datasets, expected")


def _jsonl(p: Path) -> list[Row]:
    rows: list[Row] = []
    with p.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = msgspec.json.decode(line)
            except msgspec.DecodeError as exc:
                raise DatasetError(f"dataset {p} line {number}: {exc}") from exc
            if not isinstance(row, dict):
                raise DatasetError(f"dataset {p} line {number}: a JSON object expected, got "
                                   f"{type(row).__name__}")
            rows.append(row)
    return rows


def _arrow_dir(p: Path) -> list[Row]:
    state = p / "state.json"
    if state.exists():
        files = [p / f["filename"] for f in json.loads(state.read_text()).get("_data_files", [])]
    else:
        files = sorted(p.glob("*.arrow"))
    if not files:
        raise DatasetError(f"dataset {p}: a directory without .arrow files (saved by datasets.save_to_disk?)")
    ipc = _pyarrow("ipc")
    rows: list[Row] = []
    for f in files:
        with ipc.open_stream(f) as reader:  # save_to_disk writes the Arrow streaming format
            rows += reader.read_all().to_pylist()
    return rows


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
