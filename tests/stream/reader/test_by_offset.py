"""Records read by offset (`rollout_stream.reader.by_offset`) on the in-memory seam: each wanted record read
once and nothing else, side by side on up to READERS consumers (the librdkafka way) or run by run on one (the
kafka-python way), and a consumer never given a partition again while librdkafka's pause there lasts."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rollout_stream.reader.by_offset as by_offset
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.reader.by_offset import BACKOFF_MS, READERS, ByOffsetReader

TOPIC = "train-data"


def _cluster(records: int) -> MemoryCluster:
    cluster = MemoryCluster(clock_ms=1_000_000)
    cluster.create_topic(TOPIC, 3)
    producer = cluster.client().producer(client_id="t", max_record_bytes=1 << 20)
    for i in range(records):
        producer.send(TOPIC, f"{i % 3}:{i // 3}".encode() * (1 + i % 5), partition=i % 3)
    producer.flush()
    return cluster


class _Assigns:
    """Wraps the reader's consumers: every assignment, as (consumer, partition, monotonic time)."""

    def __init__(self, reader: ByOffsetReader) -> None:
        self.log: list[tuple[int, int, float]] = []
        new_slot = reader._new_slot

        def watched(slots: Any) -> Any:
            slot = new_slot(slots)
            assign_at, index = slot.consumer.assign_at, len(slots) - 1

            def logged(tp: Any, offset: int) -> None:
                self.log.append((index, tp.partition, time.monotonic()))
                assign_at(tp, offset)

            slot.consumer.assign_at = logged  # type: ignore[method-assign]
            return slot

        reader._new_slot = watched  # type: ignore[method-assign]


def _expected(values: dict[tuple[int, int], Any], wanted: dict[int, set[int]]) -> dict[tuple[int, int], Any]:
    return {(p, o): values[(p, o)] for p, offsets in wanted.items() for o in offsets}


def _read(reader: ByOffsetReader, wanted: dict[int, set[int]], record_bytes: int = 0
          ) -> dict[tuple[int, int], Any]:
    got: dict[tuple[int, int], Any] = {}
    assert reader.read(wanted, got, lambda partition, pending: True, record_bytes)
    return got


@pytest.mark.parametrize("patient", [True, False], ids=["librdkafka-way", "kafka-python-way"])
def test_each_wanted_record_is_read_once_and_nothing_else(patient):
    cluster = _cluster(90)
    values = {(r.partition, r.offset): r.value for r in cluster.records(TOPIC)}
    reader = ByOffsetReader(cluster.client(), "rank-0", TOPIC, 1 << 20)
    reader.patient = patient
    assigns = _Assigns(reader)
    wanted = {0: {0, 1, 2, 7, 20, 29}, 1: {3, 4}, 2: {11}}
    got = _read(reader, wanted)
    assert {k: v for k, (v, _) in got.items()} == _expected(values, wanted)
    assert reader.fetched_bytes == sum(len(values[k]) for k in got)  # nothing past a wanted record
    consumers = {c for c, _, _ in assigns.log}
    if patient:  # one record an assignment, side by side
        assert len(assigns.log) == 9 and len(consumers) == READERS
    else:  # runs of consecutive offsets, one consumer
        assert len(assigns.log) == 6 and consumers == {0}
    reader.close()


def test_a_consumer_is_not_given_a_partition_again_while_its_pause_there_lasts():
    cluster = _cluster(300)
    reader = ByOffsetReader(cluster.client(), "rank-0", TOPIC, 1 << 20)
    reader.patient = True
    assigns = _Assigns(reader)
    for batch in range(3):  # back to back, as a trainer without a step between batches asks
        _read(reader, {p: set(range(batch * 10, batch * 10 + 10, 2)) for p in range(3)})
    last: dict[tuple[int, int], float] = {}
    for consumer, partition, at in assigns.log:
        if (consumer, partition) in last:
            assert at - last[(consumer, partition)] >= BACKOFF_MS / 1000 * 0.99
        last[(consumer, partition)] = at
    assert len(assigns.log) == 45
    reader.close()


def test_large_records_are_fetched_fewer_at_once_with_the_longer_pause():
    cluster = _cluster(60)
    reader = ByOffsetReader(cluster.client(), "rank-0", TOPIC, 1 << 20)
    reader.patient = True
    busy_most = 0
    start = reader._start

    def counting(jobs: Any, slots: Any, busy: Any, limit: int) -> None:
        nonlocal busy_most
        start(jobs, slots, busy, limit)
        busy_most = max(busy_most, len(busy))

    reader._start = counting  # type: ignore[method-assign]
    _read(reader, {p: set(range(0, 20, 2)) for p in range(3)}, record_bytes=9 << 20)  # as an 8.6 MB batch
    assert busy_most == by_offset.IN_FLIGHT_BYTES // (9 << 20) == 3
    (pause_ms, slots), = reader._slots.items()
    assert pause_ms == by_offset.LARGE_BACKOFF_MS and {slot.backoff_ms for slot in slots} == {pause_ms}
    reader.close()


def test_a_read_that_is_told_to_stop_leaves_its_partitions():
    cluster = _cluster(30)
    reader = ByOffsetReader(cluster.client(), "rank-0", TOPIC, 1 << 20)
    reader.patient = True
    got: dict[tuple[int, int], Any] = {}
    assert not reader.read({0: {1, 2}, 1: {1}}, got, lambda partition, pending: False)
    assert all(not slot.consumer._assignment  # type: ignore[attr-defined]
               for slots in reader._slots.values() for slot in slots)
    reader.close()


@settings(max_examples=30, deadline=None)
@given(st.dictionaries(st.integers(0, 2), st.sets(st.integers(0, 39), min_size=1), min_size=1),
       st.booleans())
def test_any_wanted_set_is_read_exactly(wanted, patient):
    cluster = _CLUSTER
    values = {(r.partition, r.offset): r.value for r in cluster.records(TOPIC)}
    reader = ByOffsetReader(cluster.client(), "rank-0", TOPIC, 1 << 20)
    reader.patient = patient
    got = _read(reader, wanted)
    assert {k: v for k, (v, _) in got.items()} == _expected(values, wanted)
    reader.close()


_CLUSTER = _cluster(120)
assert by_offset.PATIENT_POLL_S < BACKOFF_MS / 1000
