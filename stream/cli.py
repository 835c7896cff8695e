"""The `rollout-stream` command line: one typer app, one sub-app or command per module in stream/commands."""

from __future__ import annotations

import typer

from stream.commands import register_all

app = typer.Typer(
    name="rollout-stream",
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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
