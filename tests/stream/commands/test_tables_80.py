"""Every table readable at 80 columns and in a pipe.

At 80 columns: no line longer than 80, no key or reason cut short ('…') or broken over lines, no trailing
spaces. In a pipe (no terminal, no $COLUMNS): the whole table, as wide as its content. Rendered views
first (no broker), then the dlq commands on the real broker with COLUMNS=80 and in a pipe.
"""

from __future__ import annotations

import io
import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from typer.testing import CliRunner

from rollout_stream.clients import Connection
from rollout_stream.codec import DeadLetterReason as R
from rollout_stream.codec import Sample, TrainSample, encode_sample, group_key
from rollout_stream.core.assembly import GroupInfo
from rollout_stream.core.records import DeadLettered, InputRecord
from rollout_stream.kafka.kafka_python import raw_producer
from rollout_stream.layout import PIPE_WIDTH, Fit, Flow, output_console, titled
from rollout_stream.worker.outputs import dead_letter_records

# any client: rendering
pytestmark = pytest.mark.any_client

# the stage's reasons: a prompt source's `prompt_attempts_exhausted` holds no sample (test_prompt_source.py)
REASONS = [r.value for r in R if r is not R.PROMPT_ATTEMPTS_EXHAUSTED]
KEY = "synth-3f2a9c1b/1052"  # a synth group key: run id and group index


