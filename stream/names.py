"""Names the worker derives from its configuration, defined once: the worker, the topic tools and the ACL
lists build them here, so they cannot disagree."""

from __future__ import annotations

import re

__all__ = ["changelog_topic_name", "transactional_id", "transactional_id_prefix"]


def changelog_topic_name(group_id: str, input_topic: str) -> str:
    """The compacted topic that holds a worker group's open windows for `input_topic`."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", group_id)
    return f"{safe}-{input_topic}-windows-changelog"[:249]


def transactional_id_prefix(group_id: str) -> str:
    """Every instance of a worker group uses `rollout-stream-<group>-<instance>` as its transactional id."""
    return f"rollout-stream-{group_id}-"


def transactional_id(group_id: str, instance_id: str) -> str:
    return f"{transactional_id_prefix(group_id)}{instance_id}"
