"""The commit cadence shared by the worker and the benchmark's passthrough."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rollout_stream.worker.cadence import POLL_MS, CommitCadence


def test_under_a_backlog_commits_are_one_interval_apart_or_max_records():
    c = CommitCadence(interval_s=0.1, max_records=3)
    c.committed(10.0)
    c.uncommitted = c.outputs = 2
    assert not c.due(10.05, caught_up=False)
    assert c.due(10.11, caught_up=False)
    c.uncommitted = 3
    assert c.due(10.01, caught_up=False)
    c.committed(10.02)
    assert (c.uncommitted, c.outputs) == (0, 0) and not c.due(10.03, caught_up=False)
    c.soon()
    assert c.due(10.03, caught_up=False) and c.poll_timeout_ms(10.03) == POLL_MS  # nothing read: no hurry


def test_caught_up_with_outputs_waiting_commits_after_a_quarter_interval():
    c = CommitCadence(interval_s=0.1, max_records=1000)
    c.committed(5.0)
    c.uncommitted = 4  # records read, but only into open windows
    assert not c.due(5.05, caught_up=True)
    c.outputs = 4  # a group was published
    assert not c.due(5.02, caught_up=True)
    assert c.due(5.03, caught_up=True)
    assert not c.due(5.03, caught_up=False)  # a full poll: more input waits, commits stay an interval apart


def test_the_next_commit_counts_from_the_end_of_the_last_one():
    c = CommitCadence(interval_s=0.1, max_records=1000)
    c.committed(5.0)
    c.finished(5.06)  # a slow commit: 60 ms
    c.uncommitted = c.outputs = 4
    assert c.poll_timeout_ms(5.07) == 15
    assert not c.due(5.08, caught_up=True)  # 25 ms after its start would have been 5.025
    assert c.due(5.085, caught_up=True)
    assert not c.due(5.15, caught_up=False) and c.due(5.16, caught_up=False)


def test_poll_waits_only_until_the_next_commit_would_be_due():
    c = CommitCadence(interval_s=0.1, max_records=1000)
    c.committed(5.0)
    assert c.poll_timeout_ms(5.01) == POLL_MS  # nothing read since the commit
    c.uncommitted = 1
    assert c.poll_timeout_ms(5.01) == 90  # offsets to commit: by the interval
    c.outputs = 1
    assert 15 <= c.poll_timeout_ms(5.01) <= 16  # outputs waiting: by a quarter of it (rounded up)
    assert c.poll_timeout_ms(5.2) == 0


def test_behind_its_input_a_poll_waits_for_the_interval_not_for_the_early_commit():
    c = CommitCadence(interval_s=0.1, max_records=1000)
    c.committed(5.0)
    c.uncommitted = c.outputs = 8
    assert not c.due(5.03, caught_up=False)  # a full poll, or a poll's worth left
    assert c.poll_timeout_ms(5.03) == 70  # not 0: an empty poll would not make the early commit due
    assert c.due(5.05, caught_up=True)  # a short poll with little left: caught up, the early commit is due
    assert c.poll_timeout_ms(5.05) == 0


@given(st.floats(0.001, 10), st.floats(0, 20), st.integers(0, 10), st.integers(0, 10))
def test_a_poll_never_outlasts_the_commit_an_empty_poll_makes_due(interval, since, read, written):
    """Caught up: an empty poll (returned 0, little left) makes the early commit due."""
    c = CommitCadence(interval_s=interval, max_records=1 << 30, last=100.0, uncommitted=read, outputs=written)
    now = 100.0 + since
    timeout = c.poll_timeout_ms(now)
    assert 0 <= timeout <= POLL_MS
    if timeout < POLL_MS and timeout > 0:
        assert not c.due(now, caught_up=True)
    if read or written:
        # an empty poll returns by the time the commit is due (rounded up to the next millisecond)
        after = now + timeout / 1000 + 0.001
        assert c.due(after, caught_up=True) or timeout == POLL_MS


def test_caught_up_needs_a_short_poll_and_less_than_a_poll_left(kafka_bootstrap, topic_factory):
    """On a real consumer: what `backlog` reads from kafka-python's subscription state is the lag."""
    import time

    from rollout_stream.clients import Connection
    from rollout_stream.kafka import TopicPartition, client_for
    from rollout_stream.kafka.kafka_python import raw_producer
    from rollout_stream.worker.cadence import POLL_RECORDS, caught_up

    conn = Connection(kafka_bootstrap)
    topic = topic_factory(1)
    producer = raw_producer(conn)
    for i in range(POLL_RECORDS + 200):
        producer.send(topic, key=b"k", value=b"%d" % i)
    producer.flush()
    producer.close()
    consumer = client_for(conn).assigned_consumer(client_id="cadence-test", max_record_bytes=1 << 20)
    try:
        consumer.assign([TopicPartition(topic, 0)])
        first = consumer.poll(10.0, 10)
        assert sum(map(len, first.values())) == 10
        deadline = time.monotonic() + 10
        while consumer.highwater(TopicPartition(topic, 0)) is None and time.monotonic() < deadline:
            consumer.poll(0.1, 1)
        assert consumer.backlog() >= POLL_RECORDS and not caught_up(consumer, returned=10)
        returned = 0
        while consumer.backlog() and time.monotonic() < deadline:
            returned = sum(map(len, consumer.poll(1.0, POLL_RECORDS).values()))
        assert consumer.backlog() == 0 and caught_up(consumer, returned=min(returned, POLL_RECORDS - 1))
        assert not caught_up(consumer, returned=POLL_RECORDS)  # a full poll: more may be on its way
    finally:
        consumer.close()
