"""Encoding and decoding of wire records with reusable msgspec encoder/decoder objects."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from rollout_stream.codec import compiled
from rollout_stream.codec.arrays import array_dec_hook, array_enc_hook, array_ext_hook
from rollout_stream.codec.records import SCHEMA_VERSION, Sample, TrainSample

__all__ = [
    "DecodeError",
    "encode_sample",
    "decode_sample",
    "encode_train_sample",
    "encode_train_samples",
    "decode_train_sample",
    "group_key",
    "group_key_of",
]


class DecodeError(ValueError):
    """Bytes that are not a valid record of a known schema version; `message` is msgspec's text.

    `not_a_record`: the bytes as a whole are not one (not MessagePack, or not a map of its fields at the top),
    as opposed to a record with a field msgspec refused (its text then names the field: `- at `$.tokens``).
    """

    def __init__(self, message: str, *, not_a_record: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.not_a_record = not_a_record


_encoder = msgspec.msgpack.Encoder(enc_hook=array_enc_hook)
_sample_decoder = msgspec.msgpack.Decoder(Sample, dec_hook=array_dec_hook, ext_hook=array_ext_hook)
_train_decoder = msgspec.msgpack.Decoder(TrainSample, dec_hook=array_dec_hook, ext_hook=array_ext_hook)


def _decode(decoder: msgspec.msgpack.Decoder[Any], data: bytes | memoryview) -> object:
    try:
        record = decoder.decode(data)
    except msgspec.DecodeError as exc:
        # msgspec's text names the path of a refused field; without one, the top-level value was refused
        text = str(exc)
        raise DecodeError(text, not_a_record=" - at `$" not in text) from exc
    except (ValueError, TypeError, OverflowError) as exc:
        # Raised by our ext/dec hooks (bad array payloads); msgspec wraps some, not all.
        raise DecodeError(f"{type(exc).__name__}: {exc}") from exc
    except RecursionError as exc:
        # msgspec raises RecursionError for deeply nested input (e.g. 100k nested arrays in metadata).
        raise DecodeError(f"RecursionError: {exc}") from exc
    _check_version(record.schema_version, "")
    if isinstance(record, TrainSample):
        # The embedded sample comes from the producer: a newer one must not pass as a known version.
        _check_version(record.sample.schema_version, " at `$.sample`")
    return record


def _check_version(version: int, where: str) -> None:
    if version < 1 or version > SCHEMA_VERSION:
        raise DecodeError(
            f"unsupported schema_version {version}{where} (this stage reads 1..{SCHEMA_VERSION})"
        )


def encode_sample(sample: Sample) -> bytes:
    return _encoder.encode(sample)


def decode_sample(data: bytes | memoryview) -> Sample:
    """Decode a rollout sample; raises DecodeError."""
    return _decode(_sample_decoder, data)  # type: ignore[return-value]


def encode_train_sample(sample: TrainSample, raw_sample: bytes | None = None) -> bytes:
    """Encode a train sample; `raw_sample` (the original input bytes) is embedded verbatim when given.

    Embedding the original bytes keeps the rollout sample unchanged, including fields a newer
    producer added that this stage does not know.
    """
    if raw_sample is not None:
        sample = msgspec.structs.replace(sample, sample=msgspec.Raw(raw_sample))
    return _encoder.encode(sample)


# A group's train samples differ only in these fields (encode_train_samples). msgspec writes the tag first,
# then the fields in their order: the sample and both rewards before any group field, the source offset
# right before the last one, and a float always as a float64.
_PER_SAMPLE = ("sample", "raw_reward", "reward", "source_offset")
_TRAIN_FIELDS = tuple(f.name for f in msgspec.structs.fields(TrainSample))
assert _TRAIN_FIELDS[:4] == ("schema_version", *_PER_SAMPLE[:3])
assert _TRAIN_FIELDS[-2:] == ("source_offset", "stage_version")
_SAMPLE_KEY, _RAW_REWARD_KEY, _REWARD_KEY = (_encoder.encode(name) for name in _PER_SAMPLE[:3])
_ZERO_REWARDS = _RAW_REWARD_KEY + _encoder.encode(0.0) + _REWARD_KEY + _encoder.encode(0.0)
_EMPTY = msgspec.Raw(b"")

# The train records of a group from one template, in C (codec/_train_values.c); None where it is not built
# or the Python path was asked for (codec/compiled.py).
_native_train_values: Callable[[tuple[bytes, bytes, bytes, bytes, bytes], list[bytes], list[float],
                                list[float], list[int]], list[bytes] | None] | None
try:
    from rollout_stream.codec._train_values import train_values as _native_train_values
except ImportError:  # not built: no C compiler when the package was installed
    _native_train_values = None
if not compiled.enabled():
    _native_train_values = None


def _train_pieces(shared: TrainSample) -> tuple[bytes, bytes, bytes, bytes, bytes]:
    """(head, raw_reward key, reward key, middle, tail): `shared`'s bytes around its per-sample values, cut
    from msgspec's encoding of it with an empty sample, 0.0 rewards and source offset 0 (one byte)."""
    whole = _encoder.encode(msgspec.structs.replace(shared, sample=_EMPTY, raw_reward=0.0, reward=0.0,
                                                    source_offset=0))
    head_end = whole.index(_SAMPLE_KEY + _ZERO_REWARDS) + len(_SAMPLE_KEY)
    tail = _encoder.encode("stage_version") + _encoder.encode(shared.stage_version)
    middle_end = len(whole) - len(tail) - 1
    assert whole[middle_end:] == b"\x00" + tail
    return (whole[:head_end], _RAW_REWARD_KEY, _REWARD_KEY, whole[head_end + len(_ZERO_REWARDS):middle_end],
            tail)


def encode_train_samples(shared: TrainSample, samples: Sequence[bytes], raw_rewards: Sequence[float],
                         rewards: Sequence[float], offsets: Sequence[int]) -> list[bytes]:
    """`encode_train_sample` of copies of `shared`, one per raw input sample with its raw reward, reward and
    source offset: the same bytes. In C from one template of the shared fields where it is built and the
    rewards are floats; else one struct per sample."""
    if _native_train_values is not None:
        values = _native_train_values(_train_pieces(shared), list(samples), list(raw_rewards), list(rewards),
                                      list(offsets))
        if values is not None:
            return values
    return [encode_train_sample(msgspec.structs.replace(shared, raw_reward=raw, reward=reward,
                                                        source_offset=offset), raw_sample=sample)
            for sample, raw, reward, offset in zip(samples, raw_rewards, rewards, offsets, strict=True)]


def decode_train_sample(data: bytes | memoryview) -> TrainSample:
    """Decode a train sample; raises DecodeError."""
    return _decode(_train_decoder, data)  # type: ignore[return-value]


def group_key_of(run_id: str | None, group_index: int) -> str:
    return f"{run_id}/{group_index}" if run_id else str(group_index)


def group_key(sample: Sample) -> bytes:
    """The Kafka key of a sample: its prompt group (`run_id`/`group_index`), docs/spec.md §4.1."""
    if sample.group_index is None:
        raise ValueError("a sample without group_index has no group key")
    return group_key_of(sample.run_id, sample.group_index).encode()
