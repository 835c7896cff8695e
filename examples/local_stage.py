"""The stage on fresh topics of a development broker, for the examples: the worker runs in a thread of the
example's process, and the topics are deleted when it stops."""

from __future__ import annotations

import sys
import threading
import uuid
from dataclasses import dataclass

from rollout_stream.clients import Connection
from rollout_stream.commands.options import resolve_bootstrap
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.kafka import client_for
from rollout_stream.topics import TopicSettings, ensure_topics
from rollout_stream.worker import Worker

__all__ = ["LocalStage"]


@dataclass
class LocalStage:
    bootstrap: str
    conn: Connection
    topics: TopicNames
    worker: Worker
    tag: str  # in every topic and group name of the run, so runs on one broker never meet
    thread: threading.Thread

    @classmethod
    def start(cls, bootstrap_servers: str | None, prefix: str, *, commit_interval_s: float = 0.1,
              announce: bool = True) -> LocalStage:
        """Topics `<prefix>-<tag>-rollouts`, `-train-data` and `-dlq` (2 partitions) and a worker between
        them; `bootstrap_servers` None is the local development broker, started if needed."""
        bootstrap = resolve_bootstrap(bootstrap_servers)
        conn = Connection(bootstrap)
        tag = uuid.uuid4().hex[:6]
        name = f"{prefix}-{tag}"
        topics = TopicNames(f"{name}-rollouts", f"{name}-train-data", f"{name}-dlq")
        ensure_topics(conn, data_topics=[topics.input, topics.output],
                      dead_letter_topics=[topics.dead_letter], settings=TopicSettings(partitions=2))
        if announce:
            print(f"broker {bootstrap}; topics {topics.input} → {topics.output}", flush=True)
        worker = Worker(WorkerConfig(bootstrap_servers=bootstrap, topics=topics, group_id=name,
                                     group_timeout_s=30.0, commit_interval_s=commit_interval_s,
                                     progress_interval_s=3600), conn)
        thread = threading.Thread(target=worker.run, name="worker", daemon=True)
        thread.start()
        return cls(bootstrap, conn, topics, worker, tag, thread)

    def stop(self) -> None:
        """Stop the worker, then delete the run's topics."""
        self.worker.request_stop()
        self.thread.join(timeout=60)
        admin = client_for(self.conn).admin()
        try:
            admin.delete_topics([self.topics.input, self.topics.output, self.topics.dead_letter])
        except Exception as exc:  # leftover topics on a development broker are harmless
            print(f"could not delete the run's topics: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            admin.close()
