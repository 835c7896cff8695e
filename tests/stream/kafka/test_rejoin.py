"""The guard against kafka-python's dropped joins: rejoin only after a whole quiet period without
partitions."""

from __future__ import annotations

from rollout_stream.kafka.kafka_python import RejoinWatchdog


class _Consumer:
    def __init__(self) -> None:
        self.partitions: set[int] = set()
        self.calls: list[tuple] = []

    def assignment(self) -> set[int]:
        return self.partitions

    def unsubscribe(self) -> None:
        self.calls.append(("unsubscribe",))

    def subscribe(self, topics: list[str], listener: object = None) -> None:  # kafka-python's signature
        self.calls.append(("subscribe", tuple(topics), listener))


def test_rejoins_after_the_quiet_period_and_then_waits_a_whole_one_again() -> None:
    consumer, listener = _Consumer(), object()
    dog = RejoinWatchdog(consumer, "rollouts", 30.0, listener)
    assert dog.check(0.0) is None and dog.check(29.9) is None and consumer.calls == []
    assert dog.check(30.0) == 30.0
    assert consumer.calls == [("unsubscribe",), ("subscribe", ("rollouts",), listener)]
    assert dog.check(59.9) is None and dog.check(60.0) == 30.0 and len(consumer.calls) == 4


def test_any_assignment_resets_the_clock() -> None:
    consumer = _Consumer()
    dog = RejoinWatchdog(consumer, "rollouts", 10.0)
    dog.check(0.0)
    consumer.partitions = {0}
    assert dog.check(9.0) is None
    consumer.partitions = set()
    assert dog.check(15.0) is None and dog.check(24.0) is None  # the quiet period restarted at 15
    assert dog.check(11.0 + 15.0) == 11.0
    assert dog.check(100.0, assigned=True) is None and dog.unassigned_since is None
    assert consumer.calls[-1] == ("subscribe", ("rollouts",), None)


def test_partitions_revoked_and_never_assigned_again_count_as_none() -> None:
    consumer = _Consumer()
    consumer.partitions = {0, 1, 2}  # kafka-python lists revoked partitions until the next join completes
    dog = RejoinWatchdog(consumer, "rollouts", 30.0)
    assert dog.check(0.0) is None and dog.unassigned_since is None
    dog.revoked = True
    assert dog.check(1.0) is None and dog.check(30.9) is None
    assert dog.check(31.0) == 30.0 and consumer.calls[0] == ("unsubscribe",)
    dog.revoked = False  # assigned again
    assert dog.check(70.0) is None and dog.unassigned_since is None
