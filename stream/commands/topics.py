"""`rollout-stream topics create`: the stage's topics with large-record limits and long dead-letter
retention."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rollout_stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions, connection_from_options
from rollout_stream.commands.local import running_local_broker
from rollout_stream.commands.options import (
    DEFAULT_TOPICS,
    Bootstrap,
    CommandGroup,
    DeadLetterTopic,
    InputTopic,
    OutputTopic,
    grouped_options,
)
from rollout_stream.config import INT32_MAX, check_count, check_seconds
from rollout_stream.names import admission_topic, changelog_topic_name, heads_topic, progress_topic
from rollout_stream.pacing import ensure_admission_topic, ensure_progress_topic
from rollout_stream.topics import TopicSettings, ensure_changelog, ensure_topics, unreplicated_warning

topics_app = typer.Typer(cls=CommandGroup, help="Manage the stage's Kafka topics.", no_args_is_help=True)


@topics_app.command("create")
@grouped_options
def create(
    bootstrap_servers: Bootstrap = None,
    input_topic: InputTopic = DEFAULT_TOPICS.input,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    dead_letter_topic: DeadLetterTopic = DEFAULT_TOPICS.dead_letter,
    partitions: Annotated[int, typer.Option(
        envvar="ROLLOUT_STREAM_PARTITIONS", help="Partitions per topic.")] = 3,
    replication_factor: Annotated[int | None, typer.Option(
        help="Replicas per partition. Default: the smaller of 3 and the cluster's brokers.",
        show_default=False)] = None,
    min_insync_replicas: Annotated[int | None, typer.Option(
        help="min.insync.replicas of every topic: replicas that must have a write before it is acknowledged "
        "(every producer here asks acks=all). Default: one less than the replication factor, at least 1.",
        show_default=False)] = None,
    max_message_mib: Annotated[int, typer.Option(help="max.message.bytes of every topic, in MiB.")] = 64,
    dead_letter_retention_days: Annotated[float, typer.Option(
        help="retention.ms of the dead-letter topic.")] = 90.0,
    extra_topic: Annotated[list[str] | None, typer.Option(
        help="Another data topic to create (repeatable), e.g. a "
        "--zero-variance route target.")] = None,
    changelog_group_id: Annotated[str | None, typer.Option(
        help="Also create the window changelog topic of this "
        "worker group (--delivery exactly-once), so the worker "
        "needs no CREATE permission.", show_default=False)] = None,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Create the rollout, train-data and dead-letter topics, the train-data topic's group heads (for
    `run --write-heads`), and its admission log and progress topic for pacing (existing topics are left
    unchanged)."""
    # Kafka carries partitions, min.insync.replicas and max.message.bytes as int32, replicas as int16
    check_count("--partitions", partitions, 1, INT32_MAX)
    if replication_factor is not None:
        check_count("--replication-factor", replication_factor, 1, 2**15 - 1)
    if min_insync_replicas is not None:
        check_count("--min-insync-replicas", min_insync_replicas, 1, INT32_MAX)
    check_count("--max-message-mib", max_message_mib, 1, INT32_MAX >> 20, unit="MiB (max.message.bytes is an "
                "int32)")
    check_seconds("--dead-letter-retention-days", dead_letter_retention_days, unit="days", unit_s=24 * 3600)
    conn = connection_from_options(bootstrap_servers, security, local=running_local_broker)
    settings = TopicSettings(partitions, replication_factor, max_message_mib * 1024 * 1024,
                             int(dead_letter_retention_days * 24 * 3600 * 1000), min_insync_replicas)
    heads = heads_topic(output_topic)  # group heads for rank-local fetch (docs/reader.md), as many partitions
    created = ensure_topics(conn, data_topics=[input_topic, output_topic, *(extra_topic or []), heads],
                            dead_letter_topics=[dead_letter_topic], settings=settings)
    if changelog_group_id:  # TopicMismatch (exists with another partition count): exit 2
        changelog = changelog_topic_name(changelog_group_id, input_topic)
        made = ensure_changelog(conn, changelog, partitions, replication_factor, min_insync_replicas)
        print(f"{changelog}: {'created' if made else 'exists'}")
    names = [input_topic, output_topic, *(extra_topic or []), dead_letter_topic, heads]
    for name in names:
        print(f"{name}: {'created' if name in created else 'exists'}")
    progress = progress_topic(output_topic)  # where trainers and paced producers say where they are
    made = ensure_progress_topic(conn, progress, replication_factor=replication_factor,
                                 min_insync_replicas=min_insync_replicas)
    print(f"{progress}: {'created' if made else 'exists'}")
    admission = admission_topic(output_topic)  # where paced producers ask for room behind the trainer
    made = ensure_admission_topic(conn, admission, replication_factor=replication_factor,
                                  min_insync_replicas=min_insync_replicas)
    print(f"{admission}: {'created' if made else 'exists'}")
    if (warning := unreplicated_warning(conn, names)) is not None:
        print(f"warning: {warning}", file=sys.stderr)


def register(app: typer.Typer) -> None:
    app.add_typer(topics_app, name="topics")
