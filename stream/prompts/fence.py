"""The admission log folded to its end for those who only look: `rollout-stream prompts`, and the fence a
trainer's reader starts from (docs/loop.md)."""

from __future__ import annotations

from rollout_stream.clients import Connection
from rollout_stream.core.prompt_keys import PromptFence
from rollout_stream.core.prompts import PromptLog
from rollout_stream.kafka import TopicPartition, client_for
from rollout_stream.names import admission_topic
from rollout_stream.pacing import AdmissionFollower
from rollout_stream.pacing.checkpoints import newest_fold
from rollout_stream.topics import missing_topics

__all__ = ["fold_admission_log", "prompt_fence"]


def fold_admission_log(conn: Connection, output_topic: str,
                       wait_s: float = 30.0) -> tuple[str, PromptLog | None]:
    """The admission log of `output_topic` folded to its end (None: there is no log)."""
    topic = admission_topic(output_topic)
    if missing_topics(conn, [topic]):
        return topic, None
    client = client_for(conn)
    consumer = client.assigned_consumer(client_id=conn.client_id, max_record_bytes=1 << 20)
    tp = TopicPartition(topic, 0)
    try:
        end = consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()
    follower = AdmissionFollower(conn, topic, client, fold=newest_fold(client, topic))
    try:
        if end > 0 and not follower.wait_folded(end - 1, wait_s):
            raise TimeoutError(f"{topic} was not folded to its end within {wait_s:g}s")
        fold = follower.fold
    finally:
        follower.close()
    assert isinstance(fold, PromptLog)
    return topic, fold


def prompt_fence(conn: Connection, train_data_topic: str, wait_s: float = 30.0) -> PromptFence:
    """The fence a resuming trainer's reader starts from: every prompt the log says trained (of every source
    on `train_data_topic`). Build it after the previous reader's last commit was marked (it marks within a
    second of its commit)."""
    _, fold = fold_admission_log(conn, train_data_topic, wait_s)
    if fold is None:
        return PromptFence()
    return PromptFence({p for name in fold.sources for p in fold.trained(name)})
