"""End-to-end latency at a given load: a paced rollout producer and a read_committed train-data observer.

Latency of a group = the moment its first train sample is visible to a read_committed consumer of the
output topic − the moment its last member was handed to the producer, both on this process's
monotonic clock. Exactly-once makes outputs visible when their transaction commits, at-least-once when the
broker has them: this is what a trainer reading train-data waits for. A group not visible by the end of the
wait counts with the time waited for it, a lower bound.
"""

from __future__ import annotations

import gc
import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from bench.workloads import Workload, group_records
from rollout_stream.clients import MAX_RECORD_BYTES, Connection
from rollout_stream.kafka import OutgoingRecord, TopicPartition, client_for

__all__ = ["LatencyResult", "percentile", "measure_latency"]


@dataclass(frozen=True, slots=True)
class LatencyResult:
    rate: float  # samples/s offered
    groups: int
    seen: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    seconds: float

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "rate": round(self.rate, 1),
            "groups": self.groups,
            "seen": self.seen,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "max_ms": self.max_ms,
            "seconds": round(self.seconds, 2),
        }


PACE_S = 0.001
"""The shortest sleep of the paced load: the groups due during it are sent together when it ends."""


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


class _Observer(threading.Thread):
    """Records when each group key first shows up in the output topic (read_committed)."""

    def __init__(self, conn: Connection, topic: str) -> None:
        super().__init__(name="bench-latency-observer", daemon=True)
        self.consumer = client_for(conn).assigned_consumer(client_id=conn.client_id,
                                                           max_record_bytes=MAX_RECORD_BYTES,
                                                           fetch_max_wait_ms=10)
        parts = sorted(self.consumer.partitions_for_topic(topic) or ())
        tps = [TopicPartition(topic, p) for p in parts]
        self.consumer.assign(tps)
        self.consumer.seek_to_end(tps)
        for tp in tps:
            self.consumer.position(tp)  # resolve "end" now, before anything is produced
        self.seen: dict[bytes, float] = {}
        self.stop = threading.Event()
        self.ready = threading.Event()  # connected and fetching: groups sent from now on are timed fairly

    def run(self) -> None:
        try:
            warm_until = time.monotonic() + 1.0
            while not self.stop.is_set():
                batch = self.consumer.poll(0.05)
                now = time.monotonic()
                if now >= warm_until:
                    self.ready.set()
                for records in batch.values():
                    for rec in records:
                        if rec.key is not None and rec.key not in self.seen:
                            self.seen[rec.key] = now
        finally:
            self.consumer.close()


def measure_latency(
    conn: Connection,
    input_topic: str,
    output_topic: str,
    w: Workload,
    *,
    rate: float,
    seconds: float,
    run_id: str,
    start_index: int = 1_000_000,
    drain_s: float = 5.0,
    seed: int = 7,
) -> LatencyResult:
    """Offer `rate` samples/s of workload `w` for `seconds`, then report p50/p99 of group latency."""
    if not rate > 0:
        raise ValueError(f"the latency phase needs a positive offered rate, got {rate}")
    spg = w.samples_per_group
    groups = max(4, int(rate * seconds / spg))
    rng = np.random.default_rng(seed)
    # Encoded before the clock starts, so the pacing loop only sends.
    planned = [[OutgoingRecord(input_topic, k, v) for k, v in group_records(w, run_id, start_index + i, rng)]
               for i in range(groups)]
    interval = spg / rate
    # Created first and asked for metadata: the first groups waited for its connection, metadata and
    # producer id, and made the phase's p99 (docs/benchmarks.md).
    producer = client_for(conn).producer(client_id="bench-load", max_record_bytes=MAX_RECORD_BYTES)
    producer.partitions_for(input_topic)
    observer = _Observer(conn, output_topic)
    observer.start()
    # Otherwise the first groups also wait for the observer's own connection and first fetch.
    observer.ready.wait(timeout=15)
    sent: dict[bytes, float] = {}
    # The plan is ~30,000 lists that the collector would otherwise walk in full passes while the clock runs:
    # a pause of this process counted as the tested one's (groups sent late: docs/benchmarks.md).
    gc.collect()
    gc.freeze()  # undone in the finally below
    # Objects made while the clock runs still added up to a full pass now and then: none while the clock
    # runs. A phase allocates a few MB.
    collecting = gc.isenabled()
    gc.disable()
    # This process shares the machine with the one measured, so it spends as little CPU as it can: it sends
    # a group's records with no report each (a record lost shows as its group unseen) and sleeps at least
    # PACE_S rather than once per group (what each saves: docs/benchmarks.md).
    started = time.monotonic()
    try:
        for i, records in enumerate(planned):
            due = started + i * interval
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(max(pause, PACE_S))  # then the groups due meanwhile go at once, each timed as sent
            producer.send_all_in_transaction(records)
            key = records[0].key
            assert key is not None  # every planned group is keyed
            sent[key] = time.monotonic()
        producer.flush(timeout=60)
        deadline = time.monotonic() + drain_s
        # Wait for these groups by key: the observer also sees other keys (a process still working through
        # older input), and counting those ended the wait before the last groups were visible.
        unseen = set(sent)
        while unseen and time.monotonic() < deadline:
            time.sleep(0.05)
            unseen = {k for k in unseen if k not in observer.seen}
    finally:
        observer.stop.set()
        observer.join(timeout=10)
        producer.close(timeout=10)
        if collecting:
            gc.enable()
        gc.unfreeze()
    # A group never seen counts with the time it was waited for, a lower bound of its latency: left out, a
    # stage that fell behind (or a record lost) would improve its own percentiles.
    waited = time.monotonic()
    lat = [(observer.seen.get(k, waited) - t) * 1000 for k, t in sent.items()]
    return LatencyResult(
        rate=rate,
        groups=len(sent),
        seen=sum(k in observer.seen for k in sent),
        p50_ms=_r(percentile(lat, 50)),
        p99_ms=_r(percentile(lat, 99)),
        max_ms=_r(max(lat) if lat else None),
        seconds=time.monotonic() - started,
    )


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
