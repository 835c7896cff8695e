"""The admission log folded to its end for those who only look: `rollout-stream prompts`, and the fence a
trainer's reader starts from (docs/loop.md)."""

from __future__ import annotations

from rollout_stream.clients import Connection
from rollout_stream.core.prompt_keys import PromptFence, parse_attempt_key
from rollout_stream.core.prompts import PromptLog
from rollout_stream.kafka import TopicPartition, client_for
from rollout_stream.names import admission_topic
from rollout_stream.pacing import AdmissionFollower
from rollout_stream.pacing.checkpoints import newest_fold
from rollout_stream.topics import missing_topics

__all__ = ["fence_of", "fold_admission_log", "prompt_fence"]


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
    on `train_data_topic`), and those of each trainer group's batches the log lists uncommitted, which count
    as trained once the reader knows it resumes past them (its predecessor may have committed them just
    before it died, before its mark said so)."""
    _, fold = fold_admission_log(conn, train_data_topic, wait_s)
    return PromptFence() if fold is None else fence_of(fold)


def fence_of(fold: PromptLog) -> PromptFence:
    """`prompt_fence` of a fold: its trained prompts, and each trainer group's uncommitted batches'."""
    uncommitted = {trainer: {batch: [parsed.prompt_id for key, skipped in keys.items()
                                     if not skipped and (parsed := parse_attempt_key(key)) is not None]
                             for batch, keys in batches.items()}
                   for trainer, batches in fold.uncommitted.items()}
    return PromptFence({p for name in fold.sources for p in fold.trained(name)}, uncommitted)
