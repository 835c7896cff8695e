"""Train records read by offset, nothing after them fetched: `ByOffsetReader` (the rows of one rank).

The broker answers a fetch with at least one whole record batch, however small the fetch sizes; the stage
writes every train record as a batch of its own when it writes heads. So a consumer with the smallest fetch
sizes, assigned at a record's offset, receives that record and nothing else, provided it is gone from the
partition before its client asks for the next one:

* kafka-python fetches inside poll() alone: a rank's runs of consecutive offsets are read one after another
  by one consumer, with a poll that waits, and the consumer leaves the partition after the run.
* librdkafka fetches on threads of its own, as soon as a partition's local queue is empty. With
  `queued.min.messages` 1 it asks for nothing more of a partition while a record waits in the queue, and then
  only after `fetch.queue.backoff.ms` (BACKOFF_MS): the consumer leaves the partition within that pause, as
  the record is taken. A poll that waits is woken as the record lands and often empties the queue before the
  fetcher looks: the next record (another rank's, mostly) was then on its way. So records are polled for
  without waiting, PATIENT_POLL_S apart (the fetcher has seen each queued by then), one record an assignment.
  The pause also holds a new assignment's first fetch (librdkafka finds the queue not empty as it starts),
  and a seek does not cut it short: a record costs about BACKOFF_MS, so up to READERS consumers fetch side
  by side, and a consumer is not given a partition again while its pause there lasts.

docs/reader.md, "Bytes each rank fetches", has the measurements.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rollout_stream.codec.chunks import chunk_header_of
from rollout_stream.kafka import AssignedConsumer, Client, Polled, TopicPartition

__all__ = ["BACKOFF_MS", "IN_FLIGHT_BYTES", "LARGE_BACKOFF_MS", "LARGE_RECORD_BYTES", "PATIENT_POLL_S",
           "READERS", "ByOffsetReader", "Value", "fetch_tuning"]

Value = tuple[bytes, bytes | None]  # a record's value and its chunk header, if it is a chunk

# librdkafka's pause on a partition after a record is queued: the time the fetcher thread has to take the
# record and leave the partition before the next record is fetched (a thread preempted for a few
# milliseconds on a busy machine must still make it). Taking a record copies it: above LARGE_RECORD_BYTES
# the pause is LARGE_BACKOFF_MS (at 8.6 MB and 15 ms, 4 ranks on 2 vCPUs fetched 1.10-1.21 times the topic).
BACKOFF_MS = 15
LARGE_RECORD_BYTES = 4 << 20
LARGE_BACKOFF_MS = 40
# How often a librdkafka reader polls its consumers while records are on their way.
PATIENT_POLL_S = 0.001
# librdkafka consumers fetching side by side: a record costs about BACKOFF_MS and a round trip, so the records
# of a batch are fetched together.
READERS = 8
# Record bytes fetched side by side at most: taking a record copies it, and records landing together are
# taken one after another; the last must still be taken well within BACKOFF_MS of librdkafka's look at it
# (3 records of 8.6 MB, 8 of 4 MB or less).
IN_FLIGHT_BYTES = 32 << 20


def fetch_tuning(client: str, backoff_ms: int = BACKOFF_MS) -> dict[str, Any]:
    """Consumer settings for reading one record batch a fetch: the smallest fetch sizes (a first batch larger
    than them still comes whole) and, on librdkafka, one message in the local queue (see above)."""
    if client == "confluent":
        return {"max_partition_fetch_bytes": 1, "fetch_max_bytes": 1000, "message.max.bytes": 1000,
                "queued.min.messages": 1, "fetch.queue.backoff.ms": backoff_ms}
    if client == "kafka-python":
        return {"max_partition_fetch_bytes": 1, "fetch_max_bytes": 1, "max_poll_records": 1}
    return {"max_poll_records": 1}  # the in-memory seam: one record per poll


@dataclass
class _Slot:
    """A consumer, its pause (`fetch.queue.backoff.ms`) and, per partition, until when (monotonic) the pause
    there lasts."""

    consumer: AssignedConsumer
    backoff_ms: int
    cool_until: dict[int, float] = field(default_factory=dict)
    job: tuple[int, list[int]] | None = None  # (partition, offsets still to come)


class ByOffsetReader:
    """Reads records by (partition, offset) into a dict, each fetched once and nothing else fetched.

    `client`, `client_id`: the consumers' client and id prefix; `topic`; `max_record_bytes`. `fetched_bytes`
    counts the record bytes received. Used by one thread.
    """

    def __init__(self, client: Client, client_id: str, topic: str, max_record_bytes: int) -> None:
        self.client, self.client_id, self.topic = client, client_id, topic
        self.max_record_bytes = max_record_bytes
        self.patient = client.name == "confluent"
        self.fetched_bytes = 0
        self._slots: dict[int, list[_Slot]] = {}  # by their pause

    def read(self, wanted: dict[int, set[int]], got: dict[tuple[int, int], Value],
             going_on: Callable[[int, list[int]], bool], record_bytes: int = 0) -> bool:
        """Puts the records at `wanted` (partition -> offsets) in `got`. `going_on(partition, pending)`: False
        to stop (then False is returned); it raises past a deadline. `record_bytes`: the largest record
        expected (0: unknown), which bounds how many are fetched side by side."""
        jobs = self._jobs(wanted)
        limit = 1 if not self.patient else max(1, min(READERS, IN_FLIGHT_BYTES // max(record_bytes, 1)))
        pause_ms = LARGE_BACKOFF_MS if record_bytes > LARGE_RECORD_BYTES else BACKOFF_MS
        slots = self._slots.setdefault(pause_ms, [])
        busy: list[_Slot] = []
        try:
            while jobs or busy:
                self._start(jobs, slots, busy, limit)
                took = False
                for slot in busy:
                    assert slot.job is not None
                    partition, pending = slot.job
                    if not going_on(partition, pending):
                        return False
                    polled = slot.consumer.poll(0 if self.patient else 0.1, max_records=1)
                    if not polled:
                        continue
                    took = True
                    pending = self._took(polled, partition, wanted[partition], got, pending)
                    slot.job = (partition, pending)
                    if not pending:  # left at once: polling the others may take longer than the pause
                        slot.consumer.assign([])
                        if self.patient:
                            slot.cool_until[partition] = time.monotonic() + slot.backoff_ms / 1000
                        slot.job = None
                busy = [s for s in busy if s.job is not None]
                if self.patient and not took:
                    time.sleep(PATIENT_POLL_S)
            return True
        finally:
            for slot in busy:
                slot.consumer.assign([])
                slot.job = None

    def close(self) -> None:
        for slots in self._slots.values():
            for slot in slots:
                slot.consumer.close()

    def _jobs(self, wanted: dict[int, set[int]]) -> list[tuple[int, list[int]]]:
        """What one assignment reads: on librdkafka one record, else a run of consecutive offsets."""
        jobs: list[tuple[int, list[int]]] = []
        for partition, offsets in sorted(wanted.items()):
            for offset in sorted(offsets):
                if not self.patient and jobs and jobs[-1][0] == partition and jobs[-1][1][-1] == offset - 1:
                    jobs[-1][1].append(offset)
                else:
                    jobs.append((partition, [offset]))
        return jobs

    def _start(self, jobs: list[tuple[int, list[int]]], slots: list[_Slot], busy: list[_Slot], limit: int
               ) -> None:
        """Hands jobs to idle consumers of `slots` (made as needed, READERS at most), `limit` busy at most,
        each a job of a partition where its pause is over."""
        now = time.monotonic()
        idle = [s for s in slots if s.job is None]
        while jobs and len(busy) < limit:
            slot = next((s for s in idle if any(s.cool_until.get(p, 0) <= now for p, _ in jobs)), None)
            if slot is None:
                if len(slots) >= READERS:
                    return
                slot = self._new_slot(slots)
            else:
                idle.remove(slot)
            i = next(i for i, (p, _) in enumerate(jobs) if slot.cool_until.get(p, 0) <= now)
            partition, offsets = jobs.pop(i)
            slot.consumer.assign_at(TopicPartition(self.topic, partition), offsets[0])
            slot.job = (partition, offsets)
            busy.append(slot)

    def _new_slot(self, slots: list[_Slot]) -> _Slot:
        backoff_ms = next(ms for ms, same in self._slots.items() if same is slots)
        consumer = self.client.assigned_consumer(
            client_id=f"{self.client_id}-{backoff_ms}ms-{len(slots)}", max_record_bytes=self.max_record_bytes,
            **fetch_tuning(self.client.name, backoff_ms))
        slots.append(slot := _Slot(consumer, backoff_ms))
        return slot

    def _took(self, polled: Polled, partition: int, wanted: set[int], got: dict[tuple[int, int], Value],
              pending: list[int]) -> list[int]:
        """Keeps the wanted records of `polled` (of `partition`): the offsets of `pending` still to come."""
        for records in polled.values():
            for rec in records:
                self.fetched_bytes += len(rec.value or b"")
                if rec.offset in wanted and rec.value is not None:
                    got[(partition, rec.offset)] = (rec.value, chunk_header_of(rec.headers))
        return [o for o in pending if (partition, o) not in got]
