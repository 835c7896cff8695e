"""The stage's word to the admission log (docs/pacing.md): which admitted groups will never reach the
trainer. A group refused whole (dead-lettered) or kept off train-data by the zero-variance policy holds its
room until someone says so; the worker says it once the commit that decided it has succeeded, so an aborted
transaction, whose groups are decided again after the restore, says nothing.

Written after the commit and outside it: a worker killed between the two loses the record, and the group
holds its room until the log's expiry. Inside the transaction, the record would hold every paced
producer's reading of the log behind the stage's open transaction.
"""

from __future__ import annotations

import logging
import time

from rollout_stream.clients import Connection
from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec.admission import Resolved
from rollout_stream.core.records import DeadLettered, Outcome, Published
from rollout_stream.kafka import Client, KafkaFailure
from rollout_stream.logs import log_event
from rollout_stream.pacing.admission_log import AdmissionWriter
from rollout_stream.worker.outputs import OutputRecord

__all__ = ["SILENT", "AdmissionResolver"]

log = logging.getLogger("rollout_stream.worker")

# Reasons that refuse a whole group. A single record refused (a late member, an undecodable record, a bad
# record after its group was published) says nothing of its group.
_WHOLE_GROUP = {R.SHARED_REWARD_VIOLATION, R.CONFLICTING_DUPLICATE, R.INCOMPLETE_GROUP, R.GROUP_TOO_LARGE}
LOOK_AGAIN_S = 60.0  # how often a worker without an admission log looks whether one was created


class AdmissionResolver:
    def __init__(self, conn: Connection, client: Client, topic: str, output_topic: str) -> None:
        self.conn, self.client, self.topic, self.output_topic = conn, client, topic, output_topic
        self._writer: AdmissionWriter | None = None
        self._looked = -LOOK_AGAIN_S
        self._pending: list[tuple[str, str]] = []  # (group key, reason) decided in the open transaction

    def observe(self, outcome: Outcome, outs: list[OutputRecord]) -> None:
        """One routed outcome and its outputs: a group that will never reach the trainer is noted."""
        if isinstance(outcome, DeadLettered):
            whole = outcome.reason in _WHOLE_GROUP or (outcome.reason is R.INVALID_SAMPLE
                                                       and len(outcome.records) > 1)
            if whole and not outcome.straggler and outcome.group_key is not None:
                self._pending.append((outcome.group_key, outcome.reason.value))
        elif isinstance(outcome, Published) and not any(o.topic == self.output_topic for o in outs):
            self._pending.append((outcome.group_key, "zero_variance"))

    def aborted(self) -> None:
        self._pending = []

    def committed(self) -> None:
        """The transaction that decided them committed: say so, one record per reason."""
        if not self._pending or not self._log_exists():
            self._pending = []
            return
        by_reason: dict[str, list[str]] = {}
        for key, reason in self._pending:
            by_reason.setdefault(reason, []).append(key)
        self._pending = []
        assert self._writer is not None
        try:
            for reason, keys in by_reason.items():
                self._writer.send(Resolved(keys=keys, reason=reason))
        except KafkaFailure as exc:  # the groups hold their room until the log's expiry
            log_event(log, "admission.resolve_failed", logging.WARNING, topic=self.topic,
                      groups=sum(map(len, by_reason.values())), error=f"{type(exc).__name__}: {exc}")

    def _log_exists(self) -> bool:
        if self._writer is not None:
            return True
        now = time.monotonic()
        if now - self._looked < LOOK_AGAIN_S:
            return False
        self._looked = now
        admin = self.client.admin(client_id=self.conn.client_id)
        try:
            if self.topic not in admin.list_topics():  # nothing paced on this train-data topic
                return False
        except KafkaFailure:
            return False  # asked again in a minute
        finally:
            admin.close()
        self._writer = AdmissionWriter(self.conn, self.topic, self.client)
        return True

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class _Silent(AdmissionResolver):
    """Before the worker has its Kafka side: notes nothing."""

    def __init__(self) -> None:
        pass

    def observe(self, outcome: Outcome, outs: list[OutputRecord]) -> None:
        return None

    def aborted(self) -> None:
        return None

    def committed(self) -> None:
        return None

    def close(self) -> None:
        return None


SILENT: AdmissionResolver = _Silent()
