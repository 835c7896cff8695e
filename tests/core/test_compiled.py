"""The compiled hot path (codec/compiled.py): used only for the sources it was built from, and deciding what
the Python sources decide, record by record.

Where nothing is built, the comparisons compare the Python sources with themselves; under CI (where
`make test` builds it first) the build must be in use, or this suite would not have tested it.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec import compiled, encode_sample
from core import RewardConfig
from core.validate import SampleLimits
from core.windows import WindowConfig, WindowStore
from tests.core.pure_modules import pure, pure_modules
from tests.core.test_fast_paths import _limits, _run, samples, streams

IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def test_ci_runs_the_compiled_modules() -> None:
    state = compiled.status()
    if os.environ.get(compiled.ENV, "").strip() == "0":  # make test's pass over the Python sources
        assert not state.active and all(m.__file__ and m.__file__.endswith(".py")
                                        for m in map(importlib.import_module, compiled.COMPILED_MODULES))
        return
    if not IN_CI and not state.active:
        pytest.skip(f"not in CI, and this checkout runs {state.describe()}")
    assert state.active, f"make test builds the compiled hot path first, but this run has {state.describe()}"
    import codec.head
    import core.windows
    for module in (codec.head, core.windows):
        assert module.__file__ is not None and Path(module.__file__).is_relative_to(state.directory)


def test_the_python_sources_are_what_the_comparisons_compare_with() -> None:
    for name, module in pure_modules().items():
        assert module.__file__ == str(compiled.source_path(name))
    assert pure("core.windows").WindowStore is not WindowStore or not compiled.status().active


def test_every_msgspec_struct_keeps_its_options_when_compiled() -> None:
    """mypyc drops the keyword arguments of a `class` statement: a struct compiled with
    `frozen=True, gc=False` came out mutable and tracked by the garbage collector. The hot path's structs
    live in `core/structs.py`; a struct made by `msgspec.defstruct` (a call) keeps them."""
    for name, module in pure_modules().items():
        running = importlib.import_module(name)
        for attr, source in vars(module).items():
            if isinstance(source, type) and issubclass(source, msgspec.Struct) and source.__module__ == name:
                assert _options(getattr(running, attr)) == _options(source), f"{name}.{attr}"
    from core.structs import ClosedGroup, HeldSample, InputRecord, Member

    for struct in (InputRecord, Member, HeldSample, ClosedGroup):
        assert (struct.__struct_config__.frozen, struct.__struct_config__.gc) == (True, False), struct


def _options(struct: type[msgspec.Struct]) -> dict[str, object]:
    config = struct.__struct_config__
    return {k: getattr(config, k) for k in dir(config) if not k.startswith("_")}


@settings(max_examples=300, deadline=None)
@given(streams(), st.sampled_from(["grpo", "reinforce_plus_plus_baseline"]), st.sampled_from([None, 2]),
       st.sampled_from([1 << 30, 300]), st.booleans())
def test_compiled_and_python_window_stores_decide_the_same(records, estimator, default_size, max_bytes,
                                                            headers):
    config = WindowConfig(reward=RewardConfig(advantage_estimator=estimator), group_timeout_ms=1_000,
                          limits=SampleLimits(default_group_size=default_size), max_group_bytes=max_bytes)
    reference = pure("core.windows").WindowStore(config)
    store = WindowStore(config)
    assert _run(store, records, headers, take=True) == _run(reference, records, headers, take=True)
    assert repr(store.closed) == repr(reference.closed) and store.open_bytes == reference.open_bytes
    assert repr(store.drain_changes()) == repr(reference.drain_changes())


def _fields(head: object) -> bytes | None:
    """A head's values as bytes (equal for equal values, NaN rewards and Ext payloads included)."""
    if head is None:
        return None
    return msgspec.msgpack.encode(msgspec.structs.asdict(head))  # type: ignore[call-overload]


