"""The bench's passthrough on the in-memory seam: what it does at shutdown."""

from __future__ import annotations

import threading

from bench import passthrough
from bench.passthrough import Passthrough
from rollout_stream.clients import Connection
from rollout_stream.kafka import KafkaFailure
from rollout_stream.kafka.memory import MemoryClient, MemoryCluster, MemoryProducer


class _RefusingAbort(MemoryProducer):
    """A producer whose broker refuses the abort at shutdown, as librdkafka's once did ("invalid state")."""

    aborts = 0

    def abort_transaction(self) -> None:
        type(self).aborts += 1
        raise KafkaFailure("abort_transaction: Producer attempted a transactional operation in an invalid "
                           "state")


def test_a_refused_abort_at_shutdown_does_not_fail_the_passthrough(monkeypatch, capsys):
    cluster = MemoryCluster(clock_ms=1_000)
    cluster.create_topic("in", 1)
    cluster.create_topic("out", 1)
    feeder = MemoryProducer(cluster, transactional_id=None)
    for i in range(10):
        feeder.send("in", b"%d" % i, b"k")
    client = MemoryClient(cluster)
    monkeypatch.setattr(client, "producer", lambda **kw: _RefusingAbort(
        cluster, transactional_id=kw.get("transactional_id")))
    monkeypatch.setattr(passthrough, "client_for", lambda conn: client)
    # A commit interval far away: the records read stay in the open transaction until the stop.
    p = Passthrough(Connection("memory:9092"), group_id="g", input_topic="in", output_topic="out",
                    delivery="exactly-once", commit_interval_s=3600, commit_max_records=1 << 20,
                    max_record_bytes=1 << 20)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            p.run()
        except BaseException as exc:  # noqa: BLE001 - the test reports whatever escaped
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    for _ in range(500):
        if p.records_in == 10:
            break
        threading.Event().wait(0.01)
    p.request_stop()
    worker.join(10)
    assert not worker.is_alive() and p.records_in == 10
    assert errors == [] and _RefusingAbort.aborts == 1
    assert "abort at shutdown failed" in capsys.readouterr().err


