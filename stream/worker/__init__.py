"""The long-running worker, in named parts (docs/architecture.md: how they fit together)."""

from rollout_stream.names import changelog_topic_name
from rollout_stream.worker.delivery import ProduceFailed
from rollout_stream.worker.loop import Worker
from rollout_stream.worker.routing import DeadLetterLimitExceeded
from rollout_stream.worker.stats import Snapshot, WorkerStats

__all__ = [
    "DeadLetterLimitExceeded",
    "ProduceFailed",
    "Snapshot",
    "Worker",
    "WorkerStats",
    "changelog_topic_name",
]
