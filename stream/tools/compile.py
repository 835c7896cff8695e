"""Build the compiled hot path (codec/compiled.py) with mypyc: once per source, into the user cache.

    python -m stream.tools.compile            # build unless a build for these sources exists
    python -m stream.tools.compile --status   # say which path this checkout runs, and why

`make compiled` runs it, and so `make test` and `make demo`. Without a C compiler or mypyc it says so and
exits 0: the stage then runs its pure-Python modules, which are always there. A failed build exits 1 and
leaves nothing behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from codec import compiled

# Run in a child interpreter: setuptools' build keeps global state, and mypy resolves `core` and `codec`
# from the working directory (the checkout).
_SETUP = """
import sys
from mypyc.build import mypycify
from setuptools import Extension, setup
out, tmp, native, *paths = sys.argv[1:]
del sys.argv[1:]
# no fused multiply-add: core/_float32_statistics.c must round where the Python it mirrors rounds
extensions = [Extension(name, [source], extra_compile_args=["-O3", "-ffp-contract=off"])
              for name, source in (pair.split("=") for pair in native.split(",") if pair)]
setup(name="rollout-stream-compiled",
      ext_modules=mypycify(paths, opt_level="3", target_dir=tmp + "/c") + extensions,
      script_args=["build_ext", "--build-lib", out, "--build-temp", tmp + "/o"])
"""


def _missing_tool() -> str | None:
    compiler = os.environ.get("CC", "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler!r} is not on PATH)"
    try:
        import mypyc  # noqa: F401
    except ImportError:
        return "mypyc is not installed (it comes with mypy: pip install -e '.[test]')"
    return None


def build(*, quiet: bool = False) -> int:
    target = compiled.build_dir()
    if any(target.glob(compiled.SHARED_LIB_GLOB)):
        print(f"compiled hot path: up to date ({target})")
        return 0
    missing = _missing_tool()
    if missing is not None:
        print(f"compiled hot path: not built, {missing}; the stage runs its pure-Python modules")
        return 0
    root = compiled.SOURCE_ROOT
    paths = [str(compiled.source_path(m).relative_to(root)) for m in compiled.COMPILED_MODULES]
    native = ",".join(f"{name}={source}" for name, source in compiled.NATIVE_MODULES)
    print(f"compiled hot path: building {', '.join(compiled.COMPILED_MODULES)} with mypyc, and "
          f"{', '.join(name for name, _ in compiled.NATIVE_MODULES)} "
          "(2–3 minutes, once per source change)", flush=True)
    started = time.monotonic()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".build-", dir=target.parent) as tmp:
        out = Path(tmp) / "out"
        done = subprocess.run(
            [sys.executable, "-c", _SETUP, str(out), tmp, native, *paths],
            cwd=compiled.SOURCE_ROOT, capture_output=quiet, text=True,
        )
        if done.returncode != 0:
            if quiet:
                sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
            print(f"compiled hot path: the mypyc build failed (exit {done.returncode}); the stage runs its "
                  "pure-Python modules", file=sys.stderr)
            return 1
        try:
            out.rename(target)  # whole or not at all: a build is only looked for under its final name
        except OSError:
            if not any(target.glob(compiled.SHARED_LIB_GLOB)):
                raise
            print(f"compiled hot path: another build finished first ({target})")  # same sources, same build
            return 0
    print(f"compiled hot path: built in {time.monotonic() - started:.0f} s into {target}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.tools.compile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--status", action="store_true", help="say which path runs, and why; build nothing")
    parser.add_argument("--quiet", action="store_true", help="show the compiler's output only if it fails")
    args = parser.parse_args(argv)
    if args.status:
        print(f"hot path: {compiled.status().describe()}")
        return 0
    return build(quiet=args.quiet)


if __name__ == "__main__":
    raise SystemExit(main())
