"""The compiled hot path: mypyc builds of the per-record modules, used only for the sources they came from.

The modules in `COMPILED_MODULES` run once or more per consumed record. mypyc compiles them from the same
typed source into C extensions (docs/compiled.md has what that saves). `NATIVE_MODULES` are written in C
and built beside them: each is the shortcut of a Python path that stays the reference (core/plain_scan.py).
The Python sources stay the reference and the fallback: where no build exists (no C compiler, an installed
wheel, a changed source), the stage imports them as before; `make test` runs the core and codec tests on
both, and tests/core/test_compiled.py compares their decisions record by record.

A build lives in ``${ROLLOUT_STREAM_CACHE:-~/.cache/rollout-stream}/compiled/<key>/``; the key hashes the
modules' sources and the interpreter, so a build is never used for sources it was not made from, and a
fresh clone of the same code reuses it. `python -m stream.tools.compile` makes it (`make compiled`, which
`make test` and `make demo` run).
``ROLLOUT_STREAM_COMPILED=0`` turns it off.

`codec` is the bottom of the import graph, so the switch lives here: `codec/__init__.py` and
`core/__init__.py` put the build's directory first on their package's `__path__`, before they import
anything else.

Not compiled: `core.rewards`. mypyc converts an int where a `float` is declared, and the reward arithmetic
must keep int rewards exact (int rewards beyond 2**53, their printed form in dead-letter messages).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import sys
import sysconfig
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import msgspec

__all__ = ["COMPILED_MODULES", "NATIVE_MODULES", "ENV", "CompiledStatus", "status", "build_dir",
           "package_path", "source_path", "SOURCE_ROOT", "SHARED_LIB_GLOB"]

COMPILED_MODULES = ("codec.head", "core.records", "core.offsets", "core.validate", "core.windows")
# C extensions built beside them (module, source file): the one-pass scan of core/plain_scan.py, the
# float32 group statistics of core/rewards.py, a group's train records of codec/wire.py
NATIVE_MODULES = (("core._plain_scan", "core/_plain_scan.c"),
                  ("core._float32_statistics", "core/_float32_statistics.c"),
                  ("codec._train_values", "codec/_train_values.c"))
ENV = "ROLLOUT_STREAM_COMPILED"
BUILD_FORMAT = "3"  # bumped when the build's method changes (flags, module set): older builds are not used
SOURCE_ROOT = Path(__file__).resolve().parent.parent
SHARED_LIB_GLOB = "*__mypyc" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so")


@dataclass(frozen=True, slots=True)
class CompiledStatus:
    active: bool
    directory: Path
    reason: str  # why not active, or "" when it is

    def describe(self) -> str:
        """One line for logs and reports."""
        return "compiled (mypyc)" if self.active else f"pure Python ({self.reason})"


def source_path(module: str) -> Path:
    return SOURCE_ROOT.joinpath(*module.split(".")).with_suffix(".py")


def _cache_root() -> Path:
    # the same root as the Kafka jars (stream/tools/broker/jars.py); codec cannot import stream
    return Path(os.environ.get("ROLLOUT_STREAM_CACHE") or Path.home() / ".cache" / "rollout-stream")


def build_key() -> str:
    digest = hashlib.sha256(f"{BUILD_FORMAT} {sys.implementation.cache_tag} {platform.machine()} "
                            f"{sysconfig.get_config_var('EXT_SUFFIX')}".encode())
    for module in COMPILED_MODULES:
        digest.update(module.encode() + b"\0" + source_path(module).read_bytes() + b"\0")
    for module, source in NATIVE_MODULES:
        digest.update(module.encode() + b"\0" + (SOURCE_ROOT / source).read_bytes() + b"\0")
    # The C extensions mirror the records' types and msgspec's behaviour: a change to either is a new build.
    digest.update((SOURCE_ROOT / "codec" / "records.py").read_bytes() + b"\0" + msgspec.__version__.encode())
    return digest.hexdigest()[:20]


def build_dir() -> Path:
    """Where the build for these sources is, or would be."""
    return _cache_root() / "compiled" / build_key()


@cache
def status() -> CompiledStatus:
    """Whether this process runs the compiled modules (decided once, at the first import of codec)."""
    try:
        directory = build_dir()
    except OSError as exc:  # a source is missing: an installed copy without its .py files
        return CompiledStatus(False, Path(), f"sources unreadable: {exc}")
    if os.environ.get(ENV, "").strip() == "0":
        return CompiledStatus(False, directory, f"{ENV}=0")
    shared = sorted(directory.glob(SHARED_LIB_GLOB))
    if not shared:
        return CompiledStatus(False, directory, "not built for these sources: python -m stream.tools.compile")
    # The modules' shims import this library by its top-level name: loaded here, it needs no sys.path entry.
    path = shared[0]
    name = path.name.split(".", 1)[0]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            return CompiledStatus(False, directory, f"cannot load {path}")
        try:
            library = importlib.util.module_from_spec(spec)
            sys.modules[name] = library
            spec.loader.exec_module(library)
        except ImportError as exc:  # built by another interpreter build, say: the sources still work
            sys.modules.pop(name, None)
            return CompiledStatus(False, directory, f"cannot load {path}: {exc}")
    return CompiledStatus(True, directory, "")


def package_path(package: str, path: list[str]) -> list[str]:
    """A package's `__path__`, with the build's modules first when the compiled hot path is in use."""
    current = status()
    if not current.active:
        return path
    return [str(current.directory / package), *path]
