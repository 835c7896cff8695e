"""Drive a runner subprocess: send its spec, read its JSON events, tell it to stop."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from bench.runner import RunSpec
from rollout_stream.errors import RuntimeFailure

__all__ = ["RunnerProcess", "RunnerFailed"]


class RunnerFailed(RuntimeFailure, RuntimeError):
    """The process under test died or did not report in time; the message ends with its stderr."""


class RunnerProcess:
    """`python -m bench.runner` with `spec`; its stdout events arrive on a queue."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.runner"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(spec.to_json() + "\n")
        self.proc.stdin.flush()
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.last_status: dict[str, Any] = {}
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put(None)

    def wait_for(
        self, kind: str, timeout: float, *, first_record_within: float | None = None
    ) -> dict[str, Any]:
        """The next event of `kind` (status lines on the way are kept in `last_status`). With
        `first_record_within`, give up early on a process that has read nothing after that many seconds."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise RunnerFailed(
                    f"{self.spec.mode} ({self.spec.delivery}) gave no {kind!r} within {timeout:.0f}s; "
                    f"last status {self.last_status}"
                    + (f"; input end offsets {self.spec.end_offsets}" if kind == "drained" else "")
                    + self._tail()
                )
            try:
                event = self.events.get(timeout=left)
            except queue.Empty:
                continue
            if event is None:
                raise RunnerFailed(
                    f"{self.spec.mode} exited ({self.proc.wait()}) before {kind!r}{self._tail()}"
                )
            if event["event"] == "status":
                self.last_status = event
                if first_record_within is not None and event["records_in"] == 0 \
                        and event["t"] >= first_record_within:
                    self.kill()
                    raise RunnerFailed(
                        f"{self.spec.mode} ({self.spec.delivery}) read nothing in {event['t']:.0f}s "
                        f"(kafka-python 3.0 can lose a group join: dpkp/kafka-python#2667){self._tail()}"
                    )
            if event["event"] == kind:
                return event

    def wait_until(self, predicate: Any, timeout: float, what: str) -> dict[str, Any]:
        """The first status line for which `predicate(status)` holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.wait_for("status", timeout=max(0.1, deadline - time.monotonic()))
            if predicate(status):
                return status
        self.kill()
        raise RunnerFailed(f"{self.spec.mode}: timed out waiting for {what}{self._tail()}")

    def stop(self, timeout: float = 60.0) -> dict[str, Any]:
        """Ask the process to stop and return its `result`."""
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
        result = self.wait_for("result", timeout)
        self.proc.wait(timeout=timeout)
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def _tail(self) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace").strip().splitlines()
        return ("; stderr: " + " | ".join(text[-8:])) if text else ""
