"""`rollout-stream dlq …` on the real broker: stats, list, show, replay (lineage, idempotence, bounds).

Pure parts (filters, lineage headers, cursor state, bounded top-N, reward comparison) first, no Kafka.
"""

from __future__ import annotations

import io
import json
import math
import time
import uuid
from collections import Counter
from types import SimpleNamespace

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata
from rich.console import Console
from typer.testing import CliRunner

from rollout_stream.cli import app
from rollout_stream.clients import Connection
from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import Sample, encode_sample, group_key
from rollout_stream.config import WorkerConfig
from rollout_stream.core.records import DeadLettered, InputRecord
from rollout_stream.kafka import client_for
from rollout_stream.kafka.kafka_python import raw_producer
from rollout_stream.ops.dlq import headers as H
from rollout_stream.ops.dlq.cursor import CursorState, cursor_name, resume_state
from rollout_stream.ops.dlq.inspect import compare_rewards, hexdump
from rollout_stream.ops.dlq.lineage import decide
from rollout_stream.ops.dlq.record import DeadLetterRecord, SampleHead
from rollout_stream.ops.dlq.replay import ReplayOptions, run_replay
from rollout_stream.ops.dlq.scan import DeadLetterScanner
from rollout_stream.ops.dlq.selection import Selection, SelectionError, parse_coordinates, parse_time
from rollout_stream.ops.dlq.stats import TopGroups
from rollout_stream.producer import RolloutProducer
from rollout_stream.worker.outputs import DLQ_HEADERS, dead_letter_records
from tests.stream.helpers import new_topics, read_topic, running_worker, train_samples, wait_until

# any client: the dead-letter tools above the seam; the seam's contract tests show each client
pytestmark = pytest.mark.any_client

runner = CliRunner()
NOW = 1_700_000_000_000


def s(gi, rid, reward, *, size=2, sc=1, si=0, run="r", **kw) -> Sample:
    return Sample(
        group_index=gi,
        index=rid,
        rollout_id=rid,
        reward=reward,
        group_size=size,
        sibling_count=sc,
        sibling_index=si,
        run_id=run,
        tokens=[1, 2, 3, 4],
        response_length=2,
        loss_mask=[1, 0],
        rollout_log_probs=[-0.25, -1.5],
        **kw,
    )


def cli(*args: str, ok: bool = True):
    result = runner.invoke(app, ["dlq", *args], env={"COLUMNS": "220"})
    if ok:
        assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr, result.exception)
    return result


def cli_json(*args: str):
    return json.loads(cli(*args, "--json").stdout)


def cli_lines(*args: str) -> list[dict]:
    return [json.loads(line) for line in cli(*args, "--json").stdout.splitlines() if line.strip()]


def fake_record(
    *,
    reason="incomplete_group",
    replay_count=0,
    original_topic="in",
    headers=(),
    offset=7,
    value=b"v",
    key=b"r/1",
    at_ms=NOW,
) -> DeadLetterRecord:
    return DeadLetterRecord(
        topic="dlq",
        partition=2,
        offset=offset,
        timestamp_ms=at_ms,
        key=key,
        value=value,
        headers=tuple(headers),
        reason=reason,
        message="m",
        group_key=key.decode() if key else None,
        original_topic=original_topic,
        original_partition=1,
        original_offset=5,
        original_timestamp_ms=NOW - 10,
        stage_version="0.1.0",
        failed_at_ms=at_ms - 5000,
        replay_count=replay_count,
        replay_id=None,
        replayed_from=None,
    )


# ---- pure ------------------------------------------------------------------------------------------


def test_header_names_match_what_the_worker_writes():
    assert set(H.CARRIED_ON_REPLAY) | set(H.FAILURE_HEADERS) == set(DLQ_HEADERS)
    assert not set(H.CARRIED_ON_REPLAY) & set(H.FAILURE_HEADERS)
    assert not set(H.REPLAY_HEADERS) & set(DLQ_HEADERS)  # replay lineage travels through a re-dead-lettering


@pytest.mark.parametrize(
    "text,expected",
    [
        ("90s", NOW - 90_000),
        ("15m", NOW - 900_000),
        ("2h", NOW - 7_200_000),
        ("1.5d", NOW - 129_600_000),
        ("2023-11-14T22:13:20Z", NOW),
        ("2023-11-14T22:13:20", NOW),
        ("2023-11-14T23:13:20+01:00", NOW),
    ],
)
def test_parse_time(text, expected):
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize("bad", ["yesterday", "2h ago", "-5m", ""])
def test_parse_time_refuses_what_it_cannot_read(bad):
    with pytest.raises(SelectionError):
        parse_time(bad, NOW)


