"""The rollout workers' producer helper: encodes samples and keys them by prompt group (docs/spec.md §4.1)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import replace
from typing import Any

import msgspec

from rollout_stream.clients import MAX_RECORD_BYTES, Connection, default_client
from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.codec.chunks import CHUNK_HEADER, DEFAULT_CHUNK_BYTES, split
from rollout_stream.core.pacing import Admission, PacingLimits
from rollout_stream.kafka import Client, SendFuture, Written, check_connection, client_for
from rollout_stream.names import admission_topic, progress_topic
from rollout_stream.pacing import AdmissionGate, PacingError, PacingStats
from rollout_stream.security import SecuritySettings
from rollout_stream.topics import require_topics

__all__ = ["PacingError", "RolloutProducer", "numbered_group"]


class RolloutProducer:
    """Send rollout samples so that a whole prompt group lands in one partition.

    >>> with RolloutProducer("localhost:9092", topic="rollouts") as p:
    ...     p.send(Sample(group_index=0, index=0, rollout_id=0, reward=1.0, group_size=4))

    Paced to a trainer (docs/pacing.md): call `admit(weight_version)` before generating each prompt group.

    >>> with RolloutProducer("localhost:9092", trainer_group_id="trainer", max_policy_lag=1,
    ...                      max_unconsumed_groups=64) as p:
    ...     p.admit(version, timeout=600)   # waits while the group would arrive too stale
    ...     p.send_many(generate(prompt, weights=version))
    """

    def __init__(self, bootstrap_servers: str | Connection, topic: str = "rollouts", *,
                 security: SecuritySettings | None = None, check: bool = True, client: str | None = None,
                 trainer_group_id: str | None = None, train_data_topic: str = "train-data",
                 max_policy_lag: int | None = None, max_unconsumed_groups: int | None = None,
                 versions_per_batch: int = 1, producer_id: str | None = None,
                 trainer_stale_after_s: float = 60.0, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 kafka_client: Client | None = None, **producer_settings: Any) -> None:
        """`bootstrap_servers`: an address, or a Connection (address and TLS/SASL settings); `security`
        applies to an address (e.g. SecuritySettings.from_env()); `client` picks the Kafka client library
        (confluent or kafka-python; default: $ROLLOUT_STREAM_CLIENT, else confluent).

        Fails at once, naming what is wrong, where kafka-python would block for its max_block_ms on the first
        send: BrokerUnreachable (no server at the address), ConnectionCheckFailed (TLS/SASL refused; skipped
        with `check=False` when the caller has just checked), MissingTopic (`topic` does not exist).

        Pacing (docs/pacing.md): with `max_policy_lag` k and/or `max_unconsumed_groups` n, `admit()` waits
        while a new group would be more than k weight versions behind trainer group `trainer_group_id` when
        consumed, or while n groups are admitted and not yet consumed (this producer's and the other paced
        producers' of that trainer group). `train_data_topic` names the trainer's topic (its progress topic
        is derived from it); `versions_per_batch`: how far the trainer's version moves per batch at most;
        `producer_id`: this producer's name on the progress topic (default: random); a trainer whose
        progress is older than `trainer_stale_after_s` is reported as stale.

        `kafka_client`: the seam's client to use instead of the one `client` names (tests: the in-memory
        cluster; the topic is then not looked up first).

        A sample whose encoding is larger than `chunk_bytes` goes out as chunk records of its key, which the
        stage reassembles (docs/chunks.md); the default fits a cluster's default 1 MiB message.max.bytes.
        """
        if chunk_bytes < 1024:
            raise ValueError(f"chunk_bytes must be at least 1024, not {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        limits = PacingLimits(max_policy_lag, max_unconsumed_groups, versions_per_batch)
        if limits.active and not trainer_group_id:
            raise ValueError("max_policy_lag and max_unconsumed_groups pace to a trainer: "
                             "give trainer_group_id")
        self.topic = topic
        if isinstance(bootstrap_servers, Connection):
            conn = replace(bootstrap_servers, client_id="rollout-stream-producer",
                           client=client or bootstrap_servers.client)
        else:
            conn = Connection(bootstrap_servers, client_id="rollout-stream-producer",
                              security=security or SecuritySettings(), client=client or default_client())
        if check:
            check_connection(conn)
        if kafka_client is None:
            require_topics(conn, {topic: ""},
                           hint="create it with `rollout-stream topics create` (check the name for a typo)")
        self._producer = (kafka_client or client_for(conn)).producer(
            client_id=conn.client_id,
            max_record_bytes=producer_settings.pop("max_record_bytes", MAX_RECORD_BYTES),
            **producer_settings,
        )
        self.gate: AdmissionGate | None = None
        if limits.active:
            assert trainer_group_id is not None
            self.gate = AdmissionGate(conn, topic=topic, admission_topic=admission_topic(train_data_topic),
                                      progress_topic=progress_topic(train_data_topic),
                                      trainer_group=trainer_group_id, limits=limits, producer_id=producer_id,
                                      stale_after_s=trainer_stale_after_s)

    # ---- pacing ------------------------------------------------------------------------------------
    def admit(self, weight_version: int, timeout: float | None = None) -> Admission:
        """Wait until a prompt group generated at `weight_version` may start, and count it (docs/pacing.md).

        Raises PacingTimeout after `timeout` seconds without room (the message says whether the trainer is
        stale, silent, or just behind), WeightsTooOld when the version is too old to ever be admitted.
        Without pacing limits it admits at once.
        """
        if self.gate is None:
            return Admission(None, 0, None)
        return self.gate.admit(int(weight_version), timeout)

    def can_admit(self, weight_version: int) -> bool:
        """Whether `admit(weight_version)` would return at once (it does not count the group)."""
        return self.gate is None or self.gate.can_admit(int(weight_version))

    @property
    def pacing(self) -> PacingStats | None:
        """Admissions and time spent waiting in `admit` (None without pacing)."""
        return None if self.gate is None else self.gate.stats

    def send(self, sample: Sample, *, timestamp_ms: int | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> SendFuture:
        """Encode and send one sample; its outcome is known after `flush()`. A send the client already knows
        failed (e.g. no Write ACL on the topic) raises at once: samples are never dropped silently."""
        key = group_key(sample)
        if self.gate is not None:
            self.gate.before_send(key)  # a new group takes its admission and is named in the log first
        future = self._send(key, encode_sample(sample), timestamp_ms, headers)
        if self.gate is not None:
            self.gate.after_send(key, sample, future)  # whole at the stage once every record is acknowledged
        return future

    def send_raw(
        self, key: bytes | None, value: bytes | None, *, timestamp_ms: int | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> SendFuture:
        """Send bytes as they are, never chunked (tests, replays, fault injection)."""
        return self._producer.send(self.topic, value, key, timestamp_ms=timestamp_ms, headers=headers)

    def _send(self, key: bytes, value: bytes, timestamp_ms: int | None,
              headers: list[tuple[str, bytes]] | None) -> SendFuture:
        if len(value) <= self.chunk_bytes:
            return self._producer.send(self.topic, value, key, timestamp_ms=timestamp_ms, headers=headers)
        return _Chunks([self._producer.send(self.topic, part, key, timestamp_ms=timestamp_ms,
                                            headers=[*(headers or ()), (CHUNK_HEADER, header)])
                        for header, part in split(value, self.chunk_bytes)])

    def send_group(self, samples: Iterable[Sample]) -> list[SendFuture]:
        with self.gate.sending() if self.gate is not None else nullcontext():
            samples = list(samples)
            futures = [self.send(s) for s in samples]
            if self.gate is not None:
                self.gate.group_sent(sorted({group_key(s) for s in samples}))
            return futures

    def send_many(self, samples: Iterable[Any], *, group_size: int | None = None,
                  run_id: str | None = None) -> list[SendFuture]:
        """Publish one finished prompt group in one call: `samples` are this package's `Sample`s or miles-like
        samples (objects or dicts, `Sample.from_miles`), all of one `group_index`.

        The streaming fields are filled for the group: each sample's `group_size` where it carries none
        (`group_size`, else the number of rollouts given, by `rollout_id`, else `index`), so a call may
        publish a part of a group whose samples say its whole size; and each rollout's `sibling_count` and
        `sibling_index` in the order given.
        """
        return self.send_group(numbered_group(samples, group_size=group_size, run_id=run_id))

    def flush(self, timeout: float | None = None) -> None:
        self._producer.flush(timeout=timeout)
        if self.gate is not None:
            self.gate.flushed()

    def close(self, timeout: float | None = None) -> None:
        try:
            self._producer.close(timeout=timeout)
        finally:
            if self.gate is not None:
                self.gate.close()

    def __enter__(self) -> RolloutProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()
        self.close()


class _Chunks:
    """The sends of one sample's chunk records as one SendFuture: done when all are, failed when one is."""

    def __init__(self, futures: list[SendFuture]) -> None:
        self.futures = futures

    def done(self) -> bool:
        return all(f.done() for f in self.futures)

    def exception(self) -> BaseException | None:
        return next((e for f in self.futures if (e := f.exception()) is not None), None)

    def get(self, timeout: float | None = None) -> Written:
        """Where the first chunk was written, once every chunk is acknowledged (within `timeout` for all)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        written = [f.get(None if deadline is None else max(0.0, deadline - time.monotonic()))
                   for f in self.futures]
        return written[0]


def numbered_group(samples: Iterable[Any], *, group_size: int | None = None,
                   run_id: str | None = None) -> list[Sample]:
    """One prompt group with its streaming fields set (see `RolloutProducer.send_many`)."""
    group = [s if isinstance(s, Sample) else Sample.from_miles(s) for s in samples]
    if not group:
        raise ValueError("send_many needs at least one sample")
    if len({s.group_index for s in group}) != 1 or group[0].group_index is None:
        raise ValueError(
            "send_many publishes one prompt group: group_index values "
            f"{sorted({str(s.group_index) for s in group})}"
        )
    siblings: dict[object, list[int]] = {}
    for row, s in enumerate(group):
        key = s.rollout_id if s.rollout_id is not None else (s.index if s.index is not None else ("row", row))
        siblings.setdefault(key, []).append(row)
    size = group_size if group_size is not None else len(siblings)
    out: list[Sample] = [group[0]] * len(group)
    for rows in siblings.values():
        for position, row in enumerate(rows):
            s = group[row]
            out[row] = msgspec.structs.replace(
                s, group_size=s.group_size if s.group_size is not None else size, sibling_count=len(rows),
                sibling_index=position, run_id=run_id if run_id is not None else s.run_id)
    return out

