"""`python -m bench run` (from the repository's root, in the project's venv): the stage measured against the
client's ceiling on a real broker (docs/benchmarks.md)."""

from __future__ import annotations

import typer

from bench.command import bench
from rollout_stream.commands.options import CommandGroup

app = typer.Typer(name="python -m bench", cls=CommandGroup, add_completion=False,
                  pretty_exceptions_enable=False, no_args_is_help=True)


@app.callback()
def _root() -> None:
    """The workshop's benchmarks: see `python -m bench run --help`."""


app.command("run")(bench)

if __name__ == "__main__":
    app()
