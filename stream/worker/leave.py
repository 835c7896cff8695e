"""Leaving the consumer group for good, when the worker stops and will not come back under its instance id.

A static member (`group.instance.id`, KIP-345) does not leave its group when it closes: a worker restarted
within the session timeout gets its partitions back without a rebalance. A worker stopped for good (a
scale-down) would hold its partitions for the whole session timeout instead, so with
`--leave-group-on-stop` it asks the group coordinator to remove it (RemoveMembersFromConsumerGroup), after its
shutdown commit and once its consumer is closed.
"""

from __future__ import annotations

import logging

from rollout_stream.clients import Connection
from rollout_stream.errors import RolloutStreamError
from rollout_stream.kafka import Client, ask_admin
from rollout_stream.logs import log_event

__all__ = ["leave_group"]

log = logging.getLogger("rollout_stream.worker")


def leave_group(client: Client, conn: Connection, group_id: str, instance_id: str) -> bool:
    """Remove this worker's static member from its group; whether the coordinator removed it. A failure is
    logged, not raised: the session timeout removes the member anyway, later."""
    try:
        admin = client.admin(client_id=conn.client_id)
        try:
            removed = ask_admin(admin, conn, lambda a: a.remove_static_member(group_id, instance_id))
        finally:
            admin.close()
    except RolloutStreamError as exc:
        log_event(log, "group.leave_failed", logging.WARNING, group_id=group_id, instance_id=instance_id,
                  error=str(exc), action="its partitions move after the session timeout instead")
        return False
    log_event(log, "group.left", group_id=group_id, instance_id=instance_id,
              removed=removed, note="" if removed else "no such member (already gone)")
    return bool(removed)

