"""The hot path's C extensions, and the switch to the Python they shortcut.

Three steps that run for every consumed record have a C extension beside their Python (`NATIVE_MODULES`):
the one-pass scan of core/plain_scan.py, the float32 group statistics of core/rewards.py and a group's
train records of codec/wire.py. Each answers only where it answers as the Python does and leaves the rest
to it; the Python stays the reference and the fallback (docs/compiled.md).

They are built with the package (setup.py: `pip install -e .`, so `make venv`), and optional: without a C
compiler the install succeeds without them, their imports fail, and the stage runs the Python.
``ROLLOUT_STREAM_COMPILED=0`` makes the modules that import them leave them unused: `make test` runs the
core and codec tests that way first.

`status()` says which path this process runs, for the worker's `worker.started` log line and the bench's
report.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import cache

__all__ = ["NATIVE_MODULES", "ENV", "CompiledStatus", "enabled", "status"]

NATIVE_MODULES = (
    "rollout_stream.core._plain_scan",
    "rollout_stream.core._float32_statistics",
    "rollout_stream.codec._train_values",
)
ENV = "ROLLOUT_STREAM_COMPILED"


def enabled() -> bool:
    """Whether the C extensions may be used: False with ``ROLLOUT_STREAM_COMPILED=0``."""
    return os.environ.get(ENV, "").strip() != "0"


@dataclass(frozen=True, slots=True)
class CompiledStatus:
    in_use: tuple[str, ...]  # the C extensions this process runs
    reason: str  # why the others are not in use, or "" when every one is

    @property
    def active(self) -> bool:
        return not self.reason

    def describe(self) -> str:
        """One line for logs and reports."""
        if self.active:
            return "C extensions"
        if not self.in_use:
            return f"pure Python ({self.reason})"
        return f"C extensions {', '.join(self.in_use)}, pure Python for the rest ({self.reason})"


@cache
def status() -> CompiledStatus:
    """Which C extensions this process runs; their importers decide the same way (tests/core/test_compiled.py
    checks that they agree)."""
    if not enabled():
        return CompiledStatus((), f"{ENV}=0")
    in_use: list[str] = []
    not_built: list[str] = []
    failed: list[str] = []
    for name in NATIVE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # not built (no C compiler at install), or built for another interpreter
            if isinstance(exc, ModuleNotFoundError) and exc.name == name:
                not_built.append(name)
            else:
                failed.append(f"{name}: {exc}")
        else:
            in_use.append(name)
    reasons = [f"not built: {', '.join(not_built)}"] if not_built else []
    return CompiledStatus(tuple(in_use), "; ".join(reasons + failed))
