"""The stage for the examples, as a deployment runs it: `rollout-stream topics create` on fresh topics, then
`rollout-stream run` in a process of its own, stopped with SIGTERM at the end.

The broker is yours: `--bootstrap-servers`, else $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092, where
`rollout-stream broker start` puts a local one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass

from rollout_stream import Connection

__all__ = ["LocalStage", "Topics", "default_bootstrap"]

# The `rollout-stream` command of this interpreter's environment.
ROLLOUT_STREAM = [sys.executable, "-m", "rollout_stream.cli"]


def default_bootstrap() -> str:
    """$KAFKA_BOOTSTRAP_SERVERS, else where `rollout-stream broker start` listens."""
    return os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or "127.0.0.1:9092"


@dataclass(frozen=True)
class Topics:
    input: str
    output: str
    dead_letter: str


@dataclass
class LocalStage:
    bootstrap: str
    conn: Connection
    topics: Topics
    tag: str  # in every topic and group name of the run, so runs on one broker never meet
    worker: subprocess.Popen[bytes]

    @classmethod
    def start(cls, bootstrap_servers: str | None, prefix: str, *, commit_interval_s: float = 0.1,
              announce: bool = True) -> LocalStage:
        """Topics `<prefix>-<tag>-rollouts`, `-train-data` and `-dlq` (2 partitions) and a worker between
        them; `bootstrap_servers` None: `default_bootstrap()`."""
        bootstrap = bootstrap_servers or default_bootstrap()
        tag = uuid.uuid4().hex[:6]
        name = f"{prefix}-{tag}"
        topics = Topics(f"{name}-rollouts", f"{name}-train-data", f"{name}-dlq")
        where = ["--bootstrap-servers", bootstrap, "--input-topic", topics.input, "--output-topic",
                 topics.output, "--dead-letter-topic", topics.dead_letter]
        created = subprocess.run([*ROLLOUT_STREAM, "topics", "create", *where, "--partitions", "2"],
                                 capture_output=True, text=True)
        if created.returncode != 0:
            raise SystemExit(created.stderr.strip() or f"topics create: exit {created.returncode}")
        if announce:
            print(f"broker {bootstrap}; topics {topics.input} → {topics.output}", flush=True)
        worker = subprocess.Popen([*ROLLOUT_STREAM, "run", *where, "--group-id", name,
                                   "--group-timeout", "30", "--commit-interval", str(commit_interval_s),
                                   "--progress-interval", "3600", "--log-level", "error"])
        return cls(bootstrap, Connection(bootstrap), topics, tag, worker)

    def stop(self) -> None:
        """Stop the worker as a deployment does: SIGTERM, after which it commits what it has and exits 0. The
        run's topics stay on the broker."""
        if self.worker.poll() is None:
            self.worker.send_signal(signal.SIGTERM)
        try:
            code = self.worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.worker.kill()
            code = self.worker.wait()
        if code != 0:
            print(f"the worker exited with {code}", file=sys.stderr)
