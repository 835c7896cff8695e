"""The C extensions (codec/compiled.py, setup.py): in use wherever they are built and not switched off, off
with ``ROLLOUT_STREAM_COMPILED=0``, optional at install, and reported as they are.

Each is compared with the Python it shortcuts in its own file: tests/core/test_plain_scan.py,
tests/core/test_float32_statistics.py, tests/codec/test_wire.py. Under CI (where `make venv` builds them)
they must be in use, or those comparisons would not have tested them.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollout_stream.codec import compiled, wire
from rollout_stream.core import plain_scan, rewards

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _handles() -> dict[str, object]:
    """What each importer of a C extension runs: the extension's function, or None for its Python."""
    return {"rollout_stream.core._plain_scan": plain_scan.scanner(),
            "rollout_stream.core._float32_statistics": rewards._native_statistics,
            "rollout_stream.codec._train_values": wire._native_train_values}


def test_ci_runs_the_c_extensions_and_the_switch_turns_them_all_off() -> None:
    state = compiled.status()
    assert set(_handles()) == set(compiled.NATIVE_MODULES)
    if not compiled.enabled():  # make test's pass over the Python path
        assert state.describe() == f"pure Python ({compiled.ENV}=0)"
        assert all(handle is None for handle in _handles().values())
        return
    if not IN_CI and not state.active:
        pytest.skip(f"not in CI, and this checkout runs {state.describe()}")
    assert state.active, f"make venv builds the C extensions, but this run has {state.describe()}"
    assert state.describe() == "C extensions" and all(handle is not None for handle in _handles().values())


def test_the_status_says_what_the_importers_run() -> None:
    state = compiled.status()
    assert state.in_use == tuple(name for name, handle in _handles().items() if handle is not None)
    assert state.active == (len(state.in_use) == len(compiled.NATIVE_MODULES))


def test_the_status_names_what_is_not_built(monkeypatch) -> None:
    # import fails as for a missing module
    monkeypatch.setitem(sys.modules, "rollout_stream.codec._train_values", None)
    monkeypatch.setenv(compiled.ENV, "1")
    state = compiled.status.__wrapped__()
    assert not state.active and "rollout_stream.codec._train_values" not in state.in_use
    assert state.reason.startswith("not built: ") and "rollout_stream.codec._train_values" in state.reason
    assert state.describe().endswith(f"({state.reason})")


def _setup_kwargs(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import setuptools

    seen: dict[str, Any] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: seen.update(kwargs))
    runpy.run_path(str(ROOT / "setup.py"))
    return seen


def test_setup_builds_every_extension_optional_and_the_statistics_without_fused_multiply_add(
        monkeypatch) -> None:
    extensions = {e.name: e for e in _setup_kwargs(monkeypatch)["ext_modules"]}
    assert set(extensions) == set(compiled.NATIVE_MODULES)
    for name, extension in extensions.items():
        assert extension.optional, name  # an install without a C compiler still succeeds
        assert extension.sources == [name.removeprefix("rollout_stream.").replace(".", "/") + ".c"]
    # a fused multiply-add would round once where the Python it mirrors rounds twice
    assert "-ffp-contract=off" in extensions["rollout_stream.core._float32_statistics"].extra_compile_args


def test_without_a_c_compiler_the_build_succeeds_without_the_extensions(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "setup.py"), "-q", "build_ext", "--build-lib", str(tmp_path / "lib"),
         "--build-temp", str(tmp_path / "tmp")],
        capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "CC": str(tmp_path / "no-such-cc")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert not list(tmp_path.rglob("*.so"))
    for name in compiled.NATIVE_MODULES:
        assert f'building extension "{name}" failed' in done.stdout + done.stderr