def render(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def assert_readable(
    text: str, width: int = 80, *, whole: tuple[str, ...] = (), ellipsis: bool = False
) -> None:
    """No line over `width`, no trailing spaces, each of `whole` on one line; no '…' unless allowed."""
    lines = text.splitlines()
    assert lines, "nothing rendered"
    too_long = [line for line in lines if cell_len(line) > width]
    assert not too_long, "\n".join(too_long)
    trailing = [line for line in lines if line != line.rstrip()]
    assert not trailing, trailing
    for word in whole:
        assert any(word in line for line in lines), f"{word!r} is not whole on any line:\n{text}"
    if not ellipsis:
        assert "…" not in text, text


# ---- layout ----------------------------------------------------------------------------------------


def test_flow_wraps_at_spaces_with_its_indent_and_no_trailing_spaces():
    text = render(Flow(f"replayed 6 record(s); refused 1; 47 scanned past the cursor {KEY}", indent=4), 30)
    assert text.splitlines() == [
        "replayed 6 record(s); refused",
        "    1; 47 scanned past the",
        f"    cursor {KEY}",
    ]
    assert render(Flow("a b\n\nc", first=2, indent=4)).splitlines() == ["  a b", "", "    c"]


def test_fit_takes_the_first_layout_that_fits_else_the_last():
    wide = Table("a" * 50, "b" * 50)
    assert "a" * 50 in render(Fit(wide, Flow("narrow")), 120)
    assert render(Fit(wide, Flow("narrow")), 80).strip() == "narrow"


def test_section_titles_are_lines_of_their_own_without_trailing_spaces():
    table = Table("reason", "records")
    table.add_row("shared_reward_violation", "5")
    text = render(titled("by reason", table))
    assert text.splitlines()[0] == "by reason"
    assert_readable(text, whole=("shared_reward_violation",))


def test_the_output_console_is_the_terminal_width_or_whole_lines_in_a_pipe(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    console = output_console()  # pytest captures stdout: not a terminal
    assert not console.is_terminal and console.width == PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "80")
    assert output_console().width == 80 and output_console(stderr=True).width == 80


# ---- bench ------------------------------------------------------------------------------------------


def bench_report(quick: bool):
    from bench.latency import LatencyResult
    from bench.results import (
        BenchReport,
        BenchSettings,
        MemoryResult,
        SweepPoint,
        Throughput,
        WorkloadResult,
    )
    from bench.workloads import Workload

    def tp(mode: str, rate: float) -> Throughput:
        return Throughput(
            mode,
            samples=100_000,
            bytes=200_000_000,
            seconds=100_000 / rate,
            cpu_s=0.5,
            loop_cpu_s=1.27,
            commits=3,
            final_commit_s=0.01,
        )

    lat = LatencyResult(
        rate=5962.0, groups=100, seen=100, p50_ms=37.0, p99_ms=170.0, max_ms=210.0, seconds=4.0
    )
    machine = {
        "cpus": 2,
        "cpu_model": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
        "python": "3.11.7",
        "kafka_python": "3.0.1",
        "load_average_start": [1.0],
        "load_average_end": [1.5],
    }
    report = BenchReport(BenchSettings(bootstrap="x:1", quick=quick), machine)
    a, b, c = Workload("a", 256, 8, 1, 125), Workload("b", 32768, 16, 1, 80), Workload("c", 256, 16, 3, 80)
    report.results = [
        WorkloadResult(a, "exactly-once", tp("stage", 11923), tp("passthrough", 11735), lat, lat),
        WorkloadResult(b, "exactly-once", tp("stage", 463), tp("passthrough", 459), lat, lat),
    ]
    if not quick:
        report.results.append(
            WorkloadResult(c, "exactly-once", tp("stage", 10836), tp("passthrough", 12735), lat)
        )
        report.delivery_compare = [
            WorkloadResult(a, "at-least-once", tp("stage", 13000), tp("passthrough", 12000), lat, lat)
        ]
        report.memory = [
            MemoryResult(
                b, base_rss=700_000_000, peak_rss=900_000_000, open_bytes=200_000_000, open_windows=64
            )
        ]
        report.sweep = [
            SweepPoint(0.1, 1000, tp("stage", 800), lat),
            SweepPoint(0.5, 5000, tp("stage", 11800), lat),
        ]
        report.sweep_workload = a
    return report


def bench_text(quick: bool, width: int) -> str:
    from bench.report import render as render_bench

    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    render_bench(bench_report(quick), console)
    return console.export_text()


def test_bench_at_80_columns_splits_its_table_with_a_legend_and_cuts_nothing():
    text = bench_text(quick=False, width=80)
    assert_readable(
        text,
        whole=(
            "a 256t g8",
            "b 32Kt g16",
            "c 256t×3 g16",
            "stage/s",
            "pass p99 ms",
            "11,923",
            "idle MB",
            "max records",
            "loop µs",
        ),
    )
    assert "stage/s, pass/s: samples per second" in text  # the legend of the shortened headers
    assert "ratio: (peak RSS − idle RSS) / MB in open windows" in text
    lines = text.splitlines()
    for title in (
        "Exactly-once vs at-least-once",
        "Memory: peak RSS vs bytes in open windows (target ≤ 1.5 × open + idle)",
    ):
        assert title in lines  # a title is a line of its own
    assert lines[-4:] == [
        "Targets:",
        "  stage ≥ 0.85 × passthrough on (a),(b): met (min 1.009)",
        "  p99 ≤ 250 ms at half load: met (max 170 ms)",
        "  memory ≤ 1.5 × open + idle: met (max 1.0)",
    ]


def test_bench_quick_says_not_measured_for_memory():
    report = bench_report(quick=True)
    targets = report.targets()
    assert targets["memory_ok"] is None and targets["memory_ratio_max"] is None
    assert report.to_json()["targets"]["memory_ok"] is None  # null in --json: not measured, not failed
    text = bench_text(quick=True, width=80)
    assert_readable(text)
    assert text.splitlines()[-1] == "  memory ≤ 1.5 × open + idle: not measured (--quick)"
    assert "not met" not in text and "Memory:" not in text


def test_bench_in_a_pipe_is_the_whole_table():
    text = bench_text(quick=False, width=PIPE_WIDTH)
    assert_readable(text, PIPE_WIDTH)
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if "workload" in line and "mode" in line)
    assert "loop µs/" in lines[header - 1] and "p99 ms" in lines[header]  # the wide table: one for all
    assert "stage/s, pass/s" not in text


# ---- dlq views ------------------------------------------------------------------------------------------


def list_rows() -> list[dict]:
    return [
        {
            "partition": i % 3,
            "offset": 12345 + i,
            "dead_lettered_at": "2026-11-29T12:46:48.123Z",
            "reason": reason,
            "group_key": f"synth-3f2a9c1b/{1000 + i}",
            "rollout": 1000123 + i,
            "sibling_index": 0,
            "replay_count": i % 2,
            "message": f"group synth-3f2a9c1b/{1000 + i} timed out after 5s with 3 of 4 rollouts complete "
            "(3 samples received)",
        }
        for i, reason in enumerate(REASONS)
    ]


