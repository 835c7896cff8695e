"""Wire format of rollout-stream: msgspec records, packed arrays, reason codes."""

from rollout_stream.codec.arrays import Array, ShapedArray
from rollout_stream.codec.changelog import (
    ClosedGroupEntry,
    PartitionPosition,
    changelog_key,
    decode_changelog,
    encode_changelog,
    parse_changelog_key,
)
from rollout_stream.codec.reasons import DeadLetterReason
from rollout_stream.codec.records import SCHEMA_VERSION, Reward, Sample, TrainSample
from rollout_stream.codec.wire import (
    DecodeError,
    decode_sample,
    decode_train_sample,
    encode_sample,
    encode_train_sample,
    encode_train_samples,
    group_key,
    group_key_of,
)

__all__ = [
    "Array",
    "ClosedGroupEntry",
    "PartitionPosition",
    "changelog_key",
    "decode_changelog",
    "encode_changelog",
    "parse_changelog_key",
    "DeadLetterReason",
    "DecodeError",
    "Reward",
    "SCHEMA_VERSION",
    "Sample",
    "ShapedArray",
    "TrainSample",
    "decode_sample",
    "decode_train_sample",
    "encode_sample",
    "encode_train_sample",
    "encode_train_samples",
    "group_key",
    "group_key_of",
]
