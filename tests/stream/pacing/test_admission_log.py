"""The admission log through the Kafka seam, on the in-memory cluster (its clock drives LogAppendTime, so
leases run out when a test says so): what every gate decides comes from the log alone."""

from __future__ import annotations

import threading
import time

import pytest

from rollout_stream.clients import Connection
from rollout_stream.codec.admission import Renew
from rollout_stream.core.pacing import PacingLimits
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka.memory import MemoryClient, MemoryCluster
from rollout_stream.pacing import AdmissionGate, AdmissionWriter, PacingTimeout, ensure_admission_topic

TOPIC = "train-data.admission"


def gate(cluster: MemoryCluster, name: str, n: int) -> AdmissionGate:
    return AdmissionGate(Connection("memory:9092"), topic="rollouts", admission_topic=TOPIC,
                         progress_topic="train-data.progress", trainer_group="trainer",
                         limits=PacingLimits(max_unconsumed_groups=n), producer_id=name,
                         client=MemoryClient(cluster))


def test_the_log_is_created_stamped_by_the_broker_and_a_compacted_one_is_refused():
    cluster = MemoryCluster()
    conn = Connection("memory:9092")
    assert ensure_admission_topic(conn, TOPIC, MemoryClient(cluster))
    admin = MemoryClient(cluster).admin()
    configs = admin.topic_configs(TOPIC)
    assert (configs["cleanup.policy"], configs["message.timestamp.type"]) == ("delete", "LogAppendTime")
    assert not ensure_admission_topic(conn, TOPIC, MemoryClient(cluster))  # there already: left alone
    cluster.create_topic("td2.admission", 1, **{"cleanup.policy": "compact"})
    with pytest.raises(ConfigurationError, match="cleanup.policy=delete"):
        ensure_admission_topic(conn, "td2.admission", MemoryClient(cluster))


def test_eight_gates_asking_at_once_for_three_places_get_exactly_three():
    cluster = MemoryCluster()
    gates = [gate(cluster, f"p{i}", n=3) for i in range(8)]
    try:
        barrier, outcomes = threading.Barrier(len(gates)), []

        def ask(g: AdmissionGate) -> None:
            barrier.wait()
            try:
                g.admit(0, timeout=1.0)
                outcomes.append("admitted")
            except PacingTimeout:
                outcomes.append("timed out")

        threads = [threading.Thread(target=ask, args=(g,)) for g in gates]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(outcomes) == ["admitted"] * 3 + ["timed out"] * 5
        # every gate's fold counts the same three, whoever holds them
        assert {sum(gr.producer in {x.producer_id for x in gates} for gr in g._follower.fold.groups.values())
                for g in gates} == {3}
    finally:
        for g in gates:
            g.close()


def test_a_producer_that_stops_renewing_gives_its_undelivered_group_up_after_three_seconds_of_log_time():
    cluster = MemoryCluster(clock_ms=1_000_000)
    frozen, live = gate(cluster, "frozen", n=1), gate(cluster, "live", n=2)
    try:
        frozen.admit(0, timeout=5)
        frozen._stop.set()  # a process that froze: no renewals, nothing delivered
        frozen._renewer.join(timeout=5)
        live._stop.set()  # the test writes the log's clock forward itself
        live._renewer.join(timeout=5)
        writer = AdmissionWriter(Connection("memory:9092"), TOPIC, MemoryClient(cluster))
        cluster.clock_ms += 3_000
        writer.append(Renew(producer="live", session=live.session))
        deadline = time.monotonic() + 10
        while not any(g.revoked_ms is not None for g in live._follower.fold.groups.values()):
            assert time.monotonic() < deadline, live._follower.fold.groups
            time.sleep(0.02)
        assert live._follower.snapshot().sessions["frozen"] == "suspected"
        writer.close()
    finally:
        frozen.close()
        live.close()


def test_the_stage_says_which_groups_will_never_train_once_its_commit_succeeded():
    from rollout_stream.codec import DeadLetterReason
    from rollout_stream.codec.admission import decode_admission
    from rollout_stream.core.records import DeadLettered
    from rollout_stream.core.structs import InputRecord
    from rollout_stream.worker.admission import AdmissionResolver

    cluster = MemoryCluster()
    conn, client = Connection("memory:9092"), MemoryClient(cluster)
    resolver = AdmissionResolver(conn, client, TOPIC, "train-data")

    def refused(key: str, reason: DeadLetterReason, n: int, straggler: bool = False) -> DeadLettered:
        records = tuple(InputRecord("rollouts", 0, i, 0, key.encode(), b"") for i in range(n))
        return DeadLettered(reason, "refused", key, records, straggler=straggler)

    resolver.observe(refused("run/1", DeadLetterReason.SHARED_REWARD_VIOLATION, 4), [])
    resolver.committed()  # no admission log: nothing paced here, nothing written
    assert TOPIC not in client.admin().list_topics()

    ensure_admission_topic(conn, TOPIC, client)
    resolver._looked = -1e9  # looks again now, not in a minute
    resolver.observe(refused("run/2", DeadLetterReason.INCOMPLETE_GROUP, 2), [])
    resolver.aborted()  # decided again after the restore: nothing said
    resolver.observe(refused("run/3", DeadLetterReason.INCOMPLETE_GROUP, 2), [])
    resolver.observe(refused("run/4", DeadLetterReason.LATE_MEMBER, 1), [])  # its group was published
    resolver.observe(refused("run/5", DeadLetterReason.INVALID_SAMPLE, 1), [])  # one record: says nothing
    resolver.observe(refused("run/3", DeadLetterReason.INCOMPLETE_GROUP, 1, straggler=True), [])
    resolver.committed()
    written = [decode_admission(r.value) for r in cluster.records(TOPIC)]
    assert [(r.keys, r.reason) for r in written] == [(["run/3"], "incomplete_group")]
    resolver.close()


def test_a_trainer_whose_merge_waits_for_every_partition_is_refused_by_paced_producers():
    """`partition_idle_ms=None` and pacing stop each other for good (a partition without a group, producers
    held): the trainer's mark says so and a paced admit refuses with the rule, before writing anything."""
    from rollout_stream.codec.admission import decode_admission
    from rollout_stream.pacing import TrainerProgressPublisher, UnpaceableTrainer

    cluster = MemoryCluster()
    g = gate(cluster, "p0", n=4)
    try:
        g.admit(0, timeout=5)  # a trainer that waits on nothing yet: admitted
        publisher = TrainerProgressPublisher(Connection("memory:9092"), "train-data.progress", "trainer",
                                             groups_per_batch=2, max_weight_staleness=None,
                                             admission_topic=TOPIC, client=MemoryClient(cluster),
                                             waits_for_every_partition=True)
        try:
            publisher.resumed(0)  # a reader's first mark says where it resumed
            publisher.weight_version(0, 0)
            deadline = time.monotonic() + 5
            while not g.follower.read(g._unpaceable) and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            publisher.close()
        written = len(cluster.records(TOPIC))
        with pytest.raises(UnpaceableTrainer, match="partition_idle_ms=None") as refused:
            g.admit(0, timeout=5)
        assert isinstance(refused.value, ConfigurationError)
        assert len(cluster.records(TOPIC)) == written  # no request: nothing to cancel or count
        assert any(getattr(decode_admission(r.value), "waits_for_every_partition", False)
                   for r in cluster.records(TOPIC) if r.value)
    finally:
        g.close()
