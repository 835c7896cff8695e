"""A stage without `--write-heads` refuses to publish where group heads are in use.

Ranks of a trainer that reads with `TrainDataReader(fetch="own")` see only the groups the heads describe: a
stage restarted without `--write-heads` on a train-data topic whose heads topic holds heads would publish
groups those ranks never read. So the worker refuses to start then, with one line that says what to do: start
it with `--write-heads`, or delete the heads topic when no trainer reads that way (an empty heads topic, as
`topics create` makes it, is no reason to refuse). Readers check the same from their side
(rollout_stream.reader.coverage).
"""

from __future__ import annotations

from rollout_stream.config import WorkerConfig
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka import Client, TopicPartition
from rollout_stream.names import heads_topic

__all__ = ["HeadsInUse", "refuse_if_heads_in_use"]


class HeadsInUse(ConfigurationError, RuntimeError):
    """The stage would publish without heads to a train-data topic whose heads topic holds heads."""


def refuse_if_heads_in_use(client: Client, client_id: str, config: WorkerConfig) -> None:
    """Raise HeadsInUse when `config` writes no heads and the heads topic of a topic it publishes groups to
    (train-data, and the zero-variance route) holds records."""
    if config.write_heads:
        return
    route = [config.zero_variance.topic] if config.zero_variance.topic else []
    topics = {heads_topic(t): t for t in (config.topics.output, *route)}
    admin = client.admin(client_id=client_id)
    try:
        found = {info.name: info.partitions for info in admin.describe_topics(list(topics))}
    finally:
        admin.close()
    existing = {name: n for name, n in found.items() if n}
    if not existing:
        return
    consumer = client.assigned_consumer(client_id=client_id, max_record_bytes=1 << 20)
    try:
        for name, partitions in existing.items():
            tps = [TopicPartition(name, p) for p in range(partitions)]
            begin, end = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
            if any(end[tp] > begin[tp] for tp in tps):
                raise HeadsInUse(
                    f"{name} holds group heads: trainers may read {topics[name]} with "
                    "TrainDataReader(fetch='own'), which never reads a group published without its head; "
                    f"start the stage with --write-heads, or delete {name} if no trainer reads that way")
    finally:
        consumer.close()
