"""The group coordinator: members, eager rebalances, committed offsets and the commit checks of KIP-447."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rollout_stream.kafka.errors import CommitFailed
from rollout_stream.kafka.memory._log import Log
from rollout_stream.kafka.seam import Committed, TopicPartition

__all__ = ["Group", "GroupMetadata", "Groups", "Member", "range_assignment"]


def range_assignment(members: Sequence[tuple[str, str]], partitions: Mapping[str, int]
                     ) -> dict[str, set[TopicPartition]]:
    """Spread each topic's partitions over its (member id, topic) subscribers in the order given: contiguous
    ranges, the first members one partition more when they do not divide evenly."""
    out: dict[str, set[TopicPartition]] = {member: set() for member, _ in members}
    for topic in dict.fromkeys(t for _, t in members):
        subscribers = [member for member, t in members if t == topic]
        per, extra = divmod(partitions.get(topic, 0), len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            count = per + (1 if i < extra else 0)
            out[member] |= {TopicPartition(topic, p) for p in range(start, start + count)}
            start += count
    return out


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """What `group_metadata()` returns: who commits, as of which generation (-1 and "": no member)."""

    group_id: str
    generation: int = -1
    member_id: str = ""


@dataclass(eq=False, slots=True)
class Member:
    member_id: str
    topic: str
    generation: int = -1
    joined: bool = True  # has rejoined in the rebalance under way (revoked what it held)
    pending: set[TopicPartition] | None = None  # an assignment it has not been told yet
    kicked: bool = False


@dataclass(slots=True)
class Group:
    members: list[Member] = field(default_factory=list)  # live members in join order
    generation: int = 0  # of the last completed rebalance
    rebalancing: bool = False
    committed: dict[TopicPartition, Committed] = field(default_factory=dict)

    def trigger(self) -> None:
        """Start a rebalance: every member must rejoin (revoke) before it completes."""
        if not self.rebalancing:
            self.rebalancing = True
            for m in self.members:
                m.joined = False

    def maybe_complete(self, log: Log) -> None:
        """Once every live member rejoined: a new generation, each member's assignment awaiting its poll."""
        if not self.rebalancing or not all(m.joined for m in self.members):
            return
        self.rebalancing = False
        self.generation += 1
        counts = {m.topic: log.count(m.topic) for m in self.members}
        plan = range_assignment([(m.member_id, m.topic) for m in self.members], counts)
        for m in self.members:
            m.generation, m.pending = self.generation, plan[m.member_id]

    def validate(self, meta: GroupMetadata, *, transactional: bool) -> None:
        """Refuse a commit the broker would refuse (its ClassicGroup.validateOffsetCommit)."""
        if meta.generation < 0 and not self.members:
            return  # a group that only stores offsets
        if transactional and meta.generation < 0 and not meta.member_id:
            return  # a transaction that names no member cannot be fenced by one
        if not any(m.member_id == meta.member_id for m in self.members):
            raise CommitFailed(f"member {meta.member_id!r} is not in group {meta.group_id!r} (a rebalance "
                               f"removed it, or it never joined)", kind="UnknownMemberIdError")
        if meta.generation != self.generation:
            raise CommitFailed(f"generation {meta.generation} of group {meta.group_id!r} is stale (now "
                               f"{self.generation})", kind="IllegalGenerationError")


class Groups:
    """Every consumer group of the cluster."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.groups: dict[str, Group] = {}
        self._ids = itertools.count(1)

    def group(self, group_id: str) -> Group:
        return self.groups.setdefault(group_id, Group())

    def join(self, group_id: str, topic: str, client_id: str) -> Member:
        group = self.group(group_id)
        group.trigger()
        member = Member(f"{client_id}-{next(self._ids)}", topic)
        group.members.append(member)
        group.maybe_complete(self.log)
        return member

    def remove(self, group_id: str, member: Member, *, kicked: bool) -> None:
        group = self.group(group_id)
        if member in group.members:
            group.members.remove(member)
            member.kicked, member.pending = kicked, None
            group.trigger()
            group.maybe_complete(self.log)

    def rebalance(self, group_id: str) -> None:
        group = self.group(group_id)
        group.trigger()
        group.maybe_complete(self.log)

    def rebalance_subscribers(self, topic: str) -> None:
        """A topic appeared or went away: groups subscribed to it reassign (as on a metadata change)."""
        for group_id, group in self.groups.items():
            if any(m.topic == topic for m in group.members):
                self.rebalance(group_id)

    def commit(self, meta: GroupMetadata, offsets: Mapping[TopicPartition, Committed]) -> None:
        for tp in offsets:
            self.log.partition(tp)
        group = self.group(meta.group_id)
        group.validate(meta, transactional=False)
        group.committed.update(offsets)

    def forget_topic(self, topic: str) -> None:
        for group in self.groups.values():
            group.committed = {tp: c for tp, c in group.committed.items() if tp.topic != topic}
