"""rollout_stream.worker.delivery: what an exactly-once transaction keeps of each send; its changelog
writes."""

from __future__ import annotations

from rollout_stream.core.records import InputRecord
from rollout_stream.worker.delivery import ChangelogWrite, inputs_of
from rollout_stream.worker.outputs import OutputRecord


def _out(partition: int, offset: int) -> OutputRecord:
    source = InputRecord("rollouts", partition, offset, 0, b"k", b"v")
    return OutputRecord("train-data", b"k", b"x", (), source)


def test_a_groups_outputs_are_one_partitions_offsets_in_order() -> None:
    assert inputs_of([_out(2, 7), _out(2, 3), _out(2, 9)]) == {2: [7, 3, 9]}


def test_outputs_of_several_partitions_are_split_by_partition() -> None:
    assert inputs_of([_out(0, 1), _out(1, 5), _out(0, 2)]) == {0: [1, 2], 1: [5]}


def test_a_changelog_write_is_an_outgoing_record_without_headers() -> None:
    write = ChangelogWrite("changelog", 1, b"key", None)
    assert (write.topic, write.partition, write.key, write.value, write.headers) == (
        "changelog", 1, b"key", None, ())
