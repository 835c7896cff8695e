"""The rollout workers' producer helper: encodes samples and keys them by prompt group (docs/spec.md §4.1)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import msgspec

from codec import Sample, encode_sample, group_key
from stream.clients import MAX_RECORD_BYTES, Connection, default_client
from stream.kafka import SendFuture, check_connection, client_for
from stream.security import SecuritySettings
from stream.topics import require_topics

__all__ = ["RolloutProducer", "numbered_group"]


class RolloutProducer:
    """Send rollout samples so that a whole prompt group lands in one partition.

    >>> with RolloutProducer("localhost:9092", topic="rollouts") as p:
    ...     p.send(Sample(group_index=0, index=0, rollout_id=0, reward=1.0, group_size=4))
    """

    def __init__(self, bootstrap_servers: str | Connection, topic: str = "rollouts", *,
                 security: SecuritySettings | None = None, check: bool = True, client: str | None = None,
                 **producer_settings: Any) -> None:
        """`bootstrap_servers`: an address, or a Connection (address and TLS/SASL settings); `security`
        applies to an address (e.g. SecuritySettings.from_env()); `client` picks the Kafka client library
        (confluent or kafka-python; default: $ROLLOUT_STREAM_CLIENT, else confluent).

        Fails at once, naming what is wrong, where kafka-python would block for its max_block_ms on the first
        send: BrokerUnreachable (no server at the address), ConnectionCheckFailed (TLS/SASL refused; skipped
        with `check=False` when the caller has just checked), MissingTopic (`topic` does not exist).
        """
        self.topic = topic
        if isinstance(bootstrap_servers, Connection):
            conn = replace(bootstrap_servers, client_id="rollout-stream-producer",
                           **({"client": client} if client else {}))
        else:
            conn = Connection(bootstrap_servers, client_id="rollout-stream-producer",
                              security=security or SecuritySettings(), client=client or default_client())
        if check:
            check_connection(conn)
        require_topics(conn, {topic: ""},
                       hint="create it with `rollout-stream topics create` (check the name for a typo)")
        self._producer = client_for(conn).producer(
            client_id=conn.client_id,
            max_record_bytes=producer_settings.pop("max_record_bytes", MAX_RECORD_BYTES),
            **producer_settings,
        )

    def send(self, sample: Sample, *, timestamp_ms: int | None = None,
             headers: list[tuple[str, bytes]] | None = None) -> SendFuture:
        """Encode and send one sample; its outcome is known after `flush()`. A send the client already knows
        failed (e.g. no Write ACL on the topic) raises at once: samples are never dropped silently."""
        return self._producer.send(self.topic, encode_sample(sample), group_key(sample),
                                   timestamp_ms=timestamp_ms, headers=headers)

    def send_raw(
        self, key: bytes | None, value: bytes | None, *, timestamp_ms: int | None = None
    ) -> SendFuture:
        """Send bytes as they are (tests, replays, fault injection)."""
        return self._producer.send(self.topic, value, key, timestamp_ms=timestamp_ms)

    def send_group(self, samples: Iterable[Sample]) -> list[SendFuture]:
        return [self.send(s) for s in samples]

    def send_many(self, samples: Iterable[Any], *, group_size: int | None = None,
                  run_id: str | None = None) -> list[SendFuture]:
        """Publish one finished prompt group in one call: `samples` are this package's `Sample`s or miles-like
        samples (objects or dicts, `Sample.from_miles`), all of one `group_index`.

        The streaming fields are filled for the group: `group_size` (default: the number of rollouts, by
        `rollout_id`, else `index`), and each rollout's `sibling_count` and `sibling_index` in the order
        given.
        """
        group = numbered_group(samples, group_size=group_size, run_id=run_id)
        return [self.send(s) for s in group]

    def flush(self, timeout: float | None = None) -> None:
        self._producer.flush(timeout=timeout)

    def close(self, timeout: float | None = None) -> None:
        self._producer.close(timeout=timeout)

    def __enter__(self) -> RolloutProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()
        self.close()


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
            out[row] = msgspec.structs.replace(
                group[row], group_size=size, sibling_count=len(rows), sibling_index=position,
                run_id=run_id if run_id is not None else group[row].run_id)
    return out