def test_selection_filters_and_cursor_fingerprint():
    sel = Selection.build(reasons=["incomplete_group"], groups=["r/1", "x/*"], since="1h", now_ms=NOW)
    assert sel.matches(fake_record())
    assert sel.matches(fake_record(key=b"x/9"))
    assert not sel.matches(fake_record(key=b"r/2"))
    assert not sel.matches(fake_record(reason="late_member"))
    assert not sel.matches(fake_record(at_ms=NOW - 3_600_001))
    assert sel.matches(
        fake_record(at_ms=NOW - 3_599_999)
    )  # first failed over an hour ago, dead-lettered since
    # The cursor follows the filters as typed: a relative --since names the same cursor an hour later.
    later = Selection.build(
        reasons=["incomplete_group"], groups=["x/*", "r/1"], since="1h", now_ms=NOW + 3_600_000
    )
    assert cursor_name(sel, "dlq", None) == cursor_name(later, "dlq", None)
    assert cursor_name(sel, "dlq", None) != cursor_name(sel, "dlq", "elsewhere")
    assert cursor_name(sel, "dlq", None) != cursor_name(
        Selection.build(groups=["r/1"], now_ms=NOW), "dlq", None
    )
    with pytest.raises(SelectionError, match="unknown --reason"):
        Selection.build(reasons=["nope"], now_ms=NOW)
    with pytest.raises(SelectionError, match="after --until"):
        Selection.build(since="1h", until="2h", now_ms=NOW)
    assert parse_coordinates("3:1234") == (3, 1234)
    with pytest.raises(SelectionError):
        parse_coordinates("3")


def test_replay_decision_headers_and_refusals():
    producer_header = ("trace-id", b"abc")
    dlq_headers = [
        (H.REASON, b"incomplete_group"),
        (H.MESSAGE, b"m"),
        (H.ORIGINAL_TOPIC, b"in"),
        (H.ORIGINAL_PARTITION, b"1"),
        (H.ORIGINAL_OFFSET, b"5"),
        (H.ORIGINAL_TIMESTAMP, b"99"),
        (H.GROUP_KEY, b"r/1"),
        (H.STAGE_VERSION, b"0.1.0"),
        (H.FAILED_AT, b"2023-11-14T22:13:20.000Z"),
        producer_header,
        (H.REPLAY_ID, b"old"),
        (H.REPLAY_COUNT, b"1"),
        (H.REPLAYED_FROM, b"dlq:0:1"),
    ]
    action = decide(fake_record(headers=dlq_headers, replay_count=1), to=None, max_replays=3, replay_id="new")
    assert action.topic == "in" and action.refused is None
    assert list(action.headers) == [
        (H.ORIGINAL_TOPIC, b"in"),
        (H.ORIGINAL_PARTITION, b"1"),
        (H.ORIGINAL_OFFSET, b"5"),
        (H.ORIGINAL_TIMESTAMP, b"99"),
        (H.FAILED_AT, b"2023-11-14T22:13:20.000Z"),
        producer_header,
        (H.REPLAY_ID, b"new"),
        (H.REPLAY_COUNT, b"2"),
        (H.REPLAYED_FROM, b"dlq:2:7"),
    ]
    assert decide(fake_record(), to="other", max_replays=3, replay_id="x").topic == "other"
    refused = decide(fake_record(replay_count=3), to=None, max_replays=3, replay_id="x")
    assert refused.topic is None and refused.refused == "replay count 3 reached --max-replays 3"
    assert decide(fake_record(original_topic=None), to=None, max_replays=3, replay_id="x").refused
    assert decide(fake_record(original_topic="dlq"), to=None, max_replays=3, replay_id="x").refused


def test_cursor_state_round_trip_and_resume():
    running = CursorState("abc", "running", "group r/1")
    assert CursorState.decode(running.encode()) == running
    assert CursorState.decode("") is None and CursorState.decode("{not json") is None
    done = OffsetAndMetadata(5, CursorState("old", "done").encode(), -1)
    assert resume_state({0: done, 1: None}) is None
    assert resume_state({0: done, 1: OffsetAndMetadata(9, running.encode(), -1)}) == running


