"""Checkpoint records on the admission log (rollout_stream.pacing.checkpoints): a state split into parts is
found and joined again, one that cannot be loaded is passed over for an older one; on the in-memory cluster
and on the real broker."""

from __future__ import annotations

import pytest

from rollout_stream.clients import Connection
from rollout_stream.codec.admission import Checkpoint, Dataset, Renew
from rollout_stream.core.checkpoint import FOLD_VERSION, dump_fold
from rollout_stream.core.prompts import PromptLog
from rollout_stream.kafka import client_for
from rollout_stream.kafka.memory import MemoryClient, MemoryCluster
from rollout_stream.pacing import AdmissionWriter, ensure_admission_topic
from rollout_stream.pacing import checkpoints as checkpoints_module
from rollout_stream.pacing.checkpoints import newest_fold, take_checkpoint

LOG = "train-data.admission"


def fold_of(records: int, prompts: int = 5_000) -> PromptLog:
    fold = PromptLog()
    fold.apply(0, 0, Dataset(source="big", prompts=prompts, fingerprint="f", seed=1, epochs=1))
    for offset in range(1, records):
        fold.apply(offset, offset, Renew(producer=f"p{offset % 3}", session="s"))
    return fold


def write(writer: AdmissionWriter, records: list[object]) -> None:
    for record in records:
        writer.append(record)  # type: ignore[arg-type]


def memory_log() -> tuple[MemoryCluster, AdmissionWriter]:
    cluster = MemoryCluster()
    cluster.create_topic(LOG, 1)
    return cluster, AdmissionWriter(Connection("memory:9092"), LOG, MemoryClient(cluster))


def test_a_state_larger_than_a_record_travels_in_parts_and_is_joined_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoints_module, "WINDOW", 5)  # the parts straddle the windows read backwards
    cluster, writer = memory_log()
    fold = fold_of(4)
    write(writer, [Dataset(source="big", prompts=5_000, fingerprint="f", seed=1, epochs=1)]
          + [Renew(producer="p", session="s")] * 3)
    parts = take_checkpoint(fold, part_bytes=64)
    assert len(parts) > 3 and {p.parts for p in parts} == {len(parts)}
    for part in parts:  # other parties' records between them
        write(writer, [part, Renew(producer="p", session="s")])
    found = newest_fold(MemoryClient(cluster), LOG)
    assert found.next_offset == 4 and dump_fold(found) == dump_fold(fold)


def test_a_checkpoint_missing_a_part_or_of_another_version_is_passed_over_for_an_older_one() -> None:
    cluster, writer = memory_log()
    write(writer, [Dataset(source="big", prompts=5_000, fingerprint="f", seed=1, epochs=1)]
          + [Renew(producer=f"p{i % 3}", session="s") for i in range(1, 4)])
    older = fold_of(4)
    write(writer, take_checkpoint(older, part_bytes=64))
    newer = take_checkpoint(fold_of(6), part_bytes=64)
    write(writer, newer[:-1])  # its writer died before the last part
    write(writer, [Checkpoint(through=7, fold_version=FOLD_VERSION + 1, state=b"from a newer fold")])
    found = newest_fold(MemoryClient(cluster), LOG)
    assert dump_fold(found) == dump_fold(older)


def test_parts_on_the_broker(kafka_bootstrap: str, topic_factory) -> None:  # type: ignore[no-untyped-def]
    conn = Connection(kafka_bootstrap)
    topic = topic_factory(prefix="checkpoint-parts") + ".admission"
    ensure_admission_topic(conn, topic)
    writer = AdmissionWriter(conn, topic)
    try:
        fold = fold_of(4, prompts=1_000_000)
        write(writer, [Dataset(source="big", prompts=1_000_000, fingerprint="f", seed=1, epochs=1)]
              + [Renew(producer=f"p{i % 3}", session="s") for i in range(1, 4)])
        parts = take_checkpoint(fold, part_bytes=100)
        write(writer, parts)
        found = newest_fold(client_for(conn), topic)
        assert len(parts) > 1 and dump_fold(found) == dump_fold(fold)
    finally:
        writer.close()
