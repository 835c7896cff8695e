"""Which worker instance this process is: the id behind its transactional id.

Exactly-once needs the id to stay the same across a restart of one worker (the new process fences its dead
predecessor's open transaction) and to differ between workers alive at the same time (else each fences the
other: the older one died at its next commit with a bare ProducerFencedError). On one host this is decided
with a lock file per (cluster, group, instance id), held for the life of the process and released by the
kernel when it dies, even by kill -9:

* `--instance-id X`: the lock of X, or a refusal at start naming X and the process that holds it.
* no `--instance-id`: `<host>-0`, or `<host>-1` if that one is held, …: the lowest free slot. A worker that
  restarts while the others run gets its own slot back; host names keep hosts apart.

Two hosts given the same explicit id cannot see each other's locks; there Kafka fences the older producer and
the worker stops with a message naming the id (`fenced_as_taken_over`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rollout_stream.config import ConfigError
from rollout_stream.errors import RuntimeFailure
from rollout_stream.kafka import ProducerFenced
from rollout_stream.names import transactional_id

__all__ = ["InstanceClaim", "InstanceInUse", "InstanceTakenOver", "claim_instance", "fenced_as_taken_over",
           "lock_dir"]

MAX_SLOTS = 1024


class InstanceInUse(ConfigError):
    """Another live worker of the same group on this host already is this instance."""


class InstanceTakenOver(RuntimeFailure):
    """A worker elsewhere started with this instance id and fenced this one's transactions: this one stops."""


@contextmanager
def fenced_as_taken_over(group_id: str, instance_id: str | None) -> Iterator[None]:
    """A ProducerFenced raised inside becomes InstanceTakenOver, naming the id and its transactional id."""
    try:
        yield
    except ProducerFenced as exc:
        tid = transactional_id(group_id, instance_id or "")
        raise InstanceTakenOver(
            f"another worker took over instance id {instance_id!r} of group {group_id!r} (its transactional "
            f"id {tid!r}): two live workers must not share an id; give each its own --instance-id, or omit "
            "it on one host") from exc


def lock_dir() -> Path:
    """Shared by every user of the host: two users' workers of one group must not share an id either."""
    return Path(
        os.environ.get("ROLLOUT_STREAM_LOCK_DIR") or Path(tempfile.gettempdir()) / "rollout-stream-instances"
    )


@dataclass
class InstanceClaim:
    instance_id: str
    path: Path
    _fd: int | None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock; the file stays (removing it would race a new claim)
            self._fd = None

    def __enter__(self) -> InstanceClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _lock_path(bootstrap: str, group_id: str, instance_id: str) -> Path:
    cluster = ",".join(sorted(s.strip() for s in bootstrap.split(",") if s.strip()))
    scope = hashlib.sha256(f"{cluster}\0{group_id}".encode()).hexdigest()[:16]
    return lock_dir() / f"{scope}-{instance_id}.lock"


def _try_lock(path: Path) -> int | None:
    """The fd holding an exclusive lock on `path`, or None while another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.parent.chmod(0o1777)
    except OSError:
        pass  # created by another user: it already has these modes
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _holder(path: Path) -> str:
    try:
        pid = path.read_text().strip()
    except OSError:
        return "another process"
    return f"pid {pid}" if pid.isdigit() else "another process"


def claim_instance(bootstrap: str, group_id: str, requested: str | None) -> InstanceClaim:
    """Claim `requested`, or the lowest free `<host>-N`; raise InstanceInUse when `requested` is taken."""
    if requested:
        path = _lock_path(bootstrap, group_id, requested)
        fd = _try_lock(path)
        if fd is None:
            raise InstanceInUse(
                f"--instance-id {requested!r} is already used by a live worker of group {group_id!r} on this "
                f"host ({_holder(path)}): give each worker its own --instance-id "
                f"(ROLLOUT_STREAM_INSTANCE_ID), "
                f"or omit it to get a free one"
            )
        return InstanceClaim(requested, path, fd)
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname()) or "worker"
    for slot in range(MAX_SLOTS):
        instance = f"{host}-{slot}"
        path = _lock_path(bootstrap, group_id, instance)
        fd = _try_lock(path)
        if fd is not None:
            return InstanceClaim(instance, path, fd)
    raise InstanceInUse(f"{MAX_SLOTS} workers of group {group_id!r} already run on this host")
