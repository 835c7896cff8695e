"""The typer application: a sub-app or command per module in stream/commands (entry: stream/cli.py)."""

from __future__ import annotations

from typing import Any

import typer
import typer.rich_utils
from rich.columns import Columns
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from rollout_stream.commands import register_all
from rollout_stream.commands.options import CommandGroup

__all__ = ["app"]


class _HelpTable(Table):
    """typer's table of options (flag, type, help) that never cuts a flag or an env var name short.

    Side by side when every word fits: the flag and type columns keep their width and only the help column
    wraps. Else (an 80-column terminal: `--no-rewards-normalization` beside
    `ROLLOUT_STREAM_NO_REWARDS_NORMALIZATION` takes more) one entry after the other, help indented below
    its flag, where rich would otherwise end the words with "…".
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cells: list[tuple[RenderableType, ...]] = []

    def add_row(self, *renderables: RenderableType | None, **kwargs: Any) -> None:
        self._cells.append(tuple("" if r is None else r for r in renderables))
        super().add_row(*renderables, **kwargs)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self._side_by_side_fits(console, options):
            for column in self.columns[:-1]:
                column.no_wrap = True  # so rich narrows the help column alone
            yield from super().__rich_console__(console, options)
            return
        for *head, help_text in self._cells:
            yield Text(" ").join(cell for cell in head if isinstance(cell, Text) and cell.plain)
            yield Padding(help_text, (0, 0, 0, 4))

    def _side_by_side_fits(self, console: Console, options: ConsoleOptions) -> bool:
        if not self._cells:
            return True
        *head, help_column = zip(*self._cells, strict=True)
        heads = [max(Measurement.get(console, options, cell).maximum for cell in column) for column in head]
        help_words = max(_longest_word(console, options, cell) for cell in help_column)
        _, right, _, left = self.padding
        padding = (left + right) * len(self._cells[0]) - (0 if self.pad_edge else left + right)
        return sum(heads) + help_words + padding <= options.max_width


def _longest_word(console: Console, options: ConsoleOptions, cell: RenderableType) -> int:
    # typer's help cell: Columns of the help text, [env var: …] and [default: …]; a Text measures its
    # longest word as its minimum width.
    parts = cell.renderables if isinstance(cell, Columns) else [cell]
    return max((Measurement.get(console, options, part).minimum for part in parts), default=0)


# typer builds its help panels from `Table` in typer.rich_utils (looked up when help is printed).
# typer imports it from rich without re-exporting it (mypy: attr-defined); replaced here on purpose.
typer.rich_utils.Table = _HelpTable  # type: ignore[attr-defined]

app = typer.Typer(
    name="rollout-stream",
    cls=CommandGroup,  # usage errors as one line, not typer's rich box
    help=(
        "Kafka stream stage between RL rollout workers and asynchronous trainers: windows rollout samples "
        "by prompt group, refuses groups whose siblings disagree on reward (dead-letter topic), and "
        "publishes group-normalized rewards (GRPO/GSPO/REINFORCE++ baseline) to a train-data topic."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """Kafka stream stage for RL rollouts: see `rollout-stream COMMAND --help`."""


register_all(app)
