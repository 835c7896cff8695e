"""The admission fold's indexes over its outstanding groups (rollout_stream.core.admission).

Derived from the fold's state, never state (rebuilt when a checkpoint is loaded): they let a record touch
only the groups it changes or whose time has come, and let the rule count a trainer's line without walking
it, so the cost of a record does not grow with the backlog. Groups that a record affects together are acted
on in the order of the fold's `groups` (`in_order`), as a walk over it would: a fold built on top hears them
in the same order in every party.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from rollout_stream.core.admission import _Group

K = TypeVar("K")

__all__ = ["GroupIndex", "Versions"]


class Versions:
    """Groups counted by weight version, in version order: how many are at or above a floor, the lowest
    there, the highest. The count for the floor last asked is kept, so a floor that moves up a version at a
    time costs a version, not a walk."""

    __slots__ = ("_below", "_floor", "_n", "_ws", "total")

    def __init__(self) -> None:
        self._ws: list[int] = []  # the versions with groups, ascending
        self._n: dict[int, int] = {}
        self.total = 0
        self._floor: int | None = None
        self._below = 0  # groups below `_floor`

    def add(self, w: int, n: int) -> None:
        count = self._n.get(w, 0) + n
        if count and w not in self._n:
            insort(self._ws, w)
        elif not count:
            del self._ws[bisect_left(self._ws, w)]
        if count:
            self._n[w] = count
        else:
            del self._n[w]
        self.total += n
        if self._floor is not None and w < self._floor:
            self._below += n

    def count_from(self, floor: int | None) -> int:
        """Groups at version `floor` or above (None: all)."""
        if floor is None:
            return self.total
        if self._floor is None:
            self._floor, self._below = floor, self._between(-(2**63), floor)
        elif floor != self._floor:
            moved = self._between(min(floor, self._floor), max(floor, self._floor))
            self._below += moved if floor > self._floor else -moved
            self._floor = floor
        return self.total - self._below

    def _between(self, low: int, high: int) -> int:
        return sum(self._n[w] for w in self._ws[bisect_left(self._ws, low):bisect_left(self._ws, high)])

    def lowest_from(self, floor: int | None) -> int | None:
        i = 0 if floor is None else bisect_left(self._ws, floor)
        return self._ws[i] if i < len(self._ws) else None

    def highest(self) -> int | None:
        return self._ws[-1] if self._ws else None


class GroupIndex:
    """The fold's outstanding groups by session, by due time, and per trainer by version and bound.

    `count(request, group, +1)` once a group is in `groups` (and its fields set), `-1` before it leaves or a
    field it is counted by changes; `schedule` when a time it is due at is set."""

    def __init__(self) -> None:
        self._seq: dict[int, int] = {}  # request -> its place in `groups`
        self._next_seq = 0
        self._due: list[tuple[int, int]] = []  # heap of (log ms, request): a sent expiry or a forget time
        self.undelivered: dict[tuple[str, str], dict[int, None]] = {}  # (producer, session) -> requests
        self.unrevoked: dict[tuple[str, str], dict[int, None]] = {}  # the same, not revoked yet
        self.outstanding: dict[str, int] = {}  # trainer -> groups
        self.weights: dict[str, Versions] = {}  # trainer -> its groups not revoked
        self.bounds: dict[str, dict[tuple[int, int], Versions]] = {}  # ... with (vpb, max_policy_lag)

    def place(self, request: int) -> None:
        """`request` joins `groups` at its end (one already there keeps its place)."""
        if request not in self._seq:
            self._seq[request] = self._next_seq
            self._next_seq += 1

    def leave(self, request: int) -> None:
        del self._seq[request]

    def in_order(self, requests: set[int] | dict[int, None]) -> list[int]:
        return sorted(requests, key=self._seq.__getitem__)

    def schedule(self, at_ms: int, request: int) -> None:
        """`request` is due at `at_ms` (a stale entry comes due too: whoever pops it checks it)."""
        heapq.heappush(self._due, (at_ms, request))

    def due(self, now_ms: int) -> list[int]:
        """The requests whose time has come, once each."""
        out = []
        while self._due and self._due[0][0] <= now_ms:
            out.append(heapq.heappop(self._due)[1])
        return out

    def count(self, request: int, group: _Group, n: int) -> None:
        self.outstanding[group.trainer] = self.outstanding.get(group.trainer, 0) + n
        if not self.outstanding[group.trainer]:
            del self.outstanding[group.trainer]
        where = (group.producer, group.session)
        if not group.delivered:
            _mark(self.undelivered, where, request, n)
        if group.revoked_ms is None:
            if not group.delivered:
                _mark(self.unrevoked, where, request, n)
            _add(self.weights, group.trainer, group.weight_version, n)
            if group.max_policy_lag is not None:
                bounds = self.bounds.setdefault(group.trainer, {})
                _add(bounds, (group.versions_per_batch, group.max_policy_lag), group.weight_version, n)
                if not bounds:
                    del self.bounds[group.trainer]


def _add(counts: dict[K, Versions], key: K, w: int, n: int) -> None:
    versions = counts.get(key)
    if versions is None:
        versions = counts[key] = Versions()
    versions.add(w, n)
    if not versions.total:
        del counts[key]


def _mark(index: dict[tuple[str, str], dict[int, None]], where: tuple[str, str], request: int,
          n: int) -> None:
    if n > 0:
        index.setdefault(where, {})[request] = None
        return
    requests = index[where]
    del requests[request]
    if not requests:
        del index[where]
