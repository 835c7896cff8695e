"""The package's C extensions; everything else about the package is in pyproject.toml.

Each is the shortcut of a step that runs for every consumed record, beside the Python it mirrors, which
stays the reference and the fallback (codec/compiled.py, docs/compiled.md). They are optional: where no C
compiler (or no Python headers) is found, the install still succeeds and the stage runs the Python.
`pip install -e .` (so `make venv`) builds them in place, next to their sources.
"""

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add, which would round once where the Python that
# core/_float32_statistics.c mirrors rounds twice; the statistics must come out bit for bit the same.
FLAGS = ["-O3", "-ffp-contract=off"]

EXTENSIONS = [
    # the one-pass decode and validity check of a plainly valid record (core/plain_scan.py)
    Extension("rollout_stream.core._plain_scan", ["core/_plain_scan.c"], extra_compile_args=FLAGS,
              optional=True),
    # the float32 group statistics of plain float rewards (core/rewards.py)
    Extension("rollout_stream.core._float32_statistics", ["core/_float32_statistics.c"],
              extra_compile_args=FLAGS, optional=True),
    # a group's train records from one template (codec/wire.py)
    Extension("rollout_stream.codec._train_values", ["codec/_train_values.c"], extra_compile_args=FLAGS,
              optional=True),
]

setup(ext_modules=EXTENSIONS)
