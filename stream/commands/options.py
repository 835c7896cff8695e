"""Option types shared by the commands, so a flag means the same thing (and env var) everywhere."""

from __future__ import annotations

import sys
from typing import Annotated, NoReturn

import typer

__all__ = ["Bootstrap", "InputTopic", "OutputTopic", "DeadLetterTopic", "GroupSize", "fail", "resolve_bootstrap"]

Bootstrap = Annotated[
    str | None,
    typer.Option(
        "--bootstrap-servers", envvar="KAFKA_BOOTSTRAP_SERVERS",
        help="Kafka bootstrap address(es), comma-separated. Omitted: the local broker "
        "(started in ./.kafka-data if it is not running).",
        show_default=False,
    ),
]
InputTopic = Annotated[str, typer.Option("--input-topic", envvar="ROLLOUT_STREAM_INPUT_TOPIC",
                                         help="Rollout samples topic (input).")]
OutputTopic = Annotated[str, typer.Option("--output-topic", envvar="ROLLOUT_STREAM_OUTPUT_TOPIC",
                                          help="Train-data topic (normalized samples).")]
DeadLetterTopic = Annotated[str, typer.Option("--dead-letter-topic", envvar="ROLLOUT_STREAM_DEAD_LETTER_TOPIC",
                                              help="Dead-letter topic (refused records, original bytes + reason headers).")]
GroupSize = Annotated[
    int | None,
    typer.Option("--group-size", envvar="ROLLOUT_STREAM_GROUP_SIZE",
                 help="Rollouts per prompt group, used when a record leaves group_size unset.", show_default=False),
]


def fail(message: str, code: int = 2) -> NoReturn:
    """One readable line on stderr and a non-zero exit."""
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


def resolve_bootstrap(bootstrap: str | None) -> str:
    """The given address, or the local development broker (started when needed)."""
    if bootstrap:
        return bootstrap
    from stream.broker.local import BrokerError, LocalBroker

    try:
        return LocalBroker(progress=lambda line: print(line, file=sys.stderr)).ensure_running()
    except BrokerError as exc:
        fail(f"no --bootstrap-servers given and the local broker could not start: {exc}", 1)
