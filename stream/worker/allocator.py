"""glibc malloc settings for a process that allocates and frees record-sized buffers all the time.

By default glibc returns freed buffers above 128 KiB to the kernel (mmap/munmap, heap trimming), so every
new output or producer batch of a 32K-token sample faults its pages in again, which costs many times the
encoding itself (docs/benchmarks.md has the figures).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["reuse_freed_buffers", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

log = logging.getLogger("rollout_stream.allocator")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 1024 * 1024
"""Blocks up to this size come from the heap: samples, outputs and producer batches. Larger ones (fetch
responses of up to 16 MiB, huge samples) keep their own mappings, which go back to the kernel when freed: a
higher threshold kept more memory per byte of open windows (docs/benchmarks.md)."""
TRIM_THRESHOLD = 2**31 - 1
"""Free memory kept at the top of a heap before it is given back: in effect never, so the heap stays at the
size the worker has needed. A finite threshold is passed at once when a poll of 32K-token samples and its
outputs are freed together: the heap is trimmed, and the next batch faults every page in again, on the loop
thread (docs/benchmarks-archive.md). The cost is an RSS that does not shrink after a peak."""

_applied = False


def reuse_freed_buffers() -> bool:
    """Keep freed record buffers for reuse instead of unmapping them; False where malloc is not glibc's."""
    global _applied
    if _applied:
        return True
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    _applied = ok
    if not ok:
        log.debug("mallopt refused the allocator settings; keeping glibc's defaults")
    return ok
