"""`rollout-stream synth`: a synthetic rollout producer with controlled faults."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, NoReturn

import typer

from rollout_stream.access import write_denials_explained
from rollout_stream.commands.connection import NO_SECURITY_OPTIONS, SecurityOptions, connection_from_options
from rollout_stream.commands.local import running_local_broker
from rollout_stream.commands.options import DEFAULT_TOPICS, Bootstrap, InputTopic, fail, grouped_options
from rollout_stream.config import INT64_MAX, check_count, check_rate
from rollout_stream.core.validate import MAX_SIBLING_COUNT, SampleLimits
from rollout_stream.ops.synth import (
    FaultRates,
    RateLimiter,
    SendProgress,
    SynthPlan,
    default_run_id,
    expectation_document,
    interruption_summary,
    send_groups,
)
from rollout_stream.producer import RolloutProducer

# The most tokens synth puts in one sample: 64 MiB of int32 token ids, the largest record topics take.
MAX_TOKENS = 1 << 24


def _rate(groups: str) -> Any:
    """A --*-rate option: the share of groups sent with one kind of fault."""
    return typer.Option(min=0.0, max=1.0, help=f"Share of groups {groups}.")


# synth's own --group-size (what it sends), on the worker's variable so one setting makes both agree.
SentGroupSize = Annotated[int, typer.Option(
    "--group-size", envvar="ROLLOUT_STREAM_GROUP_SIZE", min=1, max=SampleLimits().max_group_size,
    help="Rollouts per prompt group to send; written into each record's group_size unless "
    "--omit-group-size.")]


@grouped_options
def synth(
    bootstrap_servers: Bootstrap = None,
    input_topic: InputTopic = DEFAULT_TOPICS.input,
    groups: Annotated[int, typer.Option(min=0, help="Prompt groups to send (total count).")] = 100,
    group_size: SentGroupSize = 4,
    max_siblings: Annotated[int, typer.Option(
        min=1, max=MAX_SIBLING_COUNT, help="Samples per rollout are drawn from 1..N (agentic fan-out).")] = 1,
    tokens: Annotated[int, typer.Option(min=1, max=MAX_TOKENS, help="Tokens per sample.")] = 64,
    rate: Annotated[float, typer.Option(min=0.0, help="Samples per second (0: as fast as possible).")] = 0.0,
    fault_rate: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, show_default=False,
        help=f"Set each of the {len(FaultRates.__slots__)} --*-rate options below to this share (their sum, "
        "at most one fault per group, must stay <= 1).")] = None,
    malformed_rate: Annotated[float, _rate("with an extra undecodable record (decode_error)")] = 0.0,
    invalid_rate: Annotated[float, _rate("with a member whose reward is NaN (invalid_sample)")] = 0.0,
    shared_reward_rate: Annotated[float, _rate(
        "whose first rollout's siblings disagree on the reward (shared_reward_violation)")] = 0.0,
    conflicting_duplicate_rate: Annotated[float, _rate(
        "with a member sent twice, with different tokens (conflicting_duplicate)")] = 0.0,
    incomplete_rate: Annotated[float, _rate(
        "missing a member (incomplete_group, once the worker's --group-timeout passes)")] = 0.0,
    late_rate: Annotated[float, _rate(
        "followed by an extra rollout after they are complete (late_member)")] = 0.0,
    duplicate_rate: Annotated[float, _rate(
        "with a member sent twice, identical (dropped and counted)")] = 0.0,
    omit_group_size: Annotated[bool, typer.Option(
        help="Leave group_size unset (the worker's --group-size applies).")] = False,
    run_id: Annotated[str | None, typer.Option(help="Namespace of the group keys (default: random).",
                                               show_default=False)] = None,
    start_index: Annotated[int, typer.Option(min=0, help="First group_index.")] = 0,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same records).")] = 0,
    security: SecurityOptions = NO_SECURITY_OPTIONS,
) -> None:
    """Send synthetic rollout groups, with per-group probabilities of every dead-letter cause.

    Prints, as one JSON line on stdout, what the stage must produce for them (published samples,
    dead-letters by reason, duplicates), so a run can be checked end to end.
    """
    check_rate("--rate", rate)
    check_count("--start-index", start_index, 0, INT64_MAX - groups)  # every group_index fits an int64
    faults = FaultRates.uniform(fault_rate) if fault_rate is not None else FaultRates(
        malformed_rate, invalid_rate, shared_reward_rate, conflicting_duplicate_rate, incomplete_rate,
        late_rate, duplicate_rate)
    if faults.total() > 1.0:
        fail(_too_many_faults(faults, fault_rate))
    plan = SynthPlan(group_size=group_size, max_siblings=max_siblings, tokens=tokens, faults=faults,
                     seed=seed, run_id=run_id or default_run_id(), write_group_size=not omit_group_size)
    conn = connection_from_options(bootstrap_servers, security, local=running_local_broker)
    progress = SendProgress(plan)
    try:  # MissingTopic: exit 2
        with write_denials_explained(conn, input_topic), \
                RolloutProducer(conn, topic=input_topic, check=False) as producer:
            try:
                send_groups(producer.send_raw, plan, groups, progress, start_index=start_index,
                            limiter=RateLimiter(rate),
                            report=lambda n: print(f"synth: {n}/{groups} groups sent", file=sys.stderr))
            except KeyboardInterrupt:
                producer.flush()  # what was handed over reaches the broker (a second Ctrl-C stops this too)
                _interrupted(progress, groups)
    except KeyboardInterrupt:  # while connecting, or a second Ctrl-C while delivering the last records
        _interrupted(progress, groups, delivered=False)
    print(json.dumps(expectation_document(progress, groups)))


def _interrupted(progress: SendProgress, groups: int, *, delivered: bool = True) -> NoReturn:
    """Ctrl-C: what was sent on stderr, the expectation for it on stdout (as a whole run's), exit 130."""
    line = interruption_summary(progress)
    if progress.records and not delivered:
        line += " (interrupted again while they were delivered: some may not have reached the broker)"
    print(line, file=sys.stderr)
    print(json.dumps(expectation_document(progress, groups, interrupted=True)), flush=True)
    raise typer.Exit(130)


def _too_many_faults(faults: FaultRates, fault_rate: float | None) -> str:
    """Why these fault rates are refused: the flags that set them and their sum."""
    kinds = len(FaultRates.__slots__)
    if fault_rate is not None:
        return (f"--fault-rate {fault_rate:g} gives each of the {kinds} kinds of fault that share of groups, "
                f"{faults.total():g} in all; at most one fault per group: use --fault-rate <= 1/{kinds} "
                f"({int(1e4 / kinds) / 1e4:g})")
    given = [f"--{name.replace('_', '-')}-rate {getattr(faults, name):g}" for name in FaultRates.__slots__
             if getattr(faults, name)]
    return (f"{', '.join(given)} add up to {faults.total():g}; at most one fault per group, so the --*-rate "
            "options must add up to <= 1")


def register(app: typer.Typer) -> None:
    app.command("synth")(synth)
