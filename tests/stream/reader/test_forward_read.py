"""Small records read forward (`PayloadFetcher`, in-memory seam): one consumer over the partitions, every
record received once, a partition read past its rows stops fetching once it keeps `_KEPT_BYTES`, and rows
read ahead are taken by the trainer's thread without a request."""

from __future__ import annotations

import pytest

import rollout_stream.reader.payloads as payloads
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.reader.payloads import PayloadFetcher, _Request

RECORDS, SIZE = 2000, 1000  # a partition


def _read(fetcher: PayloadFetcher, wanted: dict[int, set[int]]) -> _Request:
    request = _Request(wanted, 10.0, forward=True)
    fetcher._requests.put(request)
    request.done.wait()
    assert request.error is None, request.error
    return request


@pytest.fixture
def fetcher(monkeypatch) -> PayloadFetcher:
    monkeypatch.setattr(payloads, "_KEPT_BYTES", 4096)
    cluster = MemoryCluster(clock_ms=1_000_000)
    cluster.create_topic("t", 2)
    producer = cluster.client().producer(client_id="p", max_record_bytes=1 << 20)
    for i in range(2 * RECORDS):
        producer.send("t", (i // 2).to_bytes(4, "big") * (SIZE // 4), partition=i % 2)
    producer.flush()
    f = PayloadFetcher(cluster.client(), "test", "t", 1 << 20)
    yield f
    f.close()


def test_a_partition_read_past_its_rows_keeps_a_bounded_amount_and_fetches_again_when_asked(fetcher):
    first = _read(fetcher, {0: {0, 3}, 1: {0}})
    assert sorted(first.got) == [(0, 0), (0, 3), (1, 0)]
    second = _read(fetcher, {0: {RECORDS - 1}})  # p1 is fetched on the way, not wanted
    assert sorted(second.got) == [(0, RECORDS - 1)]
    held = fetcher._forward[1]
    assert 1 in fetcher._forward_paused and 4096 <= held.kept_bytes < RECORDS * SIZE // 2
    third = _read(fetcher, {1: {5, RECORDS - 1}})  # kept, then fetched again from where it stopped
    assert {k: v[0][:4] for k, v in third.got.items()} == {
        (1, 5): (5).to_bytes(4, "big"), (1, RECORDS - 1): (RECORDS - 1).to_bytes(4, "big")}
    assert 1 not in fetcher._forward_paused
    # every record received once: p0 to its end, p1 to its end, nothing twice
    assert fetcher.fetched_bytes == 2 * RECORDS * SIZE


def test_between_requests_the_partitions_are_read_ahead_up_to_a_bound(fetcher, monkeypatch):
    import time

    monkeypatch.setattr(payloads, "_AHEAD_BYTES", 64 << 10)
    _read(fetcher, {0: {0}, 1: {0}})
    deadline = time.monotonic() + 5
    while sum(s.kept_bytes for s in fetcher._forward.values()) < 64 << 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    received = fetcher.fetched_bytes
    kept = sum(s.kept_bytes for s in fetcher._forward.values())
    assert 64 << 10 <= kept < RECORDS * SIZE  # read ahead, and stopped long before the partitions' ends
    time.sleep(0.3)
    assert fetcher.fetched_bytes == received  # nothing more while nothing is asked
    ahead = _read(fetcher, {0: {40}, 1: {40}})  # found among what was read ahead
    assert sorted(ahead.got) == [(0, 40), (1, 40)]


def _until(condition, what: str, timeout_s: float = 5.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_partition_no_request_wants_stays_paused_and_keeps_no_more(fetcher):
    _read(fetcher, {0: {0}, 1: {0}})
    _read(fetcher, {0: {10}})
    _until(lambda: 1 in fetcher._forward_paused, "p1 paused once it keeps _KEPT_BYTES")
    held = fetcher._forward[1].kept_bytes
    for k in range(20, 400, 20):  # requests for p0 alone: p1 is not woken to fetch again
        _read(fetcher, {0: {k}})
    assert fetcher._forward[1].kept_bytes == held and 1 in fetcher._forward_paused


def test_a_failure_while_reading_ahead_leaves_the_fetcher_serving(fetcher, monkeypatch):
    monkeypatch.setattr(payloads, "_KEPT_BYTES", 1 << 30)  # nothing paused: it reads on ahead to the ends
    _read(fetcher, {0: {0}, 1: {0}})
    consumer = fetcher._forward_consumer
    real, failed = consumer.poll, []

    def poll(timeout_s, max_records=None):
        if not failed:
            failed.append(True)
            raise RuntimeError("the broker went away")
        return real(timeout_s, max_records)

    monkeypatch.setattr(consumer, "poll", poll)
    _until(lambda: fetcher._forward_consumer is None, "the failed read-ahead forgotten")
    again = _read(fetcher, {0: {7}, 1: {9}})  # read afresh, by a new consumer
    assert sorted(again.got) == [(0, 7), (1, 9)] and fetcher._thread.is_alive()


def test_rows_read_ahead_are_taken_by_the_trainers_thread_and_reading_ahead_goes_on(fetcher, monkeypatch):
    monkeypatch.setattr(payloads, "_AHEAD_BYTES", 64 << 10)
    _read(fetcher, {0: {0}, 1: {0}})
    _until(lambda: fetcher._ahead_stopped, "reading ahead stopped at its bound")
    assert fetcher._take_read_ahead({0: {5}, 1: {RECORDS - 1}}) == {
        (0, 5): (b"\0\0\0\x05" * (SIZE // 4), None)}  # p1's row is not read yet: left to a request
    received = fetcher.fetched_bytes
    last = {p: {next(reversed(fetcher._forward[p].kept))} for p in (0, 1)}
    taken = fetcher._take_read_ahead(last)  # all that was kept: reading ahead goes on
    assert sorted(taken) == sorted((p, o) for p, offsets in last.items() for o in offsets)
    _until(lambda: fetcher.fetched_bytes > received, "read on ahead once rows were taken")
    assert fetcher._requests.qsize() == 0
    rest = _read(fetcher, {1: {RECORDS - 1}})
    assert sorted(rest.got) == [(1, RECORDS - 1)]
