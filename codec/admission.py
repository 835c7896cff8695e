"""Admission-log records: one single-partition topic per train-data topic, `<train-data>.admission`.

Every paced producer appends its requests here and every party folds the log from its start with the same
pure rule (`rollout_stream.core.admission`), so all of them reach the same decision on every request without a
coordinator: the log's order is the agreement (docs/pacing.md). An admitted group is named by the offset of
the request that admitted it until it is sent, then by its group key (`run_id/group_index`), which is what
the stage and the trainer see.
"""

from __future__ import annotations

import msgspec

__all__ = ["AdmissionRecord", "Cancel", "Checkpoint", "Dataset", "Delivered", "Hello", "Release", "Renew",
           "Request", "Resolved", "Sent", "TrainerMark", "decode_admission", "encode_admission"]


class Hello(msgspec.Struct, kw_only=True, tag="hello", tag_field="type"):
    """A producer process starts `session`: any earlier session of the same producer id has ended."""

    producer: str
    session: str
    schema_version: int = 1


class Request(msgspec.Struct, kw_only=True, tag="request", tag_field="type"):
    """May one group start at `weight_version`? The limits travel with it, so every party judges it alike."""

    producer: str
    session: str
    trainer: str  # the trainer group whose batches the group is for
    weight_version: int
    max_policy_lag: int | None
    max_unconsumed_groups: int | None
    versions_per_batch: int = 1
    # a prompt source's take (docs/loop.md): admitted, the request carries the next prompt of dataset `source`
    source: str | None = None
    schema_version: int = 1


class Cancel(msgspec.Struct, kw_only=True, tag="cancel", tag_field="type"):
    """The producer stopped waiting for `request`: whichever of grant and cancel is first in the log wins."""

    producer: str
    session: str
    request: int
    schema_version: int = 1


class Sent(msgspec.Struct, kw_only=True, tag="sent", tag_field="type"):
    """The group admitted by `request` is named `key` and its first record is about to be sent."""

    producer: str
    session: str
    request: int
    key: str
    schema_version: int = 1


class Delivered(msgspec.Struct, kw_only=True, tag="delivered", tag_field="type"):
    """Every record of the group admitted by `request` is acknowledged: it is whole at the stage. Until
    then, a producer that stops renewing its lease leaves a group that can never complete."""

    producer: str
    session: str
    request: int
    schema_version: int = 1


class Renew(msgspec.Struct, kw_only=True, tag="renew", tag_field="type"):
    """The session is alive (about once a second)."""

    producer: str
    session: str
    schema_version: int = 1


class Release(msgspec.Struct, kw_only=True, tag="release", tag_field="type"):
    """Admitted groups that will never be sent (`requests`), or the whole session (None: closed).

    With `error` the producer failed while it held `requests` (`Type: message` of the exception): a prompt
    source's attempt ends as failed and counts (docs/loop.md); without it a prompt's attempt is given back
    free. A fold that predates the field reads a plain release."""

    producer: str
    session: str
    requests: list[int] | None = None
    schema_version: int = 1
    error: str | None = None


class Resolved(msgspec.Struct, kw_only=True, tag="resolved", tag_field="type"):
    """Groups the stage dead-lettered or dropped (by group key): they will never reach the trainer."""

    keys: list[str]
    reason: str
    schema_version: int = 1


class TrainerMark(msgspec.Struct, kw_only=True, tag="mark", tag_field="type"):
    """Rank 0 of a trainer group: where it is and which admitted groups it has consumed.

    `consumed` maps a batch index to the keys of the groups taken into that batch (trained or skipped);
    `doomed` lists the keys of queued groups certain to be skipped. Both are cumulative since
    `committed_batch`, so a mark that is lost loses nothing. A new `session` is a restarted reader that
    resumed at batch `resumed_from`.
    """

    trainer: str
    session: str
    weight_version: int | None
    batch_version: int | None
    batches: int  # batches taken by this trainer so far (the next batch's index)
    groups_per_batch: int
    max_weight_staleness: int | None
    consumed: dict[int, list[str]] = msgspec.field(default_factory=dict)
    doomed: list[str] = msgspec.field(default_factory=list)
    committed_batch: int | None = None
    resumed_from: int | None = None
    # of the keys in `consumed`, those skipped (stale, invalid, superseded) rather than trained, per batch
    skipped: dict[int, list[str]] = msgspec.field(default_factory=dict)
    # batch -> group key -> [rollouts, loss tokens] that staleness by rollout or token left out of a group
    # that trains
    excluded: dict[int, dict[str, list[int]]] = msgspec.field(default_factory=dict)
    # the reader's merge never passes an empty partition (`partition_idle_ms=None`): it cannot be paced
    waits_for_every_partition: bool = False
    schema_version: int = 1


class Dataset(msgspec.Struct, kw_only=True, tag="dataset", tag_field="type"):
    """A prompt source `source` hands out `prompts` rows (docs/loop.md). The first declaration of a source
    wins; a later one that differs is refused, so every party hands out the same rows in the same order."""

    source: str
    prompts: int
    fingerprint: str  # a digest of the rows: the same name over other data is refused
    seed: int = 0
    epochs: int | None = None  # None: endless
    max_attempts: int = 3
    schema_version: int = 1


class Checkpoint(msgspec.Struct, kw_only=True, tag="checkpoint", tag_field="type"):
    """The whole fold's state after folding every record through offset `through`: a newcomer loads the
    newest one and folds only what follows (`rollout_stream.core.checkpoint`).

    A state too large for one record travels as `parts` records, each with the slice `part` of it, in order;
    `digest` (XXH3-128 of the whole state) names the set. A reader that predates the parts reads a part as a
    whole state of a newer fold version, and refuses it."""

    through: int
    fold_version: int
    state: bytes
    schema_version: int = 1
    part: int = 0
    parts: int = 1
    digest: bytes | None = None


AdmissionRecord = (Hello | Request | Cancel | Sent | Delivered | Renew | Release | Resolved | TrainerMark
                   | Dataset | Checkpoint)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(AdmissionRecord)


def encode_admission(record: AdmissionRecord) -> bytes:
    return _encoder.encode(record)


def decode_admission(data: bytes | memoryview) -> AdmissionRecord:
    """Raises msgspec.DecodeError (or ValidationError) for bytes that are not an admission record."""
    return _decoder.decode(data)
