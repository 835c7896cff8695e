"""A consumer group member on the memory cluster: joins, revokes, is assigned and loses, inside poll()."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rollout_stream.kafka.memory._consumers import ConsumerBase, FetchState, illegal
from rollout_stream.kafka.memory._groups import Group, GroupMetadata, Member
from rollout_stream.kafka.seam import Polled, RebalanceListener, TopicPartition

if TYPE_CHECKING:
    from rollout_stream.kafka.memory._cluster import MemoryCluster

__all__ = ["MemoryGroupConsumer"]

_Step = tuple[Callable[[set[int]], None], set[int], Callable[[], None] | None]  # callback, partitions, after


class MemoryGroupConsumer(ConsumerBase):
    """The seam's GroupConsumer. It joins at its first poll; each poll first plays the group's news for this
    member, each with its callback on the caller's thread, outside the cluster lock: lost (after a kick:
    then it rejoins), revoked (all it holds, eager; the rebalance completes only after every member's
    on_revoked returned, so what it commits there lands before a new owner reads), assigned (its full new
    assignment, also when empty). Until a rebalance it joined completes, `assignment()` still lists what it
    revoked (as kafka-python's does) but nothing is fetched."""

    def __init__(self, cluster: MemoryCluster, group_id: str, **settings: Any) -> None:
        super().__init__(cluster, group_id=group_id, **settings)
        self._group = group_id
        self._topic: str | None = None
        self._listener: RebalanceListener | None = None
        self._member: Member | None = None

    def subscribe(self, topic: str, listener: RebalanceListener) -> None:
        with self._cluster.lock:
            self._check_open()
            if self._topic not in (None, topic):
                raise illegal(f"already subscribed to {self._topic!r}: one topic per consumer here")
            self._topic, self._listener = topic, listener

    def poll(self, timeout_s: float, max_records: int | None = None) -> Polled:
        self._check_open()
        acted = False
        while (step := self._next_step()) is not None:
            callback, partitions, after = step
            acted = True
            try:
                callback(partitions)
            finally:  # a failing listener still completes the step, then its error leaves poll()
                if after is not None:
                    with self._cluster.lock:
                        after()
        polled = self._fetch(max_records)
        if not polled and not acted:
            self._idle(timeout_s)
        return polled

    def _next_step(self) -> _Step | None:
        """The group's next news for this member, applied, with the callback that tells it."""
        with self._cluster.lock:
            if self._topic is None or self._listener is None:
                return None
            member = self._member
            if member is not None and member.kicked:
                lost = {tp.partition for tp, state in self._assignment.items() if state.fetchable}
                self._assignment.clear()
                self._member = member = None
                if lost:
                    return self._listener.on_lost, lost, None
            groups = self._cluster._groups
            if member is None:  # the first poll, or the one after a kick, joins, as its JoinGroup would
                member = self._member = groups.join(self._group, self._topic, self._client_id)
            group = groups.group(self._group)
            if group.rebalancing and not member.joined:
                revoking = self._revoke(member, group)
                if revoking is not None:
                    return revoking
            if member.pending is not None:
                # Partitions kept across the rebalance keep their position and pause, as in kafka-python.
                held = self._assignment
                self._assignment = {tp: held.get(tp) or FetchState() for tp in sorted(member.pending)}
                for state in self._assignment.values():
                    state.fetchable = True
                member.pending = None
                return self._listener.on_assigned, {tp.partition for tp in self._assignment}, None
            return None

    def _revoke(self, member: Member, group: Group) -> _Step | None:
        assert self._listener is not None
        revoked = {tp.partition for tp, state in self._assignment.items() if state.fetchable}
        for state in self._assignment.values():
            state.fetchable = False
        member.pending = None  # an assignment it was not told yet is superseded by this rebalance

        def rejoined() -> None:
            # Only now may the rebalance complete: whatever on_revoked committed is in the group's offsets
            # before any new owner resolves its position from them.
            member.joined = True
            group.maybe_complete(self._cluster._log)

        if revoked:
            return self._listener.on_revoked, revoked, rejoined
        rejoined()  # nothing to tell: rejoin now (which may complete the rebalance at once)
        return None

    def group_metadata(self) -> GroupMetadata:
        with self._cluster.lock:
            member = self._member
            if member is None:
                return GroupMetadata(self._group)
            return GroupMetadata(self._group, member.generation, member.member_id)

    def assignment(self) -> set[TopicPartition]:
        with self._cluster.lock:
            return set(self._assignment)

    def connection_count(self) -> int | None:
        return 1

    def close(self) -> None:
        """Revoke what it holds (or, after a kick, lose it), then leave the group: the rest rebalance."""
        with self._cluster.lock:
            if self._closed:
                return
            member, listener = self._member, self._listener
            held = {tp.partition for tp, state in self._assignment.items() if state.fetchable}
        try:
            if member is not None and listener is not None and held:
                (listener.on_lost if member.kicked else listener.on_revoked)(held)
        finally:
            with self._cluster.lock:
                if member is not None:
                    self._cluster._groups.remove(self._group, member, kicked=False)
                self._member, self._closed = None, True
                self._assignment.clear()
