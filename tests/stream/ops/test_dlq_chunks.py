"""Chunked values in the dead-letter topic: `dlq` shows, counts and replays them whole.

Pure parts (grouping chunk records into values, decisions, rendering) first; one real-broker round trip.
"""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from kafka import KafkaConsumer, TopicPartition
from rich.console import Console

from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.codec.chunks import CHUNK_HEADER, decode_chunk_header, split
from rollout_stream.core.records import DeadLettered, InputRecord
from rollout_stream.ops.dlq import headers as H
from rollout_stream.ops.dlq.lineage import decide_value
from rollout_stream.ops.dlq.record import DeadLetterRecord
from rollout_stream.ops.dlq.render import list_view, show_document, show_view
from rollout_stream.ops.dlq.stats import DeadLetterStats
from rollout_stream.ops.dlq.values import group_values
from rollout_stream.worker.outputs import dead_letter_records
from tests.stream.ops.test_dlq import NOW, cli, cli_json, produce, replay_topics, s

CHUNK = 1000


def big_sample(gi: int = 1, rid: int = 10) -> Sample:
    return s(gi, rid, 1.0, run="c", prompt="p" * 3400)  # four chunk records of CHUNK bytes


def record(offset: int, value: bytes, headers=(), *, key=b"c/1", reason="incomplete_group"):
    headers = ((H.REASON, reason.encode()), (H.ORIGINAL_TOPIC, b"in"), *headers)
    return DeadLetterRecord(
        topic="dlq", partition=0, offset=offset, timestamp_ms=NOW, key=key, value=value,
        headers=tuple(headers), reason=reason, message="m", group_key=key.decode(), original_topic="in",
        original_partition=0, original_offset=100, original_timestamp_ms=NOW, stage_version="0.1.0",
        failed_at_ms=NOW, replay_count=0, replay_id=None, replayed_from=None,
        chunk=decode_chunk_header(dict(headers)[CHUNK_HEADER]) if CHUNK_HEADER in dict(headers) else None,
    )


def chunk_records(value: bytes, first_offset: int, *, skip=(), step: int = 1) -> list[DeadLetterRecord]:
    return [
        record(first_offset + step * i, part, ((CHUNK_HEADER, header),))
        for i, (header, part) in enumerate(split(value, CHUNK))
        if i not in skip
    ]


def test_chunk_records_group_into_one_value_in_offset_order():
    whole = encode_sample(big_sample())
    chunks = chunk_records(whole, 1, step=2)  # offsets 1, 3, 5, 7: plain records in between
    plain = [record(o, encode_sample(s(2, 20 + o, 0.0, run="c"))) for o in (0, 2, 4, 6, 8)]
    values = group_values(sorted(chunks + plain, key=lambda r: r.offset))
    assert [v.first.offset for v in values] == [0, 1, 2, 4, 6, 8]
    value = values[1]
    assert value.offsets == (1, 3, 5, 7) and value.whole and value.value == whole
    row = value.summary()
    assert (row["offset"], row["rollout"], row["value_bytes"]) == (1, 10, len(whole))
    assert row["chunks"]["count"] == 4 and row["chunks"]["missing"] == [] and row["chunks"]["problem"] is None
    assert values[0].summary() == plain[0].summary()  # a plain record's row as before
    assert "chunks" not in values[0].summary()


def test_missing_chunks_and_a_digest_mismatch_are_said_and_never_decoded():
    whole = encode_sample(big_sample())
    (partial,) = group_values(chunk_records(whole, 0, skip={1, 2}))
    assert not partial.whole and partial.value is None and partial.head() is None
    assert partial.problem() == "2 of 4 chunks present (missing 1, 2)"
    doc = show_document(partial.first, None, [], None, partial)
    assert "sample" not in doc and "decode_error" not in doc and "hex_preview" not in doc
    assert doc["chunks"]["missing"] == [1, 2]
    assert dict(doc["headers"])[CHUNK_HEADER].startswith("chunk 0 of 4")
    console = Console(width=200, record=True)
    console.print(show_view(doc))
    assert "2 of 4 chunks present (missing 1, 2)" in console.export_text()
    console.print(list_view([partial.summary()], 200))
    assert "chunked value, 4 chunks: 2 of 4 chunks present" in console.export_text()

    tampered = chunk_records(whole, 0)
    tampered[2] = dataclasses.replace(tampered[2], value=b"x" * len(tampered[2].value or b""))
    (bad,) = group_values(tampered)
    assert "digest mismatch" in (bad.problem() or "") and bad.value is None


