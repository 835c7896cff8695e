"""Encoding and decoding of wire records with reusable msgspec encoder/decoder objects."""

from __future__ import annotations

from typing import Any

import msgspec

from codec.arrays import array_dec_hook, array_enc_hook, array_ext_hook
from codec.records import SCHEMA_VERSION, Sample, TrainSample

__all__ = [
    "DecodeError",
    "encode_sample",
    "decode_sample",
    "encode_train_sample",
    "decode_train_sample",
    "group_key",
    "group_key_of",
]


class DecodeError(ValueError):
    """Bytes that are not a valid record of a known schema version; `message` is msgspec's text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_encoder = msgspec.msgpack.Encoder(enc_hook=array_enc_hook)
_sample_decoder = msgspec.msgpack.Decoder(Sample, dec_hook=array_dec_hook, ext_hook=array_ext_hook)
_train_decoder = msgspec.msgpack.Decoder(TrainSample, dec_hook=array_dec_hook, ext_hook=array_ext_hook)


def _decode(decoder: msgspec.msgpack.Decoder[Any], data: bytes | memoryview) -> object:
    try:
        record = decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DecodeError(str(exc)) from exc
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