def test_dlq_list_at_80_columns_is_a_block_per_record_with_every_key_reason_and_message():
    from rollout_stream.ops.dlq.render import list_view

    rows = list_rows()
    text = render(list_view(rows, 80))
    keys = tuple(r["group_key"] for r in rows)
    assert_readable(text, whole=(*keys, *REASONS, "12:46:48 UTC", "rollout 1000123"))
    assert text.count("timed out after 5s") == len(rows) and text.count("(3 samples") == len(rows)
    assert text.splitlines()[0] == f"0:12345  {REASONS[0]}  group synth-3f2a9c1b/1000"


def test_dlq_list_in_a_pipe_is_one_line_per_record_with_whole_messages():
    from rollout_stream.ops.dlq.render import list_view

    rows = list_rows()
    text = render(list_view(rows, PIPE_WIDTH), PIPE_WIDTH)
    assert_readable(text, PIPE_WIDTH, whole=tuple(r["message"] for r in rows))
    assert "p:offset" in text.splitlines()[1] and len(text.splitlines()) == len(rows) + 4


def replay_doc(dry_run: bool) -> dict:
    records = [
        {
            "partition": r["partition"],
            "offset": r["offset"],
            "reason": r["reason"],
            "group_key": r["group_key"],
            "action": "would_replay" if dry_run else "replayed",
            "to": "rollouts",
            "replay_count": 1,
            "why": None,
        }
        for r in list_rows()
    ]
    records += [
        {
            "partition": 0,
            "offset": 9,
            "reason": "shared_reward_violation",
            "group_key": "synth-3f2a9c1b/77",
            "action": "refused",
            "to": None,
            "replay_count": 3,
            "why": "replay count 3 reached --max-replays 3",
        },
        {
            "partition": 0,
            "offset": 10,
            "reason": "incomplete_group",
            "group_key": "synth-3f2a9c1b/78",
            "action": "already_replayed",
            "to": None,
            "replay_count": 1,
            "why": "by replay 1a2b3c4d5e6f at 2026-11-29T12:46:48Z",
        },
    ]
    return {
        "dry_run": dry_run,
        "cursor": "rollout-stream-replay-0123456789abcdef",
        "replay_id": "1a2b3c4d5e6f",
        "resumed": False,
        "scanned": 47,
        "matched": 8,
        "replayed": 6,
        "refused": 1,
        "already_replayed": 1,
        "to_topics": {"rollouts": 6},
        "transactions": 2,
        "elapsed_s": 1.0,
        "cursor_start": {},
        "records": records,
        "records_truncated": False,
    }


@pytest.mark.parametrize("dry_run", [True, False])
def test_dlq_replay_at_80_columns_keeps_to_or_why_not_whole(dry_run):
    from rollout_stream.ops.dlq.render import replay_view

    doc = replay_doc(dry_run)
    text = render(replay_view(doc, 50))
    verb = "would replay" if dry_run else "replayed"
    assert_readable(
        text,
        whole=(
            *REASONS,
            "synth-3f2a9c1b/1005",
            "replay count 3 reached --max-replays 3",
            "already replayed: by replay 1a2b3c4d5e6f at 2026-11-29T12:46:48Z",
            f"{verb} to rollouts, replay count 1",
            "rollout-stream-replay-0123456789abcdef",
        ),
    )
    assert text.count(f"{verb} to rollouts") == len(list_rows())
    assert ("dry run:" in text and "nothing written" in text) is dry_run
    wide = render(replay_view(doc, 50), PIPE_WIDTH)
    assert "to, or why not" in wide and "replay count 3 reached --max-replays 3" in wide


