"""Room on the disk for a local broker: refused at start when there is too little, named when it ran out.

A broker whose log directory fills up stops serving (Kafka marks the directory failed and shuts down), and
a JVM started on a full disk exits before it can write a log line: `broker start` then had nothing better
to say than "exited with code 1: no output". A development broker reused for days fills a disk unnoticed:
every test and benchmark topic stays until it is deleted (docs/broker.md).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rollout_stream.broker.errors import BrokerConfigError, DiskFull

__all__ = [
    "MIN_FREE_ENV", "DEFAULT_MIN_FREE_MIB", "Room", "disk_cause", "room_for", "require_room",
    "ran_out_of_space",
]

MIN_FREE_ENV = "ROLLOUT_STREAM_BROKER_MIN_FREE_MIB"
DEFAULT_MIN_FREE_MIB = 1024
"""A benchmark's 32K-token workload alone writes ~2 GB per drain; below 1 GiB a broker does not last long."""

_OUT_OF_SPACE = "No space left on device"
_DIR_FAILED = "log directory has failed"


@dataclass(frozen=True, slots=True)
class Room:
    """Free bytes on the filesystem that holds `data_dir`, against the minimum a broker needs."""

    data_dir: Path
    free: int
    minimum: int

    @property
    def enough(self) -> bool:
        return self.free >= self.minimum

    def describe(self) -> str:
        """One line for a refusal or a failure: what is free, what the data dir holds, what to do."""
        held_bytes = _held(self.data_dir)  # walked only here: a start with room never pays for it
        held = f"; {self.data_dir} itself holds {_size(held_bytes)} of topics and logs" if held_bytes else ""
        if self.enough:
            return f"{_size(self.free)} free on the filesystem of {self.data_dir} now{held}"
        drop = (f" (`rollout-stream broker stop --data-dir {self.data_dir}`, then remove it: every topic "
                "in it is dropped)") if held_bytes else ""
        return (f"only {_size(self.free)} free on the filesystem of {self.data_dir}, a local broker needs at "
                f"least {_size(self.minimum)}{held}: free some space{drop}, or use another --data-dir "
                f"({MIN_FREE_ENV} sets the minimum)")


def disk_cause(data_dir: Path, log_lines: list[str]) -> str | None:
    """Why a broker failed, if it was the disk: a log that says it ran out, or too little room now."""
    room = room_for(data_dir)
    if ran_out_of_space(log_lines):
        return f"its log directory failed: No space left on device; {room.describe()}"
    return None if room.enough else room.describe()


def _minimum_free_bytes() -> int:
    raw = os.environ.get(MIN_FREE_ENV, "").strip()
    if not raw:
        return DEFAULT_MIN_FREE_MIB << 20
    try:
        mib = int(raw)
    except ValueError:
        mib = -1
    if mib < 0:
        raise BrokerConfigError(f"{MIN_FREE_ENV}={raw!r} is not a number of MiB (0 turns the check off)")
    return mib << 20


def room_for(data_dir: Path) -> Room:
    """The room a broker in `data_dir` has (the data dir need not exist yet)."""
    minimum = _minimum_free_bytes()
    try:
        existing = data_dir
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = shutil.disk_usage(existing).free
    except OSError as exc:
        raise BrokerConfigError(f"cannot tell the free space for --data-dir {data_dir}: {exc}") from None
    return Room(data_dir, free, minimum)


def require_room(data_dir: Path) -> None:
    """Refuse a start that would fill the disk at once (DiskFull, exit 2)."""
    room = room_for(data_dir)
    if not room.enough:
        raise DiskFull(room.describe())


def ran_out_of_space(log_lines: list[str]) -> bool:
    """Whether a broker log says the broker stopped because its disk was full."""
    return any(_OUT_OF_SPACE in line for line in log_lines) and any(_DIR_FAILED in line for line in log_lines)


def _held(data_dir: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512  # allocated, not apparent
            except OSError:
                continue  # deleted meanwhile: Kafka removes segments as it goes
    return total


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"
