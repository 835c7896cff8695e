"""Command output that reads at 80 columns and in a pipe: the console, flowing text, tables that fit or stack.

A table is shown only when it fits the width without cutting or wrapping a cell (rich would end a key or a
reason with "…" or break it over lines); otherwise a narrower layout of the same facts is (fewer columns
with a legend, or one block per row). Text flows at spaces and leaves no trailing spaces.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.text import Text

__all__ = ["PIPE_WIDTH", "Fit", "Flow", "natural_width", "output_console", "titled"]

# Rich renders at 80 columns when stdout is not a terminal; a pipe or a log file gets whole lines instead.
PIPE_WIDTH = 1000


def output_console(*, stderr: bool = False) -> Console:
    """A console for a command's output: the terminal's width (or $COLUMNS); in a pipe, lines are as long
    as their content."""
    console = Console(stderr=stderr)
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return console
    return Console(stderr=stderr, width=PIPE_WIDTH)


def natural_width(console: Console, options: ConsoleOptions, renderable: RenderableType) -> int:
    """The width `renderable` needs so that no table cell is wrapped or cut (flowing text counts its
    longest word: it wraps at any width)."""
    if isinstance(renderable, Group):
        return max((natural_width(console, options, r) for r in renderable.renderables), default=0)
    if isinstance(renderable, Flow):
        return renderable.__rich_measure__(console, options.update_width(PIPE_WIDTH * 100)).minimum
    return Measurement.get(console, options.update_width(PIPE_WIDTH * 100), renderable).maximum


class Flow:
    """Text broken at spaces to the width available, without trailing spaces.

    `indent`: spaces before every line after the first; `first`: before the first one. A word longer than a
    line (a very long group key) is folded over lines rather than cut.
    """

    def __init__(self, text: str | Text, *, indent: int = 0, first: int = 0, style: str = "") -> None:
        self.text = Text(text, style=style) if isinstance(text, str) else text
        self.indent = indent
        self.first = first

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        for i, paragraph in enumerate(self.text.split("\n", allow_blank=True)):
            yield from self._lines(console, paragraph, width, self.first if i == 0 else self.indent)

    def _lines(self, console: Console, text: Text, width: int, first: int) -> list[Text]:
        if not text.plain.strip():
            return [Text("")]
        head: list[Text] = []
        if first != self.indent:  # the first line has its own indent: wrap it alone, then the rest
            line = text.wrap(console, max(1, width - first), overflow="fold")[0]
            head = [_indented(line, first)]
            text = _lstrip(text[len(line.plain) :])
            if not text.plain:
                return head
        rest = text.wrap(console, max(1, width - self.indent), overflow="fold")
        return head + [_indented(line, self.indent) for line in rest]

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        plain = self.text.plain
        longest = max((cell_len(word) for word in plain.split()), default=0) + max(self.first, self.indent)
        whole = max((cell_len(line) for line in plain.split("\n")), default=0) + self.first
        return Measurement(min(longest, options.max_width), min(max(whole, longest), options.max_width))


def _indented(line: Text, indent: int) -> Text:
    line.rstrip()  # rich keeps the space before a line break
    out = Text(" " * indent) + line if indent else line
    out.end = "\n"
    return out


def _lstrip(text: Text) -> Text:
    stripped = len(text.plain) - len(text.plain.lstrip(" "))
    return text[stripped:] if stripped else text


class Fit:
    """The first of `layouts` that fits the width available at its natural width, else the last one
    (which should flow: stacked blocks of `Flow`)."""

    def __init__(self, *layouts: RenderableType) -> None:
        if not layouts:
            raise ValueError("Fit needs at least one layout")
        self.layouts = layouts

    def choose(self, console: Console, options: ConsoleOptions) -> RenderableType:
        for layout in self.layouts[:-1]:
            if natural_width(console, options, layout) <= options.max_width:
                return layout
        return self.layouts[-1]

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.choose(console, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.choose(console, options))


def titled(title: str | Text, *body: RenderableType) -> Group:
    """A section: its title on a line of its own (a table's own title is padded with spaces to the table's
    width), then the body."""
    head = Flow(Text(title, style="italic") if isinstance(title, str) else title)
    return Group(head, *body)


def stacked(blocks: Iterable[RenderableType]) -> Group:
    """One block per row, in order."""
    return Group(*blocks)