def show_doc() -> dict:
    message = (
        "all samples in rollout 1052011 must share one reward; rows [0, 1, 2] have rewards [0.0, 0.1, 0.2]"
    )
    return {
        "topic": "rollouts-dlq",
        "partition": 1,
        "offset": 12345,
        "dead_lettered_at": "2026-11-29T12:46:48.123Z",
        "first_failed_at": "2026-11-29T12:46:48.123Z",
        "replay_count": 0,
        "reason": "shared_reward_violation",
        "message": message,
        "group_key": KEY,
        "key": KEY,
        "value_bytes": 1234,
        "headers": [
            ["x-dlq-reason", "shared_reward_violation"],
            ["x-dlq-message", message],
            ["x-original-topic", "rollouts"],
            ["x-original-timestamp", "1764420408123"],
        ],
        "sample": {"group_index": 1052, "prompt": "a long prompt " * 8},
        "group_members": [],
        "sibling_rewards": [
            {
                "rollout": 1052011,
                "sibling_count": 3,
                "consistent": False,
                "rewards": [{"sibling_index": i, "reward": 0.123456789 * i, "at": "1:2"} for i in range(3)],
            },
            {
                "rollout": 1052012,
                "sibling_count": 1,
                "consistent": True,
                "rewards": [{"sibling_index": 0, "reward": 1.0, "at": "1:3"}],
            },
        ],
    }


def test_dlq_show_at_80_columns():
    from rollout_stream.ops.dlq.render import show_view

    text = render(show_view(show_doc()))
    assert_readable(
        text,
        whole=(
            KEY,
            "shared_reward_violation",
            "x-original-timestamp",
            "MISMATCH",
            "s1=0.123456789",
            "1052011",
        ),
    )
    title = "sibling rewards by rollout (all siblings of a rollout must share one reward)"
    assert title in text.splitlines()  # not wrapped, no trailing spaces
    assert text.splitlines()[0] == f"rollouts-dlq 1:12345  shared_reward_violation  group {KEY}"


def test_dlq_stats_at_80_columns():
    from rollout_stream.ops.dlq.render import stats_view

    doc = {
        "topic": "rollouts-dlq",
        "matched": 10,
        "scanned": 12,
        "oldest": {
            "dead_lettered_at": "2026-11-29T12:46:48.123Z",
            "partition": 0,
            "offset": 1,
            "reason": "conflicting_duplicate",
        },
        "newest": {
            "dead_lettered_at": "2026-11-29T12:46:49.123Z",
            "partition": 1,
            "offset": 12345,
            "reason": "shared_reward_violation",
        },
        "by_reason": {"shared_reward_violation": 5, "conflicting_duplicate": 5},
        "top_groups_exact": True,
        "top_groups_max_undercount": 0,
        "distinct_groups": 3,
        "top_groups": [
            {
                "group_key": KEY,
                "records": 3,
                "reasons": ["shared_reward_violation", "conflicting_duplicate"],
                "first_failed_at": "2026-11-29T12:46:48.123Z",
            }
        ],
        "by_original_topic": {"rollouts": 6, "rollouts-canary": 4},
        "partitions": [
            {
                "partition": 0,
                "low": 0,
                "end": 1234567,
                "scanned_from": 0,
                "matched": 5,
                "first_matched_offset": 1,
                "last_matched_offset": 1234560,
            }
        ],
        "replayed_before": 2,
    }
    text = render(stats_view(doc))
    assert_readable(
        text,
        whole=(
            KEY,
            "shared_reward_violation",
            "conflicting_duplicate",
            "rollouts-canary",
            "2026-11-29T12:46:48.123Z",
            "1234560",
        ),
    )
    for title in (
        "by reason",
        "top groups, 3 groups in all",
        "partitions (offsets: log start, end at scan start)",
    ):
        assert title in text.splitlines()


# ---- tail and demo --------------------------------------------------------------------------------------


def train_sample(rid: int, sib: int, nsib: int, reward: float, versions=("12", "13")) -> TrainSample:
    sample = Sample(
        group_index=1052,
        index=rid,
        rollout_id=rid,
        tokens=np.arange(32768, dtype="<i4"),
        response_length=30000,
        reward=reward,
        loss_mask=np.ones(30000, dtype="u1"),
        rollout_log_probs=np.full(30000, -0.5, dtype="<f4"),
        weight_versions=list(versions),
        group_size=4,
        sibling_count=nsib,
        sibling_index=sib,
        run_id="synth-3f2a9c1b",
    )
    return TrainSample(
        sample=sample,
        raw_reward=reward,
        reward=reward - 0.4375,
        group_key=KEY,
        group_rollout_count=4,
        group_sample_count=6,
        group_mean=0.4375,
        group_std=0.4,
        zero_variance=False,
        advantage_estimator="grpo",
        rewards_normalization=True,
        grpo_std_normalization=True,
        reward_key=None,
        source_topic="rollouts",
        source_partition=1,
        source_offset=10,
    )


