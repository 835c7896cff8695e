"""Durable replay progress: a consumer group per selection whose committed offsets mark what was replayed.

The offsets are committed by the replaying transactional producer (`send_offsets_to_transaction`), so a
record's replay and the cursor moving past it are one atomic step (docs/dlq.md, "Idempotent replay").
The offset metadata says which replay run wrote it and whether that run finished.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rollout_stream.names import REPLAY_PREFIX, replay_cursor_group
from rollout_stream.ops.dlq.selection import Selection

__all__ = ["CURSOR_PREFIX", "CursorState", "cursor_name", "resume_state", "new_replay_id"]

CURSOR_PREFIX = REPLAY_PREFIX
_MAX_METADATA = 1024  # brokers refuse offset metadata above offset.metadata.max.bytes (4096 by default)


def cursor_name(selection: Selection, dead_letter_topic: str, to: str | None) -> str:
    """Consumer group id and transactional id of a replay selection: same filters as typed, same cursor.

    --limit, --rate, --max-replays and --dry-run are not part of it: `--limit 100` twice replays the
    next hundred, not the same hundred again.
    """
    return replay_cursor_group(selection.fingerprint(dead_letter_topic, to))



def new_replay_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class CursorState:
    """What a cursor's committed offsets say about the last replay run that moved them."""

    replay_id: str
    state: Literal["running", "done"]
    selection: str = ""

    def encode(self) -> str:
        doc = {"v": 1, "replay_id": self.replay_id, "state": self.state, "selection": self.selection[:300]}
        return json.dumps(doc, separators=(",", ":"))[:_MAX_METADATA]

    @classmethod
    def decode(cls, metadata: str | None) -> CursorState | None:
        try:
            doc = json.loads(metadata or "")
        except ValueError:
            return None
        if (
            not isinstance(doc, dict)
            or doc.get("state") not in ("running", "done")
            or not doc.get("replay_id")
        ):
            return None
        return cls(str(doc["replay_id"]), doc["state"], str(doc.get("selection", "")))


def resume_state(committed: Mapping[int, Any]) -> CursorState | None:
    """The state of a run that stopped half-way (crash, Ctrl-C, fenced), if any partition says so.

    A resumed run keeps that run's replay id: the worker windows replayed records by (group key, replay id),
    so a group whose first members were replayed before the interruption is completed by its last ones.
    """
    for om in committed.values():
        state = CursorState.decode(getattr(om, "metadata", None)) if om is not None else None
        if state is not None and state.state == "running":
            return state
    return None
