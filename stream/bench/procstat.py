"""Resident memory and CPU time of this process from /proc (Linux), without psutil."""

from __future__ import annotations

import os
import resource

__all__ = ["rss_bytes", "peak_rss_bytes", "reset_peak_rss", "cpu_seconds"]


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int:
    """Current resident set size."""
    kib = _status_kib("VmRSS")
    if kib is None:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return kib * 1024


def peak_rss_bytes() -> int:
    """Highest resident set size since start (or since `reset_peak_rss`)."""
    kib = _status_kib("VmHWM")
    return kib * 1024 if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0: write 5 to clear_refs); False where not allowed."""
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cpu_seconds() -> float:
    """User + system CPU time of every thread of this process."""
    t = os.times()
    return t.user + t.system