GROUP = [
    train_sample(1052000, 0, 1, 0.25),
    train_sample(1052001, 0, 3, 1.0),
    train_sample(1052001, 1, 3, 1.0),
    train_sample(1052001, 2, 3, 1.0),
    train_sample(1052002, 0, 1, 0.0),
    train_sample(1052003, 0, 1, 0.123456),
]
INFO = GroupInfo(KEY, 1, 123456, 123462, 0, 6, 4, 12, 0.4375, 0.4, False)


@pytest.mark.parametrize("width", [80, 60])
def test_tail_keeps_each_reward_on_its_rollouts_line(width):
    from rollout_stream.commands.tail import group_block

    text = render(group_block(INFO, GROUP), width)
    assert_readable(
        text,
        width,
        whole=(
            f"group {KEY}",
            "0.25 → -0.1875",
            "1 → +0.5625",
            "0.123456 → -0.3140",
            "partition 1, offsets 123456–123462",
        ),
    )
    assert not any(line.strip("│ ").startswith("→") for line in text.splitlines())
    if width == 80:  # shorter headers and a legend for what every sample shares
        assert "resp: response tokens, loss: tokens in the loss mask" in text
        assert "weight versions 12,13 and" in text


def test_tail_shows_versions_per_sample_when_they_differ_and_the_whole_table_when_it_fits():
    from rollout_stream.commands.tail import group_block

    mixed = [*GROUP[:5], train_sample(1052003, 0, 1, 0.5, versions=("13",))]
    text = render(group_block(INFO, mixed))
    assert_readable(text, whole=("versions", "12,13"))
    wide = render(group_block(INFO, GROUP, expand=False), PIPE_WIDTH)
    assert "loss tokens" in wide and "response" in wide and "resp:" not in wide
    assert max(cell_len(line) for line in wide.splitlines()) < 120  # a pipe gets the block, not 1000 columns


def test_a_group_key_too_long_for_the_border_goes_inside_the_block():
    from rollout_stream.commands.tail import group_block

    key = "a-run-id-that-someone-made-" * 2 + "long-enough/1052"  # 70: "group KEY" leaves the border no room
    text = render(group_block(GroupInfo(key, 1, 1, 2, 0, 6, 4, 12, 0.4375, 0.4, False), GROUP))
    assert_readable(text, whole=(key,))


def test_demo_summary_title_and_last_line_in_a_pipe():
    from rollout_stream.commands.demo import _FinalOnly, _table
    from rollout_stream.ops.synth import Expected

    exp = Expected(1431, 180, Counter({"conflicting_duplicate": 68, "shared_reward_violation": 34}), 8, 1605)
    worker = SimpleNamespace(
        stats=SimpleNamespace(
            groups_published=180, samples_published=1431, dead_lettered=exp.dead_letters, duplicates=8
        ),
        store=SimpleNamespace(open_count=lambda: 0),
    )
    out = io.StringIO()
    console = Console(file=out, width=80, color_system=None)
    with _FinalOnly(console, _table(exp, worker, 1, "rollout-stream demo: sending")) as live:
        live.update(_table(exp, worker, 1605, "rollout-stream demo: summary"))
    console.print("1605 records in 7.3s; every record accounted for: yes")
    lines = out.getvalue().splitlines()
    assert lines[0] == "rollout-stream demo: summary" and "sending" not in out.getvalue()
    assert lines[-2].startswith("└") and lines[-2].endswith("┘")  # the border ends its line
    assert lines[-1] == "1605 records in 7.3s; every record accounted for: yes"
    assert_readable(out.getvalue(), whole=("dead-letter: shared_reward_violation",))


# ---- the dlq commands on the broker ---------------------------------------------------------------------

runner = CliRunner()


def sample(gi: int, rid: int, reward: float, *, si: int = 0, sc: int = 1) -> Sample:
    return Sample(
        group_index=gi,
        index=rid,
        rollout_id=rid,
        reward=reward,
        group_size=2,
        sibling_count=sc,
        sibling_index=si,
        run_id="synth-3f2a9c1b",
        tokens=[1, 2, 3, 4],
        response_length=2,
        loss_mask=[1, 0],
        rollout_log_probs=[-0.25, -1.5],
    )


