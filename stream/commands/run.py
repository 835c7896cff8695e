"""`rollout-stream run`: the long-running worker."""

from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Annotated

import typer

from rollout_stream.access import check_worker_access, denials_explained
from rollout_stream.clients import Connection
from rollout_stream.commands.connection import (
    NO_SECURITY_OPTIONS,
    SecurityOptions,
    connection_from_options,
)
from rollout_stream.commands.options import (
    DEFAULT_TOPICS,
    DeadLetterTopic,
    GroupSize,
    InputTopic,
    OutputTopic,
    WorkerBootstrap,
    fail,
    grouped_options,
)
from rollout_stream.config import INT32_MAX, TopicNames, WorkerConfig, check_count, parse_zero_variance
from rollout_stream.core.config import ADVANTAGE_ESTIMATORS
from rollout_stream.errors import described
from rollout_stream.kafka import KafkaFailure
from rollout_stream.logs import configure_logging, log_event
from rollout_stream.names import heads_topic
from rollout_stream.topics import (
    TopicMismatch,
    TopicSettings,
    ensure_topics,
    partition_count,
    require_topics,
    unreplicated_warning,
)
from rollout_stream.worker import Worker
from rollout_stream.worker.allocator import reuse_freed_buffers
from rollout_stream.worker.instance import claim_instance, fenced_as_taken_over

log = logging.getLogger("rollout_stream.run")

# Each flag defaults to the worker setting it fills (stream/config.py; the rules' defaults come from core).
_DEFAULTS = WorkerConfig()


