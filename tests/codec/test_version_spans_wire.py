"""`weight_version_offsets` on the wire: packed integers in their dtype, absent from older records (which
decode unchanged), ignored by older readers; and the group heads' version spans, old and new heads alike."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from rollout_stream.codec import Sample, decode_sample, decode_train_sample, encode_sample
from rollout_stream.codec.group_heads import GroupHead, HeadSample, decode_group_head, encode_group_head
from tests.codec.test_miles_fields import old_records


def _sample(**fields: object) -> Sample:
    base: dict[str, object] = {"group_index": 3, "tokens": [1] * 6, "response_length": 4,
                               "weight_versions": ["3", "5"], "weight_version_offsets": [0, 2]}
    return Sample(**(base | fields))  # type: ignore[arg-type]


def test_the_offsets_round_trip_in_their_dtype() -> None:
    for offsets, dtype in (([0, 2], "<i4"), (np.array([0, 2], dtype="<i8"), "<i8"),
                           (np.array([0, 2], dtype="<u2"), "<u2")):
        back = decode_sample(encode_sample(_sample(weight_version_offsets=offsets)))
        assert back.weight_version_offsets == [0, 2] and back.weight_version_offsets.dtype == np.dtype(dtype)
    assert Sample().weight_version_offsets is None


@pytest.mark.parametrize("name", sorted(old_records()))
def test_records_from_before_the_offsets_decode_without_them(name: str) -> None:
    kind, data = old_records()[name]
    record = decode_sample(data) if kind == "sample" else decode_train_sample(data)
    sample = record if isinstance(record, Sample) else record.sample
    assert sample.weight_version_offsets is None
    assert decode_sample(encode_sample(sample)) == sample


def test_a_reader_that_does_not_know_the_field_ignores_it() -> None:
    class Before(msgspec.Struct, kw_only=True, tag="rollout_sample", tag_field="type"):
        weight_versions: list[str] = []

    assert msgspec.msgpack.decode(encode_sample(_sample()), type=Before).weight_versions == ["3", "5"]


def test_group_heads_carry_the_spans_and_old_heads_decode_without_them() -> None:
    sample = HeadSample(offsets=[1], nbytes=10, source_topic="in", source_partition=0, source_offset=3,
                        weight_versions=["3", "5"], weight_version_offsets=[0, 2], span_loss_tokens=[2, 1])
    head = GroupHead(topic="out", partition=0, group_key="g", rollout_count=1, mean=0.0, std=0.0,
                     zero_variance=True, samples=[sample])
    back = decode_group_head(encode_group_head(head))
    assert back.samples[0].weight_version_offsets == [0, 2] and back.samples[0].span_loss_tokens == [2, 1]

    old = msgspec.msgpack.decode(encode_group_head(head))  # a head of a stage before the spans: fields cut
    old["samples"] = [row[:-2] for row in old["samples"]]
    (was,) = decode_group_head(msgspec.msgpack.encode(old)).samples
    assert (was.weight_version_offsets, was.span_loss_tokens) == (None, None)
    assert was.weight_versions == ["3", "5"]
