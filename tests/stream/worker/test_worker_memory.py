"""The worker on the in-memory Kafka seam: rebalances, restores, aborts, back-pressure and fencing, stepped
one tick at a time, in a fraction of a second each. The same behaviours are proven on the real broker by
test_worker*.py, test_fencing.py, test_backpressure.py and test_chaos.py."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

from rollout_stream.clients import Connection
from rollout_stream.codec import Sample, decode_train_sample, encode_sample, group_key
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.kafka import (
    AuthorizationFailed,
    BrokerUnavailable,
    CommitFailed,
    KafkaFailure,
    ProducerFenced,
    RecordRefused,
)
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.worker import Worker
from rollout_stream.worker.instance import InstanceClaim

TOPICS = TopicNames("in", "out", "dlq")


def sample(gi: int, rid: int, reward: float, *, size: int = 2) -> Sample:
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=size, run_id="m",
                  tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 1], rollout_log_probs=[-0.5, -0.25])


def group(gi: int, size: int = 2) -> list[Sample]:
    return [sample(gi, gi * 10 + r, float(r % 2), size=size) for r in range(size)]


@pytest.fixture
def cluster() -> MemoryCluster:
    c = MemoryCluster(clock_ms=1_000_000)
    for name in (TOPICS.input, TOPICS.output, TOPICS.dead_letter):
        c.create_topic(name, 2, **{"max.message.bytes": str(64 << 20)})
    return c


def produce(cluster: MemoryCluster, samples: list[Sample]) -> None:
    producer = cluster.client().producer(client_id="test")
    for s in samples:
        producer.send(TOPICS.input, encode_sample(s), group_key(s))
    producer.flush()


def worker(cluster: MemoryCluster, name: str = "w1", *, clock: float = 1_000.0, **config) -> Worker:
    config.setdefault("commit_interval_s", 3600.0)  # commits only where a test makes them happen
    config.setdefault("transaction_timeout_s", 7200.0)  # the in-memory cluster never times a transaction out
    cfg = WorkerConfig(topics=TOPICS, group_id="g", group_timeout_s=60.0, **config)
    w = Worker(cfg, Connection("memory:9092", client_id=name), client=cluster.client(), clock=lambda: clock,
               claim=InstanceClaim(name, Path("/nonexistent"), None))
    assert w.open()
    return w


def steps(*workers: Worker, n: int = 5) -> None:
    for _ in range(n):
        for w in workers:
            w.step()


def commit(w: Worker) -> None:
    w.commit_soon()
    w.step()


def published(cluster: MemoryCluster) -> Counter:
    """(group key, rollout id) of every committed train sample: each must appear exactly once."""
    return Counter(
        (r.key, decode_train_sample(r.value).sample.rollout_id) for r in cluster.records(TOPICS.output)
    )


def expected(groups: list[int], size: int = 2) -> Counter:
    return Counter((f"m/{gi}".encode(), gi * 10 + r) for gi in groups for r in range(size))


def test_publishes_each_group_once_and_commits_its_input(cluster):
    produce(cluster, [s for gi in range(4) for s in group(gi)])
    w = worker(cluster)
    steps(w)
    assert published(cluster) == Counter()  # uncommitted: invisible to read_committed
    commit(w)
    assert published(cluster) == expected(range(4))
    committed = cluster.committed("g")
    assert sum(c.offset for c in committed.values()) == 8


def test_revoke_commits_before_the_partitions_move(cluster):
    produce(cluster, [s for gi in range(6) for s in group(gi)])
    w1 = worker(cluster, "w1")
    steps(w1)  # everything processed, nothing committed yet
    # routed, not yet committed: counted once the commit lands
    assert w1.processor.outcomes.groups_published == 6 and w1.stats.groups_published == 0 \
        and w1.stats.commits == 0
    w2 = worker(cluster, "w2")
    steps(w1, w2)  # w2 joins: w1 revokes everything (and commits it), then both are assigned
    assert published(cluster) == expected(range(6))  # committed in on_revoked, before any new owner read
    assert w1.stats.groups_published == 6 and w1.processor.outcomes.groups_published == 0
    assert sum(c.offset for c in cluster.committed("g").values()) == 12
    commit(w1), commit(w2)
    assert published(cluster) == expected(range(6))  # nothing re-published by the new owner
    assert w2.stats.groups_published == 0 and w1.processor.partitions.assigned \
        and w2.processor.partitions.assigned


def test_lost_partitions_abort_the_open_transaction_and_the_new_owner_publishes_once(cluster):
    produce(cluster, [s for gi in range(6) for s in group(gi)])
    w1 = worker(cluster, "w1")
    steps(w1)
    # outputs sent in an open transaction
    assert w1.processor.delivery is not None and w1.processor.delivery.open
    w2 = worker(cluster, "w2")
    cluster.kick(w1._consumer)  # w1 stalled past its session: its partitions go to w2
    steps(w2)
    commit(w2)
    steps(w1)  # w1 learns it lost its partitions: the transaction must never commit
    assert w1.stats.aborts == 1
    commit(w1)
    steps(w1, w2)
    commit(w1), commit(w2)
    assert published(cluster) == expected(range(6))


def test_restore_rebuilds_open_windows_from_the_changelog_with_outputs_suppressed(cluster):
    # Group 0 complete; group 1 half there (an open window) when w1 commits and goes away.
    produce(cluster, group(0) + group(1, size=4)[:2])
    w1 = worker(cluster, "w1")
    steps(w1)
    commit(w1)
    assert w1.store.open_count() == 1
    w1.close()  # leaves the group after committing: the committed offset is past the open window's records
    w2 = worker(cluster, "w2")
    steps(w2)  # assigned, restored: the open window is read again from the input, nothing re-published
    assert w2.stats.restores == 2 and w2.stats.restored_records == 2 and w2.store.open_count() == 1
    produce(cluster, group(1, size=4)[2:])
    steps(w2)
    commit(w2)
    assert published(cluster) == expected([0]) + expected([1], size=4)
    assert w2.stats.groups_published == 1  # only group 1: group 0 stays published by w1


def test_a_restore_that_meets_a_retriable_failure_is_tried_again(cluster, monkeypatch):
    # After a broker restart a new leader answers offset queries with OFFSET_NOT_AVAILABLE for a while: the
    # worker waits and restores again (in the 3-node chaos test it exited instead).
    monkeypatch.setattr("rollout_stream.worker.restore.RESTORE_RETRY_S", 0.05)
    produce(cluster, group(0) + group(1, size=4)[:2])
    w1 = worker(cluster, "w1")
    steps(w1)
    commit(w1)
    w1.close()
    w2 = worker(cluster, "w2")
    real, failures = w2.processor.restorer.restore, [2]

    def restore(p, *lent):
        if failures[0]:
            failures[0] -= 1
            raise KafkaFailure("Broker: Leader high watermark is not caught up", kind="OFFSET_NOT_AVAILABLE",
                               retriable=True)
        return real(p, *lent)

    monkeypatch.setattr(w2.processor.restorer, "restore", restore)
    steps(w2, n=2)  # assigned; both partitions' restores fail: they wait, nothing of theirs is processed
    assert w2.processor.partitions.to_restore == {0, 1} and w2.stats.restores == 0 \
        and w2.store.open_count() == 0
    time.sleep(0.06)
    steps(w2)
    assert not w2.processor.partitions.to_restore and w2.stats.restores == 2 and w2.store.open_count() == 1
    produce(cluster, group(1, size=4)[2:])
    steps(w2)
    commit(w2)
    assert published(cluster) == expected([0]) + expected([1], size=4)


def test_a_restore_that_meets_a_failure_that_is_not_retriable_stops_the_worker(cluster, monkeypatch):
    produce(cluster, group(0))
    w = worker(cluster)

    def restore(p, *lent):
        raise KafkaFailure("Broker: Topic authorization failed", kind="TOPIC_AUTHORIZATION_FAILED")

    monkeypatch.setattr(w.processor.restorer, "restore", restore)
    with pytest.raises(KafkaFailure, match="authorization"):
        steps(w)


def test_an_aborted_commit_restores_and_publishes_everything_exactly_once(cluster):
    produce(cluster, [s for gi in range(5) for s in group(gi)])
    w = worker(cluster)
    steps(w)
    cluster.fail_next_commit(BrokerUnavailable("broker went away", kind="KafkaConnectionError"))
    commit(w)  # the commit fails: the transaction is aborted and every partition restored
    assert w.stats.aborts == 1 and published(cluster) == Counter()
    # nothing counted that was aborted
    assert w.stats.groups_published == w.processor.outcomes.groups_published == 0
    steps(w)
    commit(w)
    assert published(cluster) == expected(range(5))
    assert w.stats.groups_published == 5  # each group counted once, though routed twice


def _refusing_the_fifth_send(monkeypatch, w: Worker, failure: KafkaFailure) -> list[tuple]:
    """The fifth record sent fails with `failure`: the second output of the second group published."""
    producer = w.processor.delivery.producer
    real, sends = producer.send, []

    def send(*args, **kwargs):
        sends.append(args)
        if len(sends) == 5:
            raise failure
        return real(*args, **kwargs)

    monkeypatch.setattr(producer, "send", send)
    return sends


def test_a_send_that_fails_in_a_group_aborts_its_transaction_and_the_worker_publishes_once_after_restoring(
        cluster, monkeypatch, caplog):
    produce(cluster, [s for gi in range(4) for s in group(gi, size=3)])
    w = worker(cluster)
    sends = _refusing_the_fifth_send(monkeypatch, w, BrokerUnavailable("broker went away",
                                                                         kind="KafkaConnectionError"))
    with caplog.at_level("WARNING", logger="rollout_stream.worker"):
        for _ in range(5):  # until the failed send: the first group and part of the second are aborted
            w.step()
            if w.stats.aborts:
                break
    assert len(sends) == 5 and w.stats.aborts == 1 and w.processor.partitions.to_restore
    assert published(cluster) == Counter() and cluster.committed("g") == {}
    assert any("commit.aborted" in r.getMessage() and "broker went away" in r.getMessage()
               for r in caplog.records)
    steps(w)  # restored from the last commit (none): every group read and sent again
    commit(w)
    assert published(cluster) == expected(range(4), size=3)
    assert w.stats.groups_published == 4  # each group counted once, though routed twice
    w.close()


@pytest.mark.parametrize("failure", [
    AuthorizationFailed("Broker: Topic authorization failed", resource="topic",
                        kind="TOPIC_AUTHORIZATION_FAILED"),
    RecordRefused("Broker: Message size too large", kind="MSG_SIZE_TOO_LARGE"),  # every restore would meet it
], ids=["missing-acl", "records-refused"])
def test_a_send_refused_for_good_stops_the_worker_and_its_shutdown_commits_nothing(cluster, monkeypatch,
                                                                                    failure):
    produce(cluster, [s for gi in range(4) for s in group(gi, size=3)])
    w = worker(cluster)
    _refusing_the_fifth_send(monkeypatch, w, failure)
    with pytest.raises(type(failure), match=failure.kind):
        steps(w)
    assert w.stats.aborts == 0  # not restored and sent again
    # The first group's outputs and part of the second's were queued: the transaction was aborted, and the
    # shutdown commits nothing after it (it says why).
    with pytest.raises(type(failure), match=failure.kind):
        w.close()
    assert published(cluster) == Counter() and cluster.committed("g") == {}
    w2 = worker(cluster, "w2")
    steps(w2)
    commit(w2)
    assert published(cluster) == expected(range(4), size=3)


def test_records_the_broker_refused_stop_the_worker_and_it_commits_nothing(cluster):
    # The refusal comes back on the send's future: the transaction can only abort (the next send or the
    # commit says so), and a restore would send the same records again, the loop it must not enter.
    produce(cluster, [s for gi in range(3) for s in group(gi)])
    w = worker(cluster)
    cluster.fail_sends(TOPICS.output, RecordRefused("a 9-byte record is over max.message.bytes=8",
                                                    kind="MessageSizeTooLargeError"))
    with pytest.raises(KafkaFailure, match="max.message.bytes"):
        steps(w)
        commit(w)
    assert w.stats.aborts == 0 and w.processor.delivery.fatal is not None
    with pytest.raises(KafkaFailure, match="max.message.bytes"):
        w.close()
    assert published(cluster) == Counter() and cluster.committed("g") == {}


def test_a_failure_that_is_not_retriable_restores_until_it_aborts_three_transactions_in_a_row(cluster,
                                                                                              caplog):
    from rollout_stream.worker.delivery import RECURRING_ABORTS

    produce(cluster, [s for gi in range(3) for s in group(gi)])
    w = worker(cluster)
    for attempt in range(1, RECURRING_ABORTS):
        steps(w)
        cluster.fail_next_commit(KafkaFailure("Broker: Unknown server error", kind="UNKNOWN_SERVER_ERROR"))
        commit(w)  # aborted, every partition restored from the last commit: not (yet) the worker's end
        assert w.stats.aborts == attempt and w.processor.partitions.to_restore
    steps(w)
    cluster.fail_next_commit(KafkaFailure("Broker: Unknown server error", kind="UNKNOWN_SERVER_ERROR"))
    with caplog.at_level("ERROR", logger="rollout_stream.delivery"), \
            pytest.raises(KafkaFailure, match="UNKNOWN_SERVER_ERROR"):
        commit(w)  # the same failure a third time in a row: it comes back after every restore
    assert any("transaction.failing_again" in r.getMessage() and "aborts_in_a_row=3" in r.getMessage()
               for r in caplog.records)
    assert published(cluster) == Counter() and cluster.committed("g") == {}


def test_commits_fenced_by_rebalances_restore_however_many_in_a_row(cluster):
    produce(cluster, [s for gi in range(3) for s in group(gi)])
    w = worker(cluster)
    for attempt in range(1, 5):
        steps(w)
        cluster.fail_next_commit(CommitFailed("Broker: Specified group generation id is not valid",
                                              kind="ILLEGAL_GENERATION"))
        commit(w)  # a rebalance fenced it: restored, never the worker's end
        assert w.stats.aborts == attempt
    steps(w)
    commit(w)
    assert published(cluster) == expected(range(3))


def test_a_success_between_failures_that_are_not_retriable_starts_the_count_again(cluster):
    produce(cluster, [s for gi in range(2) for s in group(gi)])
    w = worker(cluster)
    for gi in range(2, 8):
        steps(w)
        if gi % 2 == 0:  # two in a row at most, then a commit goes through
            cluster.fail_next_commit(KafkaFailure("Broker: Unknown server error", kind="UNKNOWN"))
            commit(w)
            steps(w)
            cluster.fail_next_commit(KafkaFailure("Broker: Unknown server error", kind="UNKNOWN"))
        commit(w)
        produce(cluster, group(gi))
    steps(w)
    commit(w)
    assert w.stats.aborts == 6 and published(cluster) == expected(range(8))


@pytest.mark.parametrize("answer_lost", [False, True], ids=["abort-refused", "abort-done-answer-lost"])
def test_an_abort_that_failed_is_asked_again_before_the_next_transaction(cluster, monkeypatch, caplog,
                                                                         answer_lost):
    # The abort asked again either goes through, or (the first one went through, its answer was lost) is
    # refused as out of place: either way the next transaction begins and everything is published once.
    produce(cluster, [s for gi in range(3) for s in group(gi)])
    w = worker(cluster)
    producer = w.processor.delivery.producer
    real, aborts = producer.abort_transaction, []

    def abort_transaction():
        aborts.append(time.monotonic())
        if len(aborts) == 1:
            if answer_lost:
                real()
            raise BrokerUnavailable("coordinator went away", kind="KafkaConnectionError")
        real()

    monkeypatch.setattr(producer, "abort_transaction", abort_transaction)
    steps(w)
    cluster.fail_next_commit(BrokerUnavailable("broker went away", kind="KafkaConnectionError"))
    with caplog.at_level("ERROR", logger="rollout_stream.delivery"):
        commit(w)
    assert w.stats.aborts == 1 and len(aborts) == 1
    assert any("transaction.abort_failed" in r.getMessage() for r in caplog.records)
    steps(w)  # restored; the first send asks for the abort again before it begins a transaction
    assert len(aborts) == 2
    commit(w)
    assert published(cluster) == expected(range(3)) and w.stats.aborts == 1
    w.close()


def test_the_progress_line_names_a_partition_whose_windows_cannot_expire(cluster, monkeypatch, caplog):
    produce(cluster, [group(gi)[0] for gi in range(2)])  # two groups, one member each: windows stay open
    w = worker(cluster, progress_interval_s=0.001)
    steps(w)
    # read up: the clock may expire them
    assert w.store.open_count() == 2 and w.observer.expiry_blocked() == ""
    unknown = min(k[0] for k in w.store.open)
    real = w._consumer.highwater
    monkeypatch.setattr(w._consumer, "highwater", lambda tp: None if tp.partition == unknown else real(tp))
    with caplog.at_level("INFO", logger="rollout_stream.worker"):
        w.step()
    assert w.observer.expiry_blocked() == f"{unknown}:no_watermark"
    progress = [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress ")]
    assert progress and f"expiry_blocked={unknown}:no_watermark" in progress[-1]


def test_back_pressure_pauses_at_the_cap_then_reads_on_past_it_when_nothing_closes(cluster):
    # Three groups open at once (their first members first), the cap is two; their second members arrive
    # while the worker is paused, so no window can close until it reads on past the cap.
    produce(cluster, [group(gi)[0] for gi in range(3)])
    w = worker(cluster, max_open_groups=2, commit_interval_s=0.001)
    w.back_pressure.stall_s = 0.05
    steps(w)
    assert w.back_pressure.paused and w.store.open_count() == 3
    assert w.observer.expiry_blocked() == "all:paused"  # the progress line says why nothing expires
    produce(cluster, [group(gi)[1] for gi in range(3)])
    steps(w)
    assert w.back_pressure.paused and w.stats.groups_published == 0  # nothing fetched behind the pause
    time.sleep(0.06)  # no window closed within the stall time: read on past the cap
    steps(w)
    assert not w.back_pressure.paused and w.store.open_count() == 0
    commit(w)
    assert published(cluster) == expected(range(3))


def test_a_zombie_cannot_commit_after_its_partitions_moved(cluster):
    produce(cluster, [s for gi in range(4) for s in group(gi)])
    zombie = worker(cluster, "w1")
    steps(zombie)  # published in an open transaction, then frozen
    successor = worker(cluster, "w1")  # same instance id: its producer fences the zombie's
    cluster.kick(zombie._consumer)
    steps(successor)
    commit(successor)
    steps(zombie)  # it learns it lost its partitions: its open transaction is aborted, never committed
    assert published(cluster) == expected(range(4))
    produce(cluster, [s for gi in range(4, 10) for s in group(gi)])
    with pytest.raises(ProducerFenced):  # back in the group, its first transaction is refused: it stops
        for _ in range(10):
            steps(zombie, successor)
            commit(successor)
            commit(zombie)
    cluster.kick(zombie._consumer)  # the stopped zombie is gone: the successor owns everything
    steps(successor)
    commit(successor)
    assert published(cluster) == expected(range(10))


def test_a_worker_told_to_leave_on_stop_leaves_after_its_shutdown_commit_and_a_failed_leave_is_only_logged(
        cluster, monkeypatch, caplog):
    produce(cluster, [s for gi in range(3) for s in group(gi)])
    asked: list[tuple[str, str, int]] = []
    admin_class = type(cluster.client().admin(client_id="probe"))

    def remove(self, group_id: str, instance_id: str) -> bool:
        # committed before the leave: the partitions move only once their outputs are visible
        asked.append((group_id, instance_id, len(published(cluster))))
        raise BrokerUnavailable("coordinator went away", kind="KafkaConnectionError")

    monkeypatch.setattr(admin_class, "remove_static_member", remove)
    w = worker(cluster, leave_group_on_stop=True)
    steps(w)
    with caplog.at_level("WARNING", logger="rollout_stream.worker"):
        w.close()  # the shutdown commit, then the leave, which fails: logged, the stop goes on
    assert asked == [("g", "w1", 6)]
    assert published(cluster) == expected(range(3))
    assert any("group.leave_failed" in r.getMessage() for r in caplog.records)


def test_a_worker_stopped_by_an_error_does_not_leave_its_group(cluster, monkeypatch):
    """Fenced, a newer worker holds its instance id: leaving would remove that one from the group."""
    asked: list[str] = []
    admin_class = type(cluster.client().admin(client_id="probe"))
    monkeypatch.setattr(admin_class, "remove_static_member",
                        lambda self, group_id, instance_id: asked.append(instance_id) or True)
    cfg = WorkerConfig(topics=TOPICS, group_id="g", group_timeout_s=60.0, commit_interval_s=3600.0,
                       transaction_timeout_s=7200.0, leave_group_on_stop=True)
    w = Worker(cfg, Connection("memory:9092", client_id="w1"), client=cluster.client(), clock=lambda: 1_000.0,
               claim=InstanceClaim("w1", Path("/nonexistent"), None))

    def taken_over() -> None:
        raise ProducerFenced("a newer producer with this transactional id", kind="ProducerFencedError")

    monkeypatch.setattr(w, "step", taken_over)
    with pytest.raises(ProducerFenced):
        w.run()
    assert asked == []

    w2 = Worker(cfg, Connection("memory:9092", client_id="w2"), client=cluster.client(),
                clock=lambda: 1_000.0, claim=InstanceClaim("w2", Path("/nonexistent"), None))
    step = w2.step

    def one_step_then_sigterm() -> None:
        step()
        w2.request_stop()

    monkeypatch.setattr(w2, "step", one_step_then_sigterm)
    w2.run()  # a clean stop does leave
    assert asked == ["w2"]

    w3 = Worker(cfg, Connection("memory:9092", client_id="w3"), client=cluster.client(),
                clock=lambda: 1_000.0, claim=InstanceClaim("w3", Path("/nonexistent"), None))
    assert w3.open()
    w3.request_stop()
    monkeypatch.setattr(w3.processor, "commit", lambda timeout=None: taken_over())
    with pytest.raises(ProducerFenced):  # stopped cleanly, but fenced at its shutdown commit
        w3.close()
    assert asked == ["w2"]


def test_refill_keeps_a_zero_variance_group_off_train_data_and_tells_the_admission_log(cluster):
    """`--zero-variance refill`: the stage drops the group, as `drop` does, and says so in the admission
    log once its commit succeeded: the group's prompt settles as filtered and another prompt takes its
    place (docs/loop.md)."""
    from rollout_stream.codec.admission import Resolved, decode_admission
    from rollout_stream.config import parse_zero_variance
    from rollout_stream.pacing import ensure_admission_topic

    assert str(parse_zero_variance("refill")) == "refill"
    ensure_admission_topic(Connection("memory:9092"), "out.admission", cluster.client())
    flat = [sample(1, 10 + r, 1.0) for r in range(2)]  # one reward shared: no signal
    produce(cluster, flat + group(2))
    w = worker(cluster, zero_variance=parse_zero_variance("refill"))
    steps(w)
    commit(w)
    assert published(cluster) == expected([2])
    assert w.stats.zero_variance_groups == 1 and w.stats.zero_variance_dropped == 2
    said = [decode_admission(r.value or b"") for r in cluster.records("out.admission")]
    assert [(r.keys, r.reason) for r in said if isinstance(r, Resolved)] == [(["m/1"], "zero_variance")]


def dead_letters(cluster: MemoryCluster) -> list[str]:
    return [dict(r.headers)["x-dlq-reason"].decode() for r in cluster.records(TOPICS.dead_letter)]


def test_revoked_partitions_are_not_the_workers_until_assigned_again(cluster):
    """kafka-python runs a rebalance on its IO thread: between the revocation and the next assignment the
    loop goes on, and the partitions may already be another worker's. Nothing of them is expired, processed
    or committed then; records of them that come are read again once they are given back."""
    produce(cluster, group(0, size=4)[:2] + group(1, size=4)[:2])  # two groups half there: open windows
    now = [1_000.0]
    w1 = worker(cluster, "w1")
    w1.processor.clock = lambda: now[0]
    steps(w1)
    commit(w1)
    assert w1.store.open_count() == 2
    mine = set(w1.processor.partitions.assigned)
    w1.processor.revoke(mine)  # the listener, as a rebalance starts
    now[0] += 120  # both groups past their 60 s timeout
    produce(cluster, group(0, size=4)[2:])  # group 0 completes meanwhile
    time.sleep(0.25)  # the expiry's turn comes round (every 0.2 s)
    steps(w1)
    commit(w1)
    assert dead_letters(cluster) == [] and published(cluster) == Counter()  # not its partitions now
    w1.processor.assign(mine)  # given back: restored from the commit, group 0's records read again
    steps(w1)
    time.sleep(0.25)
    steps(w1)
    commit(w1)
    assert published(cluster) == Counter((b"m/0", r) for r in range(4))
    assert dead_letters(cluster) == ["incomplete_group", "incomplete_group"]  # group 1, its two records
