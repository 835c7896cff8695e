"""`rollout-stream lag` as text: every party's row whole at 80 columns and in a pipe (no broker)."""

from __future__ import annotations

import io

from rich.console import Console

from rollout_stream.layout import PIPE_WIDTH
from rollout_stream.ops.lag import LagReport, StageRow, render_lag
from rollout_stream.pacing.positions import ProducerRow, TrainerRow


def report() -> LagReport:
    return LagReport(
        "train-data.progress", 60.0,
        producers=[ProducerRow("rollout-node-17-sglang-worker-3", "trainer-policy-main", 41, 1200, 12, True,
                               318.4, 0.3, False)],
        stages=[StageRow("rollout-stream", "rollouts", 37, 5, 2, 1.2, False)],
        trainers=[TrainerRow("trainer-policy-main", 42, 299, 1196, 1190, 0, 1, 12, 48, 15230.5,
                             {0: 600, 1: 590}, 0.4, False),
                  TrainerRow("eval-reader", 40, 12, 50, 50, 0, None, 0, None, 0.0, {}, 95.0, True,
                             stale_rollouts=7, stale_tokens=3584)],
        notes=[])


def render(width: int) -> list[str]:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(render_lag(report()))
    return console.export_text().splitlines()


def test_the_lag_table_in_a_pipe_has_one_whole_row_per_party():
    lines = render(PIPE_WIDTH)
    cells = [[c.strip() for c in line.strip("│┃").split("│")] for line in lines if "│" in line]
    rows = [c for c in cells if c[0] in ("producer", "stage", "trainer")]
    assert len(rows) == 4
    assert rows[0][-1] == "waiting" and rows[-1][-1] == "stale"
    assert all(line == line.rstrip() for line in lines)
    assert rows[2][4] == "policy lag 1, 12 groups waiting, 48 records"
    assert rows[3][3] == "batch 12, 50 groups (0 stale), 7 stale rollouts (3584 tokens) left out"
    assert "…" not in "\n".join(lines)


def test_the_lag_table_at_80_columns_keeps_every_name_and_state():
    lines = render(80)
    text = "\n".join(lines)
    assert all(len(line) <= 80 and line == line.rstrip() for line in lines), text
    assert "…" not in text
    for name in ("rollout-node-17-sglang-worker-3", "trainer-policy-main", "eval-reader", "stale", "waiting"):
        assert name in text, name


def test_a_stage_whose_workers_say_nothing_shows_them_unknown_not_zero():
    unknown = LagReport("train-data.progress", 60.0,
                        stages=[StageRow("rollout-stream", "rollouts", 0, None, None, None, False)])
    console = Console(width=PIPE_WIDTH, record=True, file=io.StringIO(), color_system=None)
    console.print(render_lag(unknown))
    text = console.export_text()
    assert "workers: unknown (start run with --metrics-port to report)" in text
    assert "0 worker(s)" not in text and "- open groups" not in text
