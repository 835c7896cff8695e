"""Every name derived from another, defined once: the worker, the reader, the dead-letter tools, the topic
tools and the ACL lists build them here, so they cannot disagree."""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "REPLAY_PREFIX",
    "changelog_topic_name",
    "heads_topic",
    "progress_topic",
    "rank_group_id",
    "rank_group_prefix",
    "replay_cursor_group",
    "replay_ledger_topic",
    "replay_transactional_id",
    "transactional_id",
    "transactional_id_prefix",
]

REPLAY_PREFIX = "rollout-stream-replay-"


def changelog_topic_name(group_id: str, input_topic: str) -> str:
    """The compacted topic that holds a worker group's open windows for `input_topic`."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", group_id)
    return f"{safe}-{input_topic}-windows-changelog"[:249]


def admission_topic(train_data_topic: str) -> str:
    """The single-partition log where paced producers ask for room behind the trainers of one train-data
    topic, and the trainers say what they consumed (docs/pacing.md)."""
    return f"{train_data_topic}.admission"[:249]


def heads_topic(train_data_topic: str) -> str:
    """The topic of one small head record per group published to a train-data topic, same partition count
    and number as the group's train records (codec/group_heads.py, docs/reader.md)."""
    return f"{train_data_topic}.heads"[:249]


def progress_topic(train_data_topic: str) -> str:
    """The compacted topic where trainers, paced producers and workers of one train-data topic say where they
    are (docs/pacing.md)."""
    return f"{train_data_topic}.progress"[:249]


def transactional_id_prefix(group_id: str) -> str:
    """Every instance of a worker group uses `rollout-stream-<group>-<instance>` as its transactional id."""
    return f"rollout-stream-{group_id}-"


def transactional_id(group_id: str, instance_id: str) -> str:
    return f"{transactional_id_prefix(group_id)}{instance_id}"


def rank_group_prefix(group_id: str) -> str:
    """Every data-parallel rank of a trainer group commits to a group `<group>-rank<r>`."""
    return f"{group_id}-rank"


def rank_group_id(group_id: str, rank: int) -> str:
    return f"{rank_group_prefix(group_id)}{rank}"


def replay_cursor_group(fingerprint: str) -> str:
    """Consumer group (and cursor) of one dead-letter replay selection, by its fingerprint."""
    return REPLAY_PREFIX + fingerprint


def replay_transactional_id(dead_letter_topic: str) -> str:
    """One transactional id per dead-letter topic, whatever the selection: a replay fences any other replay of
    the same topic still running, so the ledger it reads after `init_transactions()` is complete."""
    return REPLAY_PREFIX + "txn-" + hashlib.sha256(dead_letter_topic.encode()).hexdigest()[:16]


def replay_ledger_topic(dead_letter_topic: str) -> str:
    """The compacted topic recording which dead-letter records a replay already published."""
    return dead_letter_topic + ".replays"