def failures(input_topic: str) -> list[DeadLettered]:
    """A dead-letter of every reason, with synth's long keys and the worker's messages."""
    out = []
    for i, reason in enumerate(REASONS):
        gi = 1000 + i
        members = [sample(gi, gi * 1000, 1.0)]
        if reason == "shared_reward_violation":
            members = [sample(gi, gi * 1000, 2.0, si=0, sc=2), sample(gi, gi * 1000, 6.0, si=1, sc=2)]
        records = tuple(
            InputRecord(input_topic, 0, 10 * i + j, 1_700_000_000_000 + i, group_key(m), encode_sample(m))
            for j, m in enumerate(members)
        )
        message = (
            f"group synth-3f2a9c1b/{gi} timed out after 5s with 1 of 2 rollouts complete (1 samples received)"
        )
        out.append(DeadLettered(R(reason), message, f"synth-3f2a9c1b/{gi}", records, 1_700_000_000_000 + i))
    return out


@pytest.fixture
def filled_dlq(kafka_bootstrap):  # one per test and client: a replay moves the topic's cursor
    import uuid

    from kafka.admin import KafkaAdminClient, NewTopic

    tag = uuid.uuid4().hex[:8]
    input_topic, dlq = f"t80-{tag}-in", f"t80-{tag}-dlq"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(input_topic, 1, 1), NewTopic(dlq, 1, 1)])
    finally:
        admin.close()
    producer = raw_producer(Connection(kafka_bootstrap))
    try:
        for failure in failures(input_topic):
            for r in dead_letter_records(failure, dlq):
                producer.send(r.topic, key=r.key, value=r.value, headers=r.headers)
        producer.flush()
    finally:
        producer.close()
    return SimpleNamespace(
        input=input_topic, dlq=dlq, args=("--bootstrap-servers", kafka_bootstrap, "--dead-letter-topic", dlq)
    )


def dlq(*args: str, columns: str | None):
    from rollout_stream.cli import app

    result = runner.invoke(app, ["dlq", *args], env={"COLUMNS": columns})
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result.stdout


KEYS = tuple(f"synth-3f2a9c1b/{1000 + i}" for i in range(len(REASONS)))


def test_dlq_commands_at_80_columns(filled_dlq):
    listing = dlq("list", *filled_dlq.args, columns="80")
    assert_readable(listing, whole=(*KEYS, *REASONS, "(1 samples received)"))
    rows = [json.loads(line) for line in dlq("list", *filled_dlq.args, "--json", columns="80").splitlines()]
    shared = next(r for r in rows if r["reason"] == "shared_reward_violation")
    assert_readable(
        dlq("show", f"{shared['partition']}:{shared['offset']}", *filled_dlq.args, columns="80"),
        whole=("shared_reward_violation", "MISMATCH", "x-original-timestamp"),
    )
    assert_readable(dlq("stats", *filled_dlq.args, columns="80"), whole=(*KEYS, *REASONS))
    dry = dlq("replay", *filled_dlq.args, "--dry-run", columns="80")
    assert_readable(dry, whole=(*KEYS, *REASONS, f"would replay to {filled_dlq.input}", "nothing written"))
    done = dlq("replay", *filled_dlq.args, "--rate", "0", columns="80")
    assert_readable(done, whole=(*KEYS, *REASONS, f"replayed to {filled_dlq.input}"))
    assert done.count(f"replayed to {filled_dlq.input}, replay count 1") == len(REASONS) + 1  # 2 siblings


def test_dlq_commands_in_a_pipe_print_whole_tables(filled_dlq):
    listing = dlq("list", *filled_dlq.args, columns=None)
    lines = listing.splitlines()
    assert "p:offset" in lines[1] and "message" in lines[1]  # the table
    for key, reason in zip(KEYS, REASONS, strict=True):
        assert any(key in line and reason in line and "(1 samples received)" in line for line in lines), key
    dry = dlq("replay", *filled_dlq.args, "--dry-run", "--group", KEYS[0], columns=None)
    assert "to, or why not" in dry
