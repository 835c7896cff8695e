"""The worker's allocator settings apply on glibc and are harmless to repeat."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from stream.worker.allocator import reuse_freed_buffers


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_settings_apply_and_repeat() -> None:
    assert reuse_freed_buffers() is True
    assert reuse_freed_buffers() is True


def test_a_fresh_process_applies_them_before_anything_else() -> None:
    code = "from stream.worker.allocator import reuse_freed_buffers as r; print(r())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert out.strip() == str(expected)