def test_replay_decision_is_one_for_the_whole_value():
    whole = encode_sample(big_sample())
    (value,) = group_values(chunk_records(whole, 0))
    actions = decide_value(value, to=None, max_replays=3, replay_id="rid")
    assert [a.topic for a in actions] == ["in"] * 4 and actions[0].chunks == 4
    for a in actions:
        headers = dict(a.headers)
        assert headers[CHUNK_HEADER] == dict(a.record.headers)[CHUNK_HEADER]
        assert headers[H.REPLAY_ID] == b"rid" and H.REASON not in headers
    (partial,) = group_values(chunk_records(whole, 0, skip={3}))
    refused = decide_value(partial, to=None, max_replays=3, replay_id="rid")
    assert {a.refused for a in refused} == {"chunked value not whole: 3 of 4 chunks present (missing 3)"}
    skipped = decide_value(partial, to=None, max_replays=3, replay_id="rid", replayed_by="earlier-run")
    assert all(a.skipped and a.topic is None for a in skipped)


def test_stats_count_values_and_chunk_records():
    whole = encode_sample(big_sample())
    stats = DeadLetterStats()
    for v in group_values([record(0, b"plain"), *chunk_records(whole, 1)]):
        stats.add_value(v)
    assert (stats.matched, stats.values, stats.chunked_values, stats.chunk_records) == (5, 2, 1, 4)
    assert stats.by_reason == {"incomplete_group": 2}
    assert stats.groups.tallies["c/1"].records == 2


# ---- real broker -------------------------------------------------------------------------------------


def chunked_dead_letters(dlq: str, input_topic: str, sample: Sample, *, skip=()):
    """The worker's dead-letter records of one whole value, re-split into chunk records of CHUNK bytes."""
    value = encode_sample(sample)
    src = InputRecord(input_topic, 0, 100, NOW, group_key(sample), value, (("trace-id", b"t-1"),))
    (out,) = dead_letter_records(DeadLettered(R.SHARED_REWARD_VIOLATION, "test", "c/1", (src,), NOW), dlq)
    return value, [
        msgspec.structs.replace(out, value=part, headers=[*out.headers, (CHUNK_HEADER, header)])
        for i, (header, part) in enumerate(split(value, CHUNK))
        if i not in skip
    ]


def read_raw(bootstrap: str, topic: str, count: int) -> list:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                             enable_auto_commit=False, consumer_timeout_ms=5000)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out = []
        for rec in consumer:
            out.append(rec)
            if len(out) >= count:
                break
        return out
    finally:
        consumer.close()


@pytest.mark.any_client
def test_show_and_replay_a_chunked_value_whole(kafka_bootstrap):
    input_topic, dlq = replay_topics(kafka_bootstrap)
    value, records = chunked_dead_letters(dlq, input_topic, big_sample())
    _, partial = chunked_dead_letters(dlq, input_topic, big_sample(2, 20), skip={1})
    produce(kafka_bootstrap, records + partial)
    args = ("--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", dlq)
    first = read_raw(kafka_bootstrap, dlq, len(records))[0]
    shown = cli_json("show", f"{first.partition}:{first.offset + 2}", *args)  # a middle chunk
    assert shown["offset"] == first.offset and shown["sample"]["rollout_id"] == 10
    assert shown["chunks"]["count"] == 4 and shown["value_bytes"] == len(value)
    listed = cli("list", *args).stdout
    assert "2 record(s)" in listed and "missing 1" in listed

    doc = cli_json("replay", *args, "--rate", "0")
    assert (doc["replayed"], doc["refused"], doc["chunk_records"]) == (1, 1, 4)
    (refused,) = [r for r in doc["records"] if r["action"] == "refused"]
    assert "3 of 4 chunks present (missing 1)" in refused["why"]
    replayed = read_raw(kafka_bootstrap, input_topic, 4)
    assert len(replayed) == 4
    parts = {}
    for rec in replayed:
        headers = dict(rec.headers)
        assert headers[H.REPLAY_ID].decode() == doc["replay_id"] and headers[H.REPLAY_COUNT] == b"1"
        assert headers["trace-id"] == b"t-1" and H.REASON.encode() not in headers
        chunk = decode_chunk_header(headers[CHUNK_HEADER])
        parts[chunk.index] = rec.value
    assert b"".join(parts[i] for i in range(4)) == value
    assert cli_json("replay", *args, "--rate", "0")["replayed"] == 0  # the cursor moved past both
