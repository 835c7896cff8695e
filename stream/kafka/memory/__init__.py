"""The seam in one process, for tests only: topics, consumer groups and transactions held in memory.

    cluster = MemoryCluster()
    cluster.create_topic("in", 2)
    client = cluster.client()            # a seam.Client: group_consumer, assigned_consumer, producer, admin

It mirrors the broker semantics the worker's exactly-once logic rests on, not a client's quirks:

* offsets count from 0 per partition; commit and abort each append a control marker that no consumer
  returns, so a partition's offsets have gaps, and fetch positions move past them;
* read_committed consumers read only below the last stable offset (LSO: the first offset of the earliest
  open transaction in the partition) and never see aborted records; read_uncommitted sees every record;
* `init_transactions()` bumps the id's epoch, aborts its open transaction and fences the older producer;
  group offsets sent to a transaction commit with it, and a group member's stale metadata is refused
  (KIP-447: a member that a rebalance left behind cannot commit);
* consumer groups rebalance eagerly, as kafka-python's assignors do: every member revokes all it holds
  (`on_revoked`, where its commits still count) before anyone is assigned, then each gets its full new
  assignment (`on_assigned`, range-style by join order). A member joins at its first `poll()`; callbacks
  run inside `poll()` on the caller's thread. A rebalance waits for every live member to poll: a test
  removes a member that stopped polling with `MemoryCluster.kick` (what the session timeout does).

Test hooks on `MemoryCluster`: `clock_ms`, `create_topic`, `records`, `committed`, `rebalance`, `kick`,
`fail_sends`, `fail_next_commit`.

Not modeled: retention and compaction (logs keep everything), transaction timeouts, static membership,
ACLs (everything is allowed). Nothing in `stream` imports this package (a test checks), so no command can
run on it.
"""

from rollout_stream.kafka.memory._admin import MemoryAdmin
from rollout_stream.kafka.memory._cluster import MemoryClient, MemoryCluster
from rollout_stream.kafka.memory._consumers import MemoryAssignedConsumer
from rollout_stream.kafka.memory._group_consumer import MemoryGroupConsumer
from rollout_stream.kafka.memory._groups import GroupMetadata, range_assignment
from rollout_stream.kafka.memory._log import MemoryRecord
from rollout_stream.kafka.memory._producer import MemoryProducer, murmur2

__all__ = [
    "GroupMetadata",
    "MemoryAdmin",
    "MemoryAssignedConsumer",
    "MemoryClient",
    "MemoryCluster",
    "MemoryGroupConsumer",
    "MemoryProducer",
    "MemoryRecord",
    "murmur2",
    "range_assignment",
]
