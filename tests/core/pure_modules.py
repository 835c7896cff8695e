"""The compiled hot path's modules as their Python sources, beside the compiled ones in the same process.

Tests compare the two on the same records, and monkeypatch the Python ones where a test replaces a
module's function: a compiled module calls its own functions directly, so a patch does not reach them.
Where nothing is compiled, the two are the same source imported twice.
"""

from __future__ import annotations

import importlib
import sys
from functools import cache
from types import ModuleType

from codec.compiled import COMPILED_MODULES, SOURCE_ROOT

__all__ = ["pure_modules", "pure"]


@cache
def pure_modules() -> dict[str, ModuleType]:
    """Each module of `COMPILED_MODULES`, imported from its .py file; sys.modules is left as it was."""
    for name in COMPILED_MODULES:  # the process's own first, so that all of them are restored below
        importlib.import_module(name)
    packages = {name: sys.modules[name] for name in ("codec", "core")}
    paths = {name: list(package.__path__) for name, package in packages.items()}
    modules = {name: sys.modules.pop(name) for name in COMPILED_MODULES}
    try:
        for name, package in packages.items():
            package.__path__[:] = [str(SOURCE_ROOT / name)]
        loaded = {name: importlib.import_module(name) for name in COMPILED_MODULES}
    finally:
        for name, module in modules.items():
            sys.modules[name] = module
            package_name, leaf = name.split(".")
            setattr(packages[package_name], leaf, module)
        for name, package in packages.items():
            package.__path__[:] = paths[name]
    assert all(m.__file__ and m.__file__.endswith(".py") for m in loaded.values())
    return loaded


def pure(name: str) -> ModuleType:
    return pure_modules()[name]
