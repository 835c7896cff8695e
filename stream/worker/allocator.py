"""glibc malloc settings for a process that allocates and frees record-sized buffers all the time.

By default glibc returns freed buffers above 128 KiB to the kernel (mmap/munmap, heap trimming), so every
new output or producer batch of a 32K-token sample faults its pages in again: measured ~120 µs to encode
one 213 KB train sample, against ~12 µs once freed buffers are reused (docs/benchmarks.md).
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
responses of up to 16 MiB, huge samples) keep their own mappings, which go back to the kernel when freed:
with 32 MiB here, peak RSS of 256-token windows was 1.44-1.48 x their bytes, with 1 MiB 1.25-1.27 x."""
TRIM_THRESHOLD = 2**31 - 1
"""Free memory kept at the top of a heap before it is given back: in effect never, so the heap stays at the
size the worker has needed. With 256 MiB, one poll of 500 32K-token samples (106 MB) and its outputs freed
more than that at once in some drains, the heap was trimmed, and the next batch faulted every page in again:
80 page faults and 100 µs of system time per sample on the loop thread, against 3-12 faults and 12-18 µs
with the trim out of the way (docs/benchmarks.md). The cost is an RSS that does not shrink after a peak."""

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