def test_top_groups_is_exact_until_capacity_then_bounded():
    top = TopGroups(capacity=3)
    for g, n in {"a": 50, "b": 40, "c": 30}.items():
        for _ in range(n):
            top.add(g, "late_member", NOW)
    assert not top.pruned
    for i in range(20):  # many small groups force pruning
        top.add(f"small-{i}", "decode_error", NOW)
    top.add("a", "incomplete_group", NOW - 1)
    assert top.pruned and top.error <= 1
    assert [(g, t.records) for g, t in top.top(3)] == [("a", 51), ("b", 40), ("c", 30)]
    assert top.tallies["a"].reasons == {"late_member", "incomplete_group"}


def test_hexdump_and_reward_comparison():
    lines = hexdump(b"\xc1garbage" + bytes(range(20)), limit=16)
    assert lines[0].startswith("00000000  c1 67 61 72") and lines[0].endswith("|.garbage........|")
    assert lines[-1] == "… 12 more bytes (28 in all)"
    members = [
        (fake_record(offset=o), SampleHead(rollout_id=rid, sibling_index=si, sibling_count=sc, reward=rw))
        for o, rid, si, sc, rw in [(1, 11, 1, 2, 6.0), (2, 12, 0, 1, 1.0), (3, 11, 0, 2, 2.0)]
    ]
    rows = compare_rewards(members)
    assert [(r.rollout, r.consistent, [x[1] for x in r.rewards]) for r in rows] == [
        (11, False, [2.0, 6.0]),
        (12, True, [1.0]),
    ]
    keyed = [
        (
            fake_record(),
            SampleHead(rollout_id=1, sibling_index=i, sibling_count=2, reward={"acc": 1.0, "f": i}),
        )
        for i in range(2)
    ]
    assert compare_rewards(keyed, "acc")[0].consistent and not compare_rewards(keyed)[0].consistent


# ---- on the broker ---------------------------------------------------------------------------------

WORKER_ITEMS = [
    (b"r/50", b"\xc1\x00garbage"),  # decode_error
    s(51, 0, math.nan),
    s(51, 1, 1.0),  # invalid_sample (the whole group)
    s(52, 11, 2.0, sc=2, si=0),
    s(52, 12, 1.0),
    s(52, 11, 6.0, sc=2, si=1),  # shared_reward_violation
    s(53, 0, 1.0, prompt="a"),
    s(53, 0, 1.0, prompt="b"),  # conflicting_duplicate
    s(54, 0, 1.0),  # incomplete_group
    s(55, 0, 1.0),
    s(55, 1, 0.0),
    s(55, 2, 0.5),  # published, then a late_member
]
EXPECTED_REASONS = {
    "decode_error": 1,
    "invalid_sample": 2,
    "shared_reward_violation": 3,
    "conflicting_duplicate": 2,
    "incomplete_group": 1,
    "late_member": 1,
}


def worker_config(bootstrap, topics, **kw) -> WorkerConfig:
    kw.setdefault("group_timeout_s", 2.0)
    kw.setdefault("commit_interval_s", 0.2)
    return WorkerConfig(bootstrap_servers=bootstrap, topics=topics, group_id=f"g-{topics.input}", **kw)


def send(bootstrap, topic, items, *, headers=None):
    with RolloutProducer(bootstrap, topic=topic) as p:
        futures = [p.send(x, headers=headers) if isinstance(x, Sample) else p.send_raw(*x) for x in items]
        p.flush()
        return [f.get(10) for f in futures]


