"""Topics as lists of entries per partition: records, transaction markers, and the last stable offset."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rollout_stream.kafka.errors import UnknownTopic
from rollout_stream.kafka.seam import Committed, Header, TopicPartition

__all__ = ["BROKER_DEFAULTS", "Isolation", "Log", "MemoryRecord", "Partition", "Topic", "Transaction",
           "unknown_topic"]

Isolation = Literal["read_committed", "read_uncommitted"]

# What a broker reports for a topic created without configs (describe_configs lists defaults too).
BROKER_DEFAULTS = {"cleanup.policy": "delete", "max.message.bytes": "1048588",
                   "message.timestamp.type": "CreateTime", "retention.ms": "604800000"}


def unknown_topic(what: str) -> UnknownTopic:
    return UnknownTopic(f"{what} does not exist", kind="UnknownTopicOrPartitionError")


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    """A record as consumers see it (the seam's `Record`)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


class Transaction:
    """One transaction: the first offset it wrote in each partition, and the group offsets it carries."""

    __slots__ = ("transactional_id", "state", "first", "offsets", "failed")

    def __init__(self, transactional_id: str) -> None:
        self.transactional_id = transactional_id
        self.state: Literal["open", "committed", "aborted"] = "open"
        self.first: dict[TopicPartition, int] = {}
        self.offsets: dict[str, dict[TopicPartition, Committed]] = {}
        self.failed: BaseException | None = None  # Kafka's abortable error: this transaction may only abort


@dataclass(slots=True)
class Entry:
    record: MemoryRecord | None  # None: a commit or abort marker, which takes an offset but is never returned
    txn: Transaction | None = None

    def visible(self, isolation: Isolation) -> bool:
        if self.record is None:
            return False
        if self.txn is None or isolation == "read_uncommitted":
            return True
        return self.txn.state == "committed"  # below the LSO a transaction is committed or aborted


@dataclass(slots=True)
class Partition:
    entries: list[Entry] = field(default_factory=list)
    open: dict[Transaction, int] = field(default_factory=dict)  # open transaction -> its first offset here

    def end(self, isolation: Isolation = "read_uncommitted") -> int:
        """The high watermark; for read_committed the last stable offset (what such a consumer may read)."""
        if isolation == "read_committed" and self.open:
            return min(self.open.values())
        return len(self.entries)

    def visible(self, isolation: Isolation) -> list[MemoryRecord]:
        below = self.entries[:self.end(isolation)]
        return [e.record for e in below if e.record is not None and e.visible(isolation)]


@dataclass(slots=True)
class Topic:
    partitions: list[Partition]
    configs: dict[str, str]


class Log:
    """Every topic of the cluster."""

    def __init__(self) -> None:
        self.topics: dict[str, Topic] = {}

    def partition(self, tp: TopicPartition) -> Partition:
        topic = self.topics.get(tp.topic)
        if topic is None or not 0 <= tp.partition < len(topic.partitions):
            raise unknown_topic(f"{tp.topic}:{tp.partition}")
        return topic.partitions[tp.partition]

    def count(self, topic: str) -> int:
        """The topic's partition count, 0 when it does not exist."""
        found = self.topics.get(topic)
        return len(found.partitions) if found else 0

    def append(self, tp: TopicPartition, record: MemoryRecord, txn: Transaction | None) -> None:
        part = self.partition(tp)
        if txn is not None and tp not in txn.first:
            txn.first[tp] = part.open[txn] = record.offset
        part.entries.append(Entry(record, txn))

    def end_transaction(self, txn: Transaction, commit: bool) -> None:
        """Decide the transaction and write its marker in every partition it wrote to."""
        txn.state = "committed" if commit else "aborted"
        for tp in txn.first:
            topic = self.topics.get(tp.topic)
            if topic is not None:  # the topic may have been deleted meanwhile
                part = topic.partitions[tp.partition]
                part.open.pop(txn, None)
                part.entries.append(Entry(None, txn))