@grouped_options
def run(
    bootstrap_servers: WorkerBootstrap = None,
    input_topic: InputTopic = DEFAULT_TOPICS.input,
    output_topic: OutputTopic = DEFAULT_TOPICS.output,
    dead_letter_topic: DeadLetterTopic = DEFAULT_TOPICS.dead_letter,
    group_id: Annotated[str, typer.Option(
        envvar="ROLLOUT_STREAM_GROUP_ID",
        help="Kafka consumer group of the workers (scale out by starting more).")] = _DEFAULTS.group_id,
    group_size: GroupSize = None,
    group_timeout: Annotated[float, typer.Option(
        envvar="ROLLOUT_STREAM_GROUP_TIMEOUT",
        help="Seconds a group may stay open after its first member's "
        "Kafka timestamp before it is dead-lettered as incomplete_group.")] = _DEFAULTS.group_timeout_s,
    advantage_estimator: Annotated[str, typer.Option(envvar="ROLLOUT_STREAM_ADVANTAGE_ESTIMATOR",
                                                     help=f"{', '.join(ADVANTAGE_ESTIMATORS[:-1])} or "
                                                     f"{ADVANTAGE_ESTIMATORS[-1]} (pass-through).")]
    = _DEFAULTS.advantage_estimator,
    no_rewards_normalization: Annotated[bool, typer.Option("--no-rewards-normalization",
                                                           envvar="ROLLOUT_STREAM_NO_REWARDS_NORMALIZATION",
                                                           help="Publish raw rewards unchanged.")] = False,
    no_std_normalization: Annotated[bool, typer.Option(
        "--no-std-normalization", envvar="ROLLOUT_STREAM_NO_STD_NORMALIZATION",
        help="GRPO/GSPO: subtract the group mean only.")] = False,
    reward_key: Annotated[str | None, typer.Option(envvar="ROLLOUT_STREAM_REWARD_KEY",
                                                   help="Select reward[KEY] when rewards are mappings.",
                                                   show_default=False)] = None,
    zero_variance: Annotated[str, typer.Option(envvar="ROLLOUT_STREAM_ZERO_VARIANCE",
                                               help="Groups whose rollouts all share one reward: keep, drop, "
                                               "refill (drop; a prompt source hands out another prompt in "
                                               "its place) or route:TOPIC. Always counted.")]
    = str(_DEFAULTS.zero_variance),
    commit_interval: Annotated[float, typer.Option(envvar="ROLLOUT_STREAM_COMMIT_INTERVAL",
                                                   help="Longest time between commits (transactions) under a "
                                                   "backlog, counted from the end of the last one; caught up "
                                                   "with its input, the worker commits a quarter of it after "
                                                   "the last commit, once it has published.")]
    = _DEFAULTS.commit_interval_s,
    progress_interval: Annotated[float, typer.Option(envvar="ROLLOUT_STREAM_PROGRESS_INTERVAL",
                                                     help="Seconds between progress log lines.")]
    = _DEFAULTS.progress_interval_s,
    closed_group_retention: Annotated[float | None, typer.Option(
        envvar="ROLLOUT_STREAM_CLOSED_GROUP_RETENTION",
        help="Seconds a resolved group is remembered to "
        "recognise late members and copies (default: "
        "max(3600, 2 x group timeout)).",
        show_default=False)] = None,
    session_timeout: Annotated[float, typer.Option(
        envvar="ROLLOUT_STREAM_SESSION_TIMEOUT",
        help="Consumer group session timeout in seconds: how long a "
        "silent worker keeps its partitions.")] = _DEFAULTS.session_timeout_s,
    create_topics: Annotated[bool, typer.Option(
        "--create-topics", envvar="ROLLOUT_STREAM_CREATE_TOPICS",
        help="Create the input, output and dead-letter topics if missing (default: a missing topic is an "
        "error naming it; `rollout-stream topics create` makes them).")] = False,
    partitions: Annotated[int, typer.Option(envvar="ROLLOUT_STREAM_PARTITIONS",
                                            help="Partitions for the topics --create-topics creates.")] = 3,
    delivery: Annotated[str, typer.Option(
        envvar="ROLLOUT_STREAM_DELIVERY",
        help="exactly-once (outputs, dead-letters, window changelog and input "
        "offsets in one transaction; consumers read with read_committed) or "
        "at-least-once (duplicates possible after a crash).")] = _DEFAULTS.delivery,
    leave_group_on_stop: Annotated[bool, typer.Option(
        "--leave-group-on-stop", envvar="ROLLOUT_STREAM_LEAVE_GROUP_ON_STOP",
        help="On SIGTERM, after the shutdown commit, leave the consumer group at once, so the other workers "
        "take the partitions now instead of after --session-timeout. For a worker that does not come back (a "
        "scale-down); off, a worker restarted with its --instance-id gets its partitions back without a "
        "rebalance.")] = False,
    instance_id: Annotated[str | None, typer.Option(
        envvar="ROLLOUT_STREAM_INSTANCE_ID",
        help="Stable name of this worker instance; its transactional "
        "id. Default: the first free <host>-N on this host (a "
        "restarted worker gets its own back). A second live worker "
        "with the same id is refused.", show_default=False)] = None,
    commit_max_records: Annotated[int, typer.Option(envvar="ROLLOUT_STREAM_COMMIT_MAX_RECORDS",
                                                    help="Also commit after this many input records.")]
    = _DEFAULTS.commit_max_records,
    max_open_groups: Annotated[int, typer.Option(envvar="ROLLOUT_STREAM_MAX_OPEN_GROUPS",
                                                 help="Pause fetching at this many open groups.")]
    = _DEFAULTS.max_open_groups,
    max_open_mib: Annotated[int, typer.Option(
        envvar="ROLLOUT_STREAM_MAX_OPEN_MIB",
        help="Pause fetching when open windows hold this many MiB; a single "
        "group larger than this is dead-lettered as group_too_large.")] = _DEFAULTS.max_open_bytes >> 20,
    chunk_kib: Annotated[int, typer.Option(
        envvar="ROLLOUT_STREAM_CHUNK_KIB",
        help="Train and dead-letter records larger than this many KiB go out as chunk records that readers "
        "reassemble (docs/chunks.md); below the cluster's message.max.bytes.")] = _DEFAULTS.chunk_bytes >> 10,
    write_heads: Annotated[bool, typer.Option(
        "--write-heads", envvar="ROLLOUT_STREAM_WRITE_HEADS",
        help="Also write one small head record per published group to <output topic>.heads, so trainer "
        "ranks fetch only their own rows (TrainDataReader(fetch='own'), docs/reader.md).")] = False,
    heartbeat_file: Annotated[str | None, typer.Option(envvar="ROLLOUT_STREAM_HEARTBEAT_FILE",
                                                       help="File touched every few seconds while the loop "
                                                       "runs (container health checks).", show_default=False)]
    = None,
    metrics_port: Annotated[int | None, typer.Option(
        envvar="ROLLOUT_STREAM_METRICS_PORT", show_default=False,
        help="Serve Prometheus /metrics, /healthz (loop alive) and /readyz (partitions assigned and "
        "restored) on this port.")] = None,
    max_dead_letter_ratio: Annotated[float, typer.Option(
        envvar="ROLLOUT_STREAM_MAX_DEAD_LETTER_RATIO",
        help="Stop (exit 3) once more than this share of the last --dead-letter-window resolved records was "
        "dead-lettered (a bad producer deploy, a wrong --group-size), instead of draining the input into the "
        "dead-letter topic. 1: never stop.")] = _DEFAULTS.max_dead_letter_ratio,
    dead_letter_window: Annotated[int, typer.Option(
        envvar="ROLLOUT_STREAM_DEAD_LETTER_WINDOW",
        help="Resolved input records (published or dead-lettered) the dead-letter limit looks back over; "
        "nothing is judged before this many.")] = _DEFAULTS.dead_letter_window,
    log_format: Annotated[str, typer.Option(
        envvar="ROLLOUT_STREAM_LOG_FORMAT", help="text or json.")] = "text",
    log_level: Annotated[str, typer.Option(envvar="ROLLOUT_STREAM_LOG_LEVEL",
                                           help="debug, info, warning or error.")]
    = "info",
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Run the stream worker: window rollouts by prompt group, check shared rewards, publish or dead-letter.

    Exits 0 on SIGTERM/SIGINT after flushing outputs and committing every resolved input offset.
    Bad records never stop it; bad configuration does, at start, with one line (exit 2); so does input that is
    mostly dead-lettered (--max-dead-letter-ratio, exit 3), after committing what came before.
    """
    if log_format not in ("text", "json"):
        fail(f"--log-format must be text or json, got {log_format!r}")
    if log_level.lower() not in ("debug", "info", "warning", "error"):
        fail(f"--log-level must be debug, info, warning or error, got {log_level!r}")
    config = WorkerConfig(
        bootstrap_servers=bootstrap_servers,
        topics=TopicNames(input_topic, output_topic, dead_letter_topic),
        group_id=group_id,
        group_size=group_size,
        group_timeout_s=group_timeout,
        advantage_estimator=advantage_estimator,
        rewards_normalization=not no_rewards_normalization,
        grpo_std_normalization=not no_std_normalization,
        reward_key=reward_key,
        zero_variance=parse_zero_variance(zero_variance),
        commit_interval_s=commit_interval,
        progress_interval_s=progress_interval,
        closed_group_retention_s=closed_group_retention,
        session_timeout_s=session_timeout,
        leave_group_on_stop=leave_group_on_stop,
        heartbeat_file=heartbeat_file,
        delivery=delivery,  # type: ignore[arg-type]  # a str option: WorkerConfig checks it
        instance_id=instance_id,
        commit_max_records=commit_max_records,
        max_open_groups=max_open_groups,
        max_open_bytes=max_open_mib * 1024 * 1024,
        chunk_bytes=chunk_kib * 1024,
        write_heads=write_heads,
        metrics_port=metrics_port,
        max_dead_letter_ratio=max_dead_letter_ratio,
        dead_letter_window=dead_letter_window,
    )
    check_count("--partitions", partitions, 1, INT32_MAX)
    configure_logging(log_format, log_level)
    signals = _StopSignals()
    conn = connection_from_options(config.bootstrap_servers, security)
    # before anything else: a second live worker with this id would fence this one's transactions
    claim = claim_instance(conn.bootstrap_servers, config.group_id, config.instance_id)
    config = replace(config, instance_id=claim.instance_id)
    with denials_explained(conn, config):  # an ACL missing at start, or revoked while running
        if conn.security.protocol != "PLAINTEXT":  # every missing ACL named now, before anything is read
            check_worker_access(conn, config, create_topics=create_topics)
        with described(KafkaFailure, f"cannot set up topics on {conn.bootstrap_servers}"):
            _set_up_topics(conn, config, create=create_topics, partitions=partitions)
        reuse_freed_buffers()
        worker = Worker(config, conn, claim=claim)
        with _metrics_served(worker, config.metrics_port), described(KafkaFailure, "Kafka error"), \
                fenced_as_taken_over(config.group_id, config.instance_id):
            signals.stop(worker)
            worker.run()


class _StopSignals:
    """SIGTERM and SIGINT stop the worker cleanly (exit 0); one during set-up stops it before its loop."""

    def __init__(self) -> None:
        self.worker: Worker | None = None
        self.early = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        if self.worker is None:
            log_event(log, "signal", signal=signal.Signals(signum).name, phase="startup")
            self.early = True
        else:
            log_event(log, "signal", signal=signal.Signals(signum).name)
            self.worker.request_stop()

    def stop(self, worker: Worker) -> None:
        """From now on a signal stops `worker`; one that came during set-up stops it now."""
        self.worker = worker
        if self.early:
            worker.request_stop()


def _set_up_topics(conn: Connection, config: WorkerConfig, *, create: bool, partitions: int) -> None:
    """Create the worker's topics (--create-topics), or require them: MissingTopic names the flag of each."""
    route = [config.zero_variance.topic] if config.zero_variance.topic else []
    heads = [heads_topic(t) for t in (config.topics.output, *route)] if config.write_heads else []
    topics = [config.topics.input, config.topics.output, *route, *heads, config.topics.dead_letter]
    if create:
        created = ensure_topics(conn, data_topics=[config.topics.input, config.topics.output, *route, *heads],
                                dead_letter_topics=[config.topics.dead_letter],
                                settings=TopicSettings(partitions=partitions))
        if created:
            log_event(log, "topics.created", topics=",".join(created))
    else:
        named = {config.topics.input: "--input-topic", config.topics.output: "--output-topic",
                 config.topics.dead_letter: "--dead-letter-topic"}
        named.update(dict.fromkeys(route, "--zero-variance route:"))
        named.update(dict.fromkeys(heads, "--write-heads"))
        require_topics(conn, named, hint="create them with `rollout-stream topics create` (check the names "
                       "for a typo), or pass --create-topics")
    for train, head in zip((config.topics.output, *route), heads, strict=False):
        # a head goes to the partition number of its group's train records
        if (want := partition_count(conn, train)) != (have := partition_count(conn, head)):
            raise TopicMismatch(f"{head} has {have} partitions, {train} {want}: a group's head goes to the "
                                "partition number of its train records (recreate it with as many partitions)")
    if (warning := unreplicated_warning(conn, topics)) is not None:  # runs, but one broker's loss stops it
        log_event(log, "topics.unreplicated", logging.WARNING, detail=warning)


@contextmanager
def _metrics_served(worker: Worker, port: int | None) -> Iterator[None]:
    """/metrics, /healthz and /readyz on `port` while the worker runs (MetricsPortUnavailable: exit 2)."""
    if port is None:
        yield
        return
    from rollout_stream.worker.metrics import serve_metrics

    server = serve_metrics(worker, port)
    log_event(log, "metrics.serving", port=port, paths="/metrics,/healthz,/readyz")
    try:
        yield
    finally:
        server.stop()


def register(app: typer.Typer) -> None:
    app.command("run")(run)
