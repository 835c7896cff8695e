"""The worker's allocator settings apply on glibc and are harmless to repeat."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from rollout_stream.worker.allocator import reuse_freed_buffers


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_settings_apply_and_repeat() -> None:
    assert reuse_freed_buffers() is True
    assert reuse_freed_buffers() is True


def test_a_fresh_process_applies_them_before_anything_else() -> None:
    code = "from rollout_stream.worker.allocator import reuse_freed_buffers as r; print(r())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert out.strip() == str(expected)


_ROUNDS = """
import resource, sys
from rollout_stream.worker.allocator import reuse_freed_buffers
if sys.argv[1] == "settings":
    assert reuse_freed_buffers()
def batch():  # one poll of 1,500 32K-token samples' worth of buffers (320 MB), freed together
    return [bytearray(213_000) for _ in range(1_500)]
held = batch()
del held
before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
held = batch()
print(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_a_freed_batch_larger_than_glibcs_trim_is_reused_without_page_faults() -> None:
    def faults(mode: str) -> int:
        args = [sys.executable, "-c", _ROUNDS, mode]
        return int(subprocess.run(args, capture_output=True, text=True, check=True).stdout)

    pages = 1_500 * 213_000 // 4096
    # glibc's defaults give every page back and fault it in again; the settings keep the heap for reuse.
    assert faults("defaults") > pages // 2
    assert faults("settings") < pages // 20
