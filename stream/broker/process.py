"""Processes and ports on this machine: is a pid alive (zombies count as dead), what is it, stop it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Literal

from rollout_stream.broker.errors import BrokerStopFailed

__all__ = [
    "StopOutcome",
    "arguments_after",
    "command_line",
    "exclusive",
    "free_port",
    "is_alive",
    "kill",
    "port_accepts",
    "port_is_free",
    "terminate",
]

StopOutcome = Literal["terminated", "killed", "not_running"]

_POLL_S = 0.05


@contextlib.contextmanager
def exclusive(lock_path: Path) -> Iterator[None]:
    """Hold an advisory lock on `lock_path` (created if missing) so one process at a time does the work."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def is_alive(pid: int) -> bool:
    """True while `pid` runs. Reaps it first if it is our exited child; a zombie counts as dead."""
    with contextlib.suppress(ChildProcessError, OSError):
        reaped, _status = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, belongs to someone else
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        # state is the field after the parenthesised command name, which may itself contain spaces
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def command_line(pid: int) -> str | None:
    """The command line of `pid` (arguments joined by spaces), or None if it is gone."""
    with contextlib.suppress(OSError):
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()
    try:  # no /proc (macOS)
        result = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None


def arguments_after(word: str) -> Iterator[tuple[int, str]]:
    """(pid, argument) of every live process whose command line has `word` followed by an argument.

    Reads /proc (Linux); elsewhere `ps`, whose command lines are joined by spaces, so an argument with a
    space in it comes back cut at the space.
    """
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().rstrip(b"\0").decode(errors="replace").split("\0")
                if word in argv[:-1]:
                    yield int(entry.name), argv[argv.index(word) + 1]
        return
    try:
        listing = subprocess.run(["ps", "-axo", "pid=,command="], capture_output=True, text=True, timeout=10,
                                 check=False).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return
    for line in listing.splitlines():
        pid, _, command = line.strip().partition(" ")
        args = command.split()
        if pid.isdigit() and word in args[:-1]:
            yield int(pid), args[args.index(word) + 1]


def _wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while is_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def terminate(pid: int, timeout: float) -> StopOutcome:
    """SIGTERM (the broker's shutdown hook flushes and closes the logs), then SIGKILL after `timeout` s."""
    if not is_alive(pid):
        return "not_running"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if _wait_dead(pid, timeout):
        return "terminated"
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if _wait_dead(pid, 10.0):
        return "killed"
    raise BrokerStopFailed(
        f"broker pid {pid} survived SIGKILL: check `ps -o stat,cmd -p {pid}` (stuck in I/O?)"
    )


def kill(pid: int) -> bool:
    """SIGKILL now, no clean shutdown (a crash, for tests and demos). False: it was not running."""
    if not is_alive(pid):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if _wait_dead(pid, 10.0):
        return True
    raise BrokerStopFailed(
        f"broker pid {pid} survived SIGKILL: check `ps -o stat,cmd -p {pid}` (stuck in I/O?)"
    )


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True if a server could listen on host:port now (a stopped broker's TIME_WAIT sockets don't count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the broker's own server socket does
        try:
            sock.bind((host, port))
            sock.listen(1)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A port the OS considers free right now (another process may still take it before we do), other than
    those in `avoid`: ports chosen but not bound yet, which the OS may hand out again."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


def port_accepts(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """True if something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False