@pytest.fixture(scope="module")
def worker_dlq(kafka_bootstrap):
    """A dead-letter topic written by a real worker: every reason once, on two partitions."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="dlq")
    with running_worker(worker_config(kafka_bootstrap, topics)) as worker:
        send(kafka_bootstrap, topics.input, WORKER_ITEMS)
        wait_until(lambda: sum(worker.stats.dead_lettered.values()) == 10, 30, "10 dead-letters")
    return SimpleNamespace(
        bootstrap=kafka_bootstrap,
        topics=topics,
        args=("--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", topics.dead_letter),
    )


def test_stats_counts_by_reason_top_groups_times_and_partitions(worker_dlq):
    doc = cli_json("stats", *worker_dlq.args, "--top", "3")
    assert doc["matched"] == doc["scanned"] == 10
    assert doc["by_reason"] == EXPECTED_REASONS
    assert doc["by_original_topic"] == {worker_dlq.topics.input: 10}
    assert doc["top_groups"][0] == {
        "group_key": "r/52",
        "records": 3,
        "reasons": ["shared_reward_violation"],
        "first_failed_at": doc["top_groups"][0]["first_failed_at"],
    }
    assert len(doc["top_groups"]) == 3 and doc["top_groups_exact"] and doc["distinct_groups"] == 6
    assert doc["oldest"]["dead_lettered_at"] <= doc["newest"]["dead_lettered_at"]
    assert doc["newest"]["reason"] in ("incomplete_group", "late_member")  # decided last, by the clock
    parts = doc["partitions"]
    assert [p["partition"] for p in parts] == [0, 1]
    assert sum(p["matched"] for p in parts) == 10
    for p in parts:
        assert p["low"] == 0 and p["end"] >= p["matched"]
        if p["matched"]:
            assert 0 <= p["first_matched_offset"] <= p["last_matched_offset"] < p["end"]
    # Filters apply to stats too; a window in the future matches nothing.
    assert cli_json("stats", *worker_dlq.args, "--reason", "late_member")["by_reason"] == {"late_member": 1}
    assert cli_json("stats", *worker_dlq.args, "--since", "2999-01-01")["matched"] == 0
    assert cli_json("stats", *worker_dlq.args, "--until", "2000-01-01")["matched"] == 0
    table = cli("stats", *worker_dlq.args).stdout
    assert "shared_reward_violation" in table and "r/52" in table and "10 dead-letter records" in table


def test_list_with_each_filter(worker_dlq):
    rows = cli_lines("list", *worker_dlq.args, "--limit", "0")
    assert len(rows) == 10
    assert Counter(r["reason"] for r in rows) == EXPECTED_REASONS
    assert rows == sorted(rows, key=lambda r: (r["partition"], r["offset"]))
    shared = [r for r in rows if r["reason"] == "shared_reward_violation"]
    assert {(r["group_key"], r["rollout"], r["sibling_index"]) for r in shared} == {
        ("r/52", 11, 0),
        ("r/52", 12, 0),
        ("r/52", 11, 1),
    }
    assert all(r["original"].startswith(worker_dlq.topics.input + ":") for r in rows)
    assert [r["group_key"] for r in cli_lines("list", *worker_dlq.args, "--reason", "decode_error")] == [
        "r/50"
    ]
    both = cli_lines("list", *worker_dlq.args, "--reason", "late_member", "--reason", "incomplete_group")
    assert sorted(r["group_key"] for r in both) == ["r/54", "r/55"]
    assert {r["reason"] for r in cli_lines("list", *worker_dlq.args, "--group", "r/51")} == {"invalid_sample"}
    assert len(cli_lines("list", *worker_dlq.args, "--group", "r/5[23]")) == 5
    assert len(cli_lines("list", *worker_dlq.args, "--limit", "4")) == 4
    times = sorted({r["dead_lettered_at"] for r in rows})
    newest, oldest = times[-1], times[0]
    recent = cli_lines("list", *worker_dlq.args, "--since", newest)
    early = cli_lines("list", *worker_dlq.args, "--until", oldest)
    assert recent and all(r["dead_lettered_at"] >= newest for r in recent)
    assert early and all(r["dead_lettered_at"] <= oldest for r in early)
    assert len(recent) + len(early) <= 10
    assert cli_lines("list", *worker_dlq.args, "--since", "1m")  # they failed a moment ago
    assert cli_lines("list", *worker_dlq.args, "--until", "1m") == []
    table = cli("list", *worker_dlq.args, "--reason", "shared_reward_violation").stdout
    assert "r/52" in table and "must share one reward" in table and "3 record(s)" in table
    bad = cli("list", *worker_dlq.args, "--reason", "bogus", ok=False)
    assert bad.exit_code == 2 and bad.stderr.startswith("error: unknown --reason bogus")


def test_show_headers_decoded_sample_hex_preview_and_sibling_rewards(worker_dlq):
    rows = cli_lines("list", *worker_dlq.args, "--limit", "0")
    coords = {r["reason"]: f"{r['partition']}:{r['offset']}" for r in rows}
    shared = cli_json("show", coords["shared_reward_violation"], *worker_dlq.args)
    assert {k for k, _ in shared["headers"]} >= set(DLQ_HEADERS)
    assert (
        shared["message"]
        == "all samples in rollout 11 must share one reward; rows [0, 1] have rewards [2.0, 6.0]"
    )
    assert shared["sample"]["group_index"] == 52 and shared["sample"]["tokens"]["length"] == 4
    by_rollout = {r["rollout"]: r for r in shared["sibling_rewards"]}
    assert not by_rollout[11]["consistent"] and by_rollout[12]["consistent"]
    assert [(x["sibling_index"], x["reward"]) for x in by_rollout[11]["rewards"]] == [(0, 2.0), (1, 6.0)]
    assert len(shared["group_members"]) == 3
    table = cli("show", coords["shared_reward_violation"], *worker_dlq.args).stdout
    assert "MISMATCH" in table and "s0=2.0" in table and "s1=6.0" in table and "x-original-offset" in table

    broken = cli_json("show", coords["decode_error"], *worker_dlq.args)
    assert "sample" not in broken and "malformed" in broken["decode_error"]
    assert broken["hex_preview"][0].startswith("00000000  c1 00 67 61 72 62 61 67 65")
    assert "does not decode" in cli("show", coords["decode_error"], *worker_dlq.args).stdout

    invalid = cli_json("show", coords["invalid_sample"], *worker_dlq.args)
    assert len(invalid["group_members"]) == 2 and "sibling_rewards" not in invalid
    missing = cli("show", "0:99999", *worker_dlq.args, ok=False)
    assert missing.exit_code == 1 and "outside" in missing.stderr
    assert cli("show", "zero", *worker_dlq.args, ok=False).exit_code == 2


def test_scan_stops_at_the_end_offsets_seen_at_start(kafka_bootstrap):
    input_topic, dlq = replay_topics(kafka_bootstrap)
    produce(kafka_bootstrap, dlq_records(dlq, [(f"r/{i}", 0, input_topic) for i in range(6)]))
    consumer = client_for(Connection(kafka_bootstrap)).assigned_consumer(client_id="scan-test",
                                                                         max_record_bytes=1 << 20)
    try:
        bar = io.StringIO()
        scanner = DeadLetterScanner(
            consumer, dlq, progress=True, console=Console(file=bar, force_terminal=True)
        )
        plan = scanner.plan()
        assert plan.total == 6
        # Written after the plan: a scan of a busy topic still ends where it was when it began.
        produce(kafka_bootstrap, dlq_records(dlq, [(f"r/{i}", 1, input_topic) for i in range(6)]))
        assert sorted(r.group for r in scanner.records(plan)) == [f"r/{i}" for i in range(6)]
        assert scanner.positions == {r.partition: r.end for r in plan.ranges}
        assert f"scanning {dlq}" in bar.getvalue() and "6/6" in bar.getvalue()  # the progress bar, on stderr
        assert scanner.plan().total == 12
    finally:
        consumer.close()


# ---- replay -----------------------------------------------------------------------------------------


def dlq_records(
    dlq_topic: str,
    members: list[tuple[str, int, str]],
    *,
    reason=R.INCOMPLETE_GROUP,
    replay_count: int | None = None,
):
    """Dead-letter records exactly as the worker writes them: (group key, rollout, input topic) each."""
    out = []
    for i, (gkey, rollout, input_topic) in enumerate(members):
        run, gi = gkey.split("/")
        sample = s(int(gi), rollout, float(rollout % 2), run=run)
        headers = (("trace-id", f"t-{i}".encode()),)
        if replay_count is not None:
            headers += ((H.REPLAY_COUNT, str(replay_count).encode()), (H.REPLAY_ID, b"earlier"))
        src = InputRecord(input_topic, 0, 100 + i, NOW + i, group_key(sample), encode_sample(sample), headers)
        out += dead_letter_records(DeadLettered(reason, "test", gkey, (src,), NOW + i), dlq_topic)
    return out


def produce(bootstrap, records) -> None:
    producer = raw_producer(Connection(bootstrap))
    try:
        for r in records:
            producer.send(r.topic, key=r.key, value=r.value, headers=r.headers)
        producer.flush()
    finally:
        producer.close()


def replay_topics(bootstrap):
    tag = f"rp-{uuid.uuid4().hex[:8]}"
    names = (f"{tag}-in", f"{tag}-dlq")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(n, 2, 1) for n in names])
    finally:
        admin.close()
    return names


def committed_offsets(bootstrap, group_id, topic) -> dict[int, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group_id, enable_auto_commit=False)
    try:
        wait_until(lambda: consumer.partitions_for_topic(topic), 10, "metadata")
        out = {}
        for p in consumer.partitions_for_topic(topic):
            off = consumer.committed(TopicPartition(topic, p))
            if off is not None:
                out[p] = off
        return out
    finally:
        consumer.close()


def test_replay_dry_run_writes_nothing(kafka_bootstrap):
    input_topic, dlq = replay_topics(kafka_bootstrap)
    produce(kafka_bootstrap, dlq_records(dlq, [("r/1", 0, input_topic), ("r/1", 1, input_topic)]))
    args = ("--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", dlq, "--group", "r/1")
    doc = cli_json("replay", *args, "--dry-run")
    assert doc["dry_run"] and doc["replayed"] == 2 and doc["refused"] == 0
    assert {r["action"] for r in doc["records"]} == {"would_replay"}
    assert "dry run: nothing written" in cli("replay", *args, "--dry-run").stdout
    assert read_topic(kafka_bootstrap, input_topic, settle=0.5) == []
    assert committed_offsets(kafka_bootstrap, doc["cursor"], dlq) == {}
    assert cli_json("replay", *args, "--dry-run")["replayed"] == 2  # still all of them


def test_replay_group_with_lineage_and_a_second_identical_replay_publishes_nothing(kafka_bootstrap):
    input_topic, dlq = replay_topics(kafka_bootstrap)
    crafted = dlq_records(dlq, [("r/1", 0, input_topic), ("r/2", 0, input_topic), ("r/1", 1, input_topic)])
    produce(kafka_bootstrap, crafted)
    dlq_reads = {(r.key, r.value): r for r in read_topic(kafka_bootstrap, dlq, min_count=3)}
    args = (
        "--bootstrap-servers",
        kafka_bootstrap,
        "--dead-letter-topic",
        dlq,
        "--group",
        "r/1",
        "--rate",
        "0",
    )
    first = cli_json("replay", *args)
    assert (first["replayed"], first["refused"], first["to_topics"]) == (2, 0, {input_topic: 2})
    published = read_topic(kafka_bootstrap, input_topic, min_count=2)
    assert len(published) == 2
    for rec in published:
        src = dlq_reads[(rec.key, rec.value)]  # original key and value bytes
        assert rec.key == b"r/1"
        h = rec.headers
        assert h[H.REPLAY_ID] == first["replay_id"] and h[H.REPLAY_COUNT] == "1"
        assert h[H.REPLAYED_FROM] == f"{dlq}:{src.partition}:{src.offset}"
        for name in H.CARRIED_ON_REPLAY:
            assert h[name] == src.headers[name]
        assert h["trace-id"] == src.headers["trace-id"]  # producer headers travel along
        assert not set(h) & set(H.FAILURE_HEADERS)
    second = cli_json("replay", *args)
    assert (second["replayed"], second["scanned"]) == (0, 0)
    assert "replayed 0 record(s)" in cli("replay", *args).stdout
    # New dead-letters of the same selection are replayed by the next run, under a new replay id.
    produce(kafka_bootstrap, dlq_records(dlq, [("r/1", 2, input_topic)]))
    third = cli_json("replay", *args)
    assert third["replayed"] == 1 and third["replay_id"] != first["replay_id"]
    assert len(read_topic(kafka_bootstrap, input_topic, min_count=3)) == 3
    # An overlapping selection is a different cursor, but the replay ledger knows r/1 went already.
    wider = (
        "--bootstrap-servers",
        kafka_bootstrap,
        "--dead-letter-topic",
        dlq,
        "--reason",
        "incomplete_group",
    )
    preview = cli_json("replay", *wider, "--dry-run")
    assert (preview["replayed"], preview["already_replayed"]) == (1, 3)
    assert {r["group_key"] for r in preview["records"] if r["action"] == "would_replay"} == {"r/2"}
    assert all(
        r["why"].startswith("by replay ") for r in preview["records"] if r["action"] == "already_replayed"
    )
    assert "3 replayed before" in cli("replay", *wider, "--dry-run").stdout
    assert cli_json("replay", *wider, "--rate", "0")["replayed"] == 1
    published = read_topic(kafka_bootstrap, input_topic, min_count=4)
    assert Counter(r.key for r in published) == {b"r/1": 3, b"r/2": 1}  # each dead-letter record once


def test_max_replays_refuses_with_a_message_and_publishes_nothing(kafka_bootstrap):
    input_topic, dlq = replay_topics(kafka_bootstrap)
    produce(kafka_bootstrap, dlq_records(dlq, [("r/1", 0, input_topic)], replay_count=3))
    produce(kafka_bootstrap, dlq_records(dlq, [("r/2", 0, input_topic)], replay_count=2))
    args = ("--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", dlq, "--rate", "0")
    doc = cli_json("replay", *args)
    assert (doc["replayed"], doc["refused"]) == (1, 1)
    refused = [r for r in doc["records"] if r["action"] == "refused"]
    assert refused[0]["group_key"] == "r/1" and "replay count 3 reached --max-replays 3" == refused[0]["why"]
    published = read_topic(kafka_bootstrap, input_topic, min_count=1)
    assert [(r.key, r.headers[H.REPLAY_COUNT]) for r in published] == [(b"r/2", "3")]
    # With a higher bound the refused record goes, in a selection of its own.
    table = cli("replay", *args, "--group", "r/1", "--max-replays", "4").stdout
    assert "replayed 1 record(s)" in table


def test_rate_limit_is_honoured(kafka_bootstrap):
    input_topic, dlq = replay_topics(kafka_bootstrap)
    produce(kafka_bootstrap, dlq_records(dlq, [(f"r/{i}", 0, input_topic) for i in range(16)]))
    args = ("--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", dlq)
    started = time.monotonic()
    doc = cli_json("replay", *args, "--rate", "10")
    took = time.monotonic() - started
    assert doc["replayed"] == 16
    assert 1.4 <= doc["elapsed_s"] <= took < 15  # 16 records at 10/s: 15 intervals of 0.1 s after the first
    assert doc["transactions"] >= 2  # a transaction closes every second, whatever the rate


def test_interrupted_replay_resumes_under_its_replay_id(kafka_bootstrap, monkeypatch):
    input_topic, dlq = replay_topics(kafka_bootstrap)
    produce(kafka_bootstrap, dlq_records(dlq, [("r/1", i, input_topic) for i in range(5)]))
    conn = Connection(kafka_bootstrap)
    options = ReplayOptions(dlq, Selection.build(groups=["r/1"], now_ms=NOW), rate=0, batch_records=2)
    import rollout_stream.ops.dlq.replay as replay_module

    calls = {"n": 0}
    real_wait = replay_module.RateLimiter.wait

    def crash_on_fourth(self):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt  # Ctrl-C mid-run: the open transaction (record 3) is aborted
        real_wait(self)

    monkeypatch.setattr(replay_module.RateLimiter, "wait", crash_on_fourth)
    with pytest.raises(KeyboardInterrupt):
        run_replay(conn, options, progress=False)
    monkeypatch.setattr(replay_module.RateLimiter, "wait", real_wait)
    first = read_topic(kafka_bootstrap, input_topic, min_count=2)
    assert len(first) == 2  # two committed in the first transaction; the aborted one is invisible
    rest = run_replay(conn, options, progress=False)
    assert rest.resumed and rest.replayed == 3
    published = read_topic(kafka_bootstrap, input_topic, min_count=5)
    assert len(published) == 5 and len({r.value for r in published}) == 5
    assert {r.headers[H.REPLAY_ID] for r in published} == {rest.replay_id}  # one id for the whole group
    assert not run_replay(conn, options, progress=False).resumed


@pytest.mark.kafka(timeout=90)
def test_replay_round_trip_publishes_complete_group_once(kafka_bootstrap):
    """A group times out, its straggler arrives late, both are dead-lettered; replaying the group makes the
    worker publish it once, complete; a second identical replay publishes nothing."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="rt")
    config = worker_config(kafka_bootstrap, topics)
    args = (
        "--bootstrap-servers",
        kafka_bootstrap,
        "--dead-letter-topic",
        topics.dead_letter,
        "--group",
        "r/7",
        "--rate",
        "0",
    )
    with running_worker(config) as worker:
        send(kafka_bootstrap, topics.input, [s(7, 0, 1.0)])
        wait_until(lambda: worker.stats.dead_lettered[R.INCOMPLETE_GROUP] == 1, 20, "the group to time out")
        send(kafka_bootstrap, topics.input, [s(7, 1, 0.0)])
        wait_until(lambda: worker.stats.dead_lettered[R.LATE_MEMBER] == 1, 20, "the straggler dead-lettered")
        dead = read_topic(kafka_bootstrap, topics.dead_letter, min_count=2)
        assert sorted(r.headers[H.REASON] for r in dead) == ["incomplete_group", "late_member"]

        first = cli_json("replay", *args)
        assert first["replayed"] == 2
        wait_until(
            lambda: worker.stats.groups_published >= 1 or sum(worker.stats.dead_lettered.values()) > 2,
            20,
            "the replayed group to be resolved",
        )
        second = cli_json("replay", *args)
        assert second["replayed"] == 0
        time.sleep(2 * config.group_timeout_s)  # time for any duplicate or timeout to show up
    train = train_samples(read_topic(kafka_bootstrap, topics.output, min_count=2))
    assert [(t.group_key, t.sample.rollout_id) for t in train] in (
        [("r/7", 0), ("r/7", 1)],
        [("r/7", 1), ("r/7", 0)],
    )
    assert sorted(t.raw_reward for t in train) == [0.0, 1.0] and train[0].group_rollout_count == 2
    assert (
        len(read_topic(kafka_bootstrap, topics.dead_letter, min_count=2)) == 2
    )  # nothing dead-lettered again


