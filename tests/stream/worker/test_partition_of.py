"""The stage names each group's output partition itself; it must be the one the key would get anyway."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.cluster import ClusterMetadata
from kafka.partitioner.default import DefaultPartitioner

from rollout_stream.kafka.kafka_python import _Producer as SeamProducer


def partition_of(producer: object, topic: str, key: bytes) -> int | None:
    return SeamProducer(producer).partition_for(topic, key)  # type: ignore[arg-type]


class _Producer:
    def __init__(self, partitions: int) -> None:
        self.partitions = set(range(partitions))

    def partitions_for(self, topic: str) -> set[int]:
        return self.partitions


class _Cluster(ClusterMetadata):
    def __init__(self, partitions: int) -> None:
        super().__init__()
        self._partitions_n = partitions

    def topics(self, exclude_internal_topics: bool = True) -> set[str]:
        return {"train"}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self._partitions_n))

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(self._partitions_n))


@settings(max_examples=300, deadline=None)
@given(key=st.binary(max_size=64) | st.text(max_size=40).map(str.encode), partitions=st.integers(1, 64))
def test_partition_of_matches_the_default_partitioner(key: bytes, partitions: int) -> None:
    expected = DefaultPartitioner().partition("train", key, key, b"v", b"v", _Cluster(partitions))
    assert partition_of(_Producer(partitions), "train", key) == expected


def test_partition_of_known_java_values() -> None:
    # murmur2 of the Java client (kafka-python's test vectors): "21" -> -973932308, "foobar" -> -790332482
    assert partition_of(_Producer(1000), "train", b"21") == (-973932308 & 0x7FFFFFFF) % 1000
    assert partition_of(_Producer(1000), "train", b"foobar") == (-790332482 & 0x7FFFFFFF) % 1000


def test_unknown_or_refused_topic_leaves_the_choice_to_send() -> None:
    from kafka.errors import TopicAuthorizationFailedError

    class Refusing:
        def partitions_for(self, topic: str) -> set[int]:
            raise TopicAuthorizationFailedError(topic)

    class Unknown:
        def partitions_for(self, topic: str) -> set[int] | None:
            return None

    assert partition_of(Refusing(), "train", b"k") is None
    assert partition_of(Unknown(), "train", b"k") is None
