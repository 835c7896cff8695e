"""Which dead-letter records a command acts on: reason, group, failure-time window, limit."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from rollout_stream.codec import DeadLetterReason
from rollout_stream.errors import ConfigurationError
from rollout_stream.ops.dlq.record import DeadLetterRecord, parse_iso_ms
from rollout_stream.ops.dlq.values import DeadLetterValue

__all__ = ["SelectionError", "Selection", "parse_time", "parse_coordinates"]

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


class SelectionError(ConfigurationError, ValueError):
    """A filter a person must correct (bad time, unknown reason, bad coordinates)."""


def parse_time(text: str, now_ms: int) -> int:
    """`2024-05-01T12:00:00Z`, `2024-05-01` (UTC if no zone), or a duration ago: `15m`, `2h`, `7d`."""
    match = _RELATIVE.match(text)
    if match:
        return now_ms - int(float(match.group(1)) * _UNIT_S[match.group(2)] * 1000)
    parsed = parse_iso_ms(text.strip())
    if parsed is None:
        raise SelectionError(
            f"{text!r} is not a time: use ISO 8601 (2024-05-01T12:00:00Z, 2024-05-01) "
            "or a duration ago (15m, 2h, 7d)"
        )
    return parsed


def parse_coordinates(text: str) -> tuple[int, int]:
    """`PARTITION:OFFSET` → (partition, offset)."""
    part, sep, off = text.partition(":")
    if not sep or not part.strip().isdigit() or not off.strip().isdigit():
        raise SelectionError(f"{text!r} is not PARTITION:OFFSET (e.g. 0:1234)")
    return int(part), int(off)


def _is_pattern(text: str) -> bool:
    return any(c in text for c in "*?[")


@dataclass(frozen=True, slots=True)
class Selection:
    """Filters as given (texts kept for the replay cursor name) and resolved (times in ms)."""

    reasons: frozenset[str] = frozenset()
    groups: tuple[str, ...] = ()  # exact group keys, or glob patterns (`run-7/*`)
    since_ms: int | None = None
    until_ms: int | None = None
    since_text: str | None = None
    until_text: str | None = None
    limit: int | None = None
    _exact_groups: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_exact_groups", frozenset(g for g in self.groups if not _is_pattern(g)))

    @classmethod
    def build(
        cls,
        *,
        reasons: Sequence[str] = (),
        groups: Sequence[str] = (),
        since: str | None = None,
        until: str | None = None,
        limit: int | None = None,
        now_ms: int,
    ) -> Selection:
        known = {r.value for r in DeadLetterReason}
        unknown = sorted(set(reasons) - known)
        if unknown:
            raise SelectionError(
                f"unknown --reason {', '.join(unknown)}; reasons are {', '.join(sorted(known))}"
            )
        if limit is not None and limit < 0:
            raise SelectionError(f"--limit must be >= 0, got {limit}")
        since_ms = parse_time(since, now_ms) if since else None
        until_ms = parse_time(until, now_ms) if until else None
        if since_ms is not None and until_ms is not None and since_ms > until_ms:
            raise SelectionError(f"--since {since} is after --until {until}")
        return cls(
            frozenset(reasons), tuple(dict.fromkeys(groups)), since_ms, until_ms, since, until, limit or None
        )

    @property
    def groups_are_exact(self) -> bool:
        return bool(self.groups) and len(self._exact_groups) == len(self.groups)

    def matches(self, record: DeadLetterRecord) -> bool:
        if self.reasons and record.reason not in self.reasons:
            return False
        # When it was dead-lettered (its Kafka timestamp), not x-failed-at: a record that failed again
        # after a replay is recent, though its first failure is old.
        if self.since_ms is not None and record.timestamp_ms < self.since_ms:
            return False
        if self.until_ms is not None and record.timestamp_ms > self.until_ms:
            return False
        if self.groups:
            group = record.group
            if group is None:
                return False
            if group not in self._exact_groups and not any(
                fnmatch.fnmatchcase(group, g) for g in self.groups if _is_pattern(g)
            ):
                return False
        return True

    def matches_value(self, value: DeadLetterValue) -> bool:
        """A chunked value is selected whole when any of its chunk records is."""
        return any(self.matches(r) for r in value.records)

    def fingerprint(self, *parts: str | None) -> str:
        """A short stable hash of the filters as typed (`--since 2h` names the same cursor every run)."""
        doc = {
            "reasons": sorted(self.reasons),
            "groups": sorted(self.groups),
            "since": self.since_text,
            "until": self.until_text,
            "parts": list(parts),
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def describe(self) -> str:
        words = []
        if self.reasons:
            words.append("reason " + "|".join(sorted(self.reasons)))
        if self.groups:
            words.append("group " + "|".join(self.groups))
        if self.since_text:
            words.append(f"since {self.since_text}")
        if self.until_text:
            words.append(f"until {self.until_text}")
        return ", ".join(words) or "every record"
