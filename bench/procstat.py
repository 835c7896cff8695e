"""Resident memory and CPU time of this process from /proc (Linux), without psutil."""

from __future__ import annotations

import os
import resource
import threading

__all__ = ["rss_bytes", "peak_rss_bytes", "reset_peak_rss", "cpu_seconds", "thread_cpu_seconds"]


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


def thread_cpu_seconds() -> dict[str, float]:
    """CPU time of each thread of this process, summed by name: a Python thread by its name (the loop is
    `MainThread`), any other by the kernel's (librdkafka's `rdk:main`, `rdk:broker1`, ...), so the clients'
    own threads are seen beside the loop."""
    tick = os.sysconf("SC_CLK_TCK")
    python = {thread.native_id: thread.name for thread in threading.enumerate()}
    out: dict[str, float] = {}
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            fields = rest.split()
        except OSError:
            continue  # ended meanwhile
        if len(fields) < 13:
            continue
        name = python.get(int(task)) or head.partition("(")[2] or f"task-{task}"
        # After the command name: state is field 3, utime 14 and stime 15 (1-based, see proc(5)).
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out