@pytest.mark.kafka(timeout=90)
def test_a_replayed_group_that_fails_again_keeps_its_lineage_and_is_bounded(kafka_bootstrap):
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="again")
    args = (
        "--bootstrap-servers",
        kafka_bootstrap,
        "--dead-letter-topic",
        topics.dead_letter,
        "--group",
        "r/8",
        "--rate",
        "0",
        "--max-replays",
        "1",
    )
    with running_worker(worker_config(kafka_bootstrap, topics)):
        # Siblings of rollout 0 disagree: whatever the number of replays, the group is refused again.
        send(
            kafka_bootstrap,
            topics.input,
            [s(8, 0, 1.0, size=1, sc=2, si=0), s(8, 0, 0.0, size=1, sc=2, si=1)],
        )
        # Counted when sent; visible to read_committed readers (dlq) once the worker's transaction commits.
        read_topic(kafka_bootstrap, topics.dead_letter, min_count=2)
        assert cli_json("replay", *args)["replayed"] == 2
        read_topic(kafka_bootstrap, topics.dead_letter, min_count=4)
    rows = cli_lines(
        "list",
        "--bootstrap-servers",
        kafka_bootstrap,
        "--dead-letter-topic",
        topics.dead_letter,
        "--limit",
        "0",
    )
    assert [(r["reason"], r["replay_count"]) for r in rows] == [("shared_reward_violation", 0)] * 2 + [
        ("shared_reward_violation", 1)
    ] * 2
    assert len({r["first_failed_at"] for r in rows}) == 1  # the first failure time survives the replay
    assert rows[2]["dead_lettered_at"] > rows[0]["dead_lettered_at"]
    # --since selects by the time of dead-lettering: the second failures only.
    since = cli_lines(
        "list",
        "--bootstrap-servers",
        kafka_bootstrap,
        "--dead-letter-topic",
        topics.dead_letter,
        "--since",
        rows[2]["dead_lettered_at"],
    )
    assert [r["replay_count"] for r in since] == [1, 1]
    again = cli_json(
        "show",
        f"{rows[2]['partition']}:{rows[2]['offset']}",
        "--bootstrap-servers",
        kafka_bootstrap,
        "--dead-letter-topic",
        topics.dead_letter,
    )
    headers = dict(again["headers"])
    assert headers[H.REPLAYED_FROM] in {f"{topics.dead_letter}:0:{r['offset']}" for r in rows[:2]}
    assert (
        headers[H.ORIGINAL_TOPIC] == topics.input and int(headers[H.ORIGINAL_OFFSET]) >= 2
    )  # the replayed copy
    # The same selection's next run sees only the new dead-letters, and refuses them: --max-replays 1.
    bounded = cli_json("replay", *args)
    assert (bounded["replayed"], bounded["refused"]) == (0, 2)
    assert all("--max-replays 1" in r["why"] for r in bounded["records"])
    assert len(read_topic(kafka_bootstrap, topics.input, min_count=4)) == 4  # 2 sent + 2 replayed, no more


@pytest.mark.kafka(timeout=90)
def test_a_replayed_group_still_incomplete_times_out_again(kafka_bootstrap):
    """Replay is transactional, so the input partition ends with a commit marker: the worker must still see
    itself caught up there and expire the replayed window by the wall clock."""
    topics = new_topics(kafka_bootstrap, partitions=1, prefix="retime")
    args = ("--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", topics.dead_letter, "--rate", "0")
    with running_worker(worker_config(kafka_bootstrap, topics)) as worker:
        send(kafka_bootstrap, topics.input, [s(9, 0, 1.0)])  # rollout 1 never comes
        read_topic(kafka_bootstrap, topics.dead_letter, min_count=1)  # the group timed out
        assert cli_json("replay", *args, "--group", "r/9")["replayed"] == 1
        wait_until(
            lambda: worker.stats.dead_lettered[R.INCOMPLETE_GROUP] == 2,
            10,
            "the replayed group to time out again",
        )
    rows = cli_lines(
        "list", "--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", topics.dead_letter
    )
    assert [(r["reason"], r["replay_count"]) for r in rows] == [
        ("incomplete_group", 0),
        ("incomplete_group", 1),
    ]