@settings(max_examples=1000, deadline=None)
@given(samples(), st.sampled_from([None, "", "acc"]), _limits)
def test_compiled_and_python_heads_and_checks_agree(drawn, reward_key, limits):
    from codec.head import decode_head, item_count
    from core.validate import plainly_valid

    sample, key = drawn
    value = encode_sample(sample)
    head, reference = decode_head(value), pure("codec.head").decode_head(value)
    assert _fields(head) == _fields(reference)
    if head is not None:
        checked = plainly_valid(head, key, reward_key, limits, item_count)
        assert checked == pure("core.validate").plainly_valid(reference, key, reward_key, limits,
                                                              pure("codec.head").item_count)


def test_a_build_is_only_used_for_the_sources_it_was_built_from(monkeypatch, tmp_path) -> None:
    built_for = compiled.build_key()
    copy = tmp_path / "windows.py"
    copy.write_bytes(compiled.source_path("core.windows").read_bytes())
    real = compiled.source_path
    monkeypatch.setattr(compiled, "source_path", lambda m: copy if m == "core.windows" else real(m))
    assert compiled.build_key() == built_for  # the same bytes elsewhere: the same build
    copy.write_bytes(copy.read_bytes() + b"\n# changed\n")
    assert compiled.build_key() != built_for
    assert compiled.build_dir().name == compiled.build_key()


def _tool(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stream.tools.compile", *args], capture_output=True,
                          text=True, env={**os.environ, **env}, cwd=compiled.SOURCE_ROOT, timeout=600)


def test_the_switch_and_an_empty_cache_mean_the_python_sources(tmp_path) -> None:
    off = _tool(["--status"], ROLLOUT_STREAM_COMPILED="0")
    assert off.returncode == 0 and off.stdout.strip() == "hot path: pure Python (ROLLOUT_STREAM_COMPILED=0)"
    empty = _tool(["--status"], ROLLOUT_STREAM_CACHE=str(tmp_path), ROLLOUT_STREAM_COMPILED="")
    assert empty.stdout.strip() == ("hot path: pure Python (not built for these sources: "
                                    "python -m stream.tools.compile)")


def test_without_a_compiler_the_build_says_so_and_leaves_the_python_sources(tmp_path) -> None:
    done = _tool([], ROLLOUT_STREAM_CACHE=str(tmp_path), CC=str(tmp_path / "no-such-cc"),
                 ROLLOUT_STREAM_COMPILED="")
    assert done.returncode == 0, done.stderr
    assert "not built, no C compiler" in done.stdout and "pure-Python modules" in done.stdout
    assert not (tmp_path / "compiled").exists() or not any((tmp_path / "compiled").iterdir())


@pytest.mark.long  # a whole build (minutes); `make compiled` does the same before every `make test`
def test_a_fresh_cache_gets_a_build_that_the_next_process_runs(tmp_path) -> None:
    """What `make compiled` does on a fresh machine: this machine's cache already has one."""
    built = _tool(["--quiet"], ROLLOUT_STREAM_CACHE=str(tmp_path), ROLLOUT_STREAM_COMPILED="")
    assert built.returncode == 0, built.stdout + built.stderr
    assert "compiled hot path: built in" in built.stdout
    again = _tool([], ROLLOUT_STREAM_CACHE=str(tmp_path), ROLLOUT_STREAM_COMPILED="")
    assert again.stdout.startswith("compiled hot path: up to date")
    ran = subprocess.run(
        [sys.executable, "-c", "import core.windows, codec.compiled as c; "
                               "print(c.status().describe(), core.windows.__file__)"],
        capture_output=True, text=True, cwd=compiled.SOURCE_ROOT, timeout=60,
        env={**os.environ, "ROLLOUT_STREAM_CACHE": str(tmp_path), "ROLLOUT_STREAM_COMPILED": ""})
    assert ran.returncode == 0, ran.stderr
    state, module_file = ran.stdout.split()[:-1], ran.stdout.split()[-1]
    assert " ".join(state) == "compiled (mypyc)" and Path(module_file).is_relative_to(tmp_path)
