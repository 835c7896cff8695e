"""The long-running worker, in named parts (docs/architecture.md: how they fit together)."""

from stream.names import changelog_topic_name
from stream.worker.delivery import ProduceFailed
from stream.worker.loop import Worker
from stream.worker.routing import DeadLetterLimitExceeded
from stream.worker.stats import Snapshot, WorkerStats

__all__ = [
    "DeadLetterLimitExceeded",
    "ProduceFailed",
    "Snapshot",
    "Worker",
    "WorkerStats",
    "changelog_topic_name",
]
