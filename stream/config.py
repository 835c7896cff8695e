"""Worker configuration, modeled once: CLI flags and environment variables fill this struct and nothing
else."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from rollout_stream.clients import MAX_RECORD_BYTES
from rollout_stream.codec.chunks import DEFAULT_CHUNK_BYTES
from rollout_stream.core import RewardConfig
from rollout_stream.core.config import ADVANTAGE_ESTIMATORS
from rollout_stream.core.dead_letter_limit import MAX_WINDOW, DeadLetterLimit
from rollout_stream.core.validate import MAX_GROUP_SIZE, SampleLimits
from rollout_stream.core.windows import (
    DEFAULT_CLOSED_RETENTION_MS,
    DEFAULT_GROUP_TIMEOUT_MS,
    DEFAULT_MAX_CLOSED_GROUPS,
    DEFAULT_MAX_GROUP_BYTES,
    WindowConfig,
)
from rollout_stream.errors import ConfigurationError

__all__ = ["INT32_MAX", "INT64_MAX", "MAX_SECONDS", "ConfigError", "ZeroVariancePolicy", "TopicNames",
           "WorkerConfig", "check_count", "check_rate", "check_seconds", "parse_zero_variance"]

_REWARD_DEFAULTS = RewardConfig()  # the reward settings' defaults are core's (named as in the reference)
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class ConfigError(ConfigurationError, ValueError):
    """A configuration a person must fix before the worker can start."""


INT32_MAX = 2**31 - 1  # Kafka's int fields: partitions, max.message.bytes, a poll's or a session's ms
INT64_MAX = 2**63 - 1  # Kafka's and msgspec's longest integer: offsets, timestamps, retention.ms
# The longest duration any flag takes (100 years): in ms it fits an int64 with a Kafka timestamp added to it
# (a group's deadline), and Python's waits (threading.TIMEOUT_MAX, about 292 years) and timedelta take it.
MAX_SECONDS = 100 * 365 * 24 * 3600


def check_seconds(flag: str, value: float, *, zero: bool = False, unit: str = "seconds",
                  unit_s: float = 1.0) -> None:
    """Refuse a duration that is not a finite number of `unit`s above 0 (or 0, with `zero`) up to MAX_SECONDS:
    NaN and infinities included, which comparisons alone let through (inf > 0)."""
    at_most = MAX_SECONDS / unit_s
    if not (math.isfinite(value) and (value >= 0 if zero else value > 0) and value <= at_most):
        low = "0 or more" if zero else "above 0"
        raise ConfigError(f"{flag} must be a number of {unit} {low} and at most {at_most:.10g} (100 years), "
                          f"got {value:g}")


def check_rate(flag: str, value: float, *, unlimited: bool = True) -> None:
    """Refuse a rate per second that is not finite, negative, or so small that the wait between two events
    exceeds MAX_SECONDS (time.sleep raises OverflowError); 0 means unlimited where `unlimited`."""
    if not (math.isfinite(value) and ((unlimited and value == 0) or value >= 1 / MAX_SECONDS)):
        zero = "0 (unlimited) or " if unlimited else ""
        raise ConfigError(f"{flag} must be {zero}at least one per 100 years ({1 / MAX_SECONDS:.2g} per "
                          f"second), got {value:g}")


def check_count(flag: str, value: int, low: int, high: int = INT64_MAX, *, unit: str = "") -> None:
    """Refuse an integer outside low..high (by default the int64 the Kafka clients and msgspec carry)."""
    if low <= value <= high:
        return
    unit = f" {unit}" if unit else ""
    if high == INT64_MAX:
        limit = f"at least {low}{unit}" if value < low else f"at most {high}{unit} (an int64)"
    else:
        limit = f"between {low} and {high}{unit}"
    raise ConfigError(f"{flag} must be {limit}, got {value}")


@dataclass(frozen=True, slots=True)
class ZeroVariancePolicy:
    """What to do with groups whose rollouts all share one reward (no learning signal). `refill` keeps them
    off train-data as `drop` does, for a prompt source's groups: the source settles the prompt as filtered
    and its next take is another prompt, so trainer batches stay full of groups with signal (docs/loop.md)."""

    mode: Literal["keep", "drop", "refill", "route"] = "keep"
    topic: str | None = None

    def __str__(self) -> str:
        return f"route:{self.topic}" if self.mode == "route" else self.mode


def parse_zero_variance(text: str) -> ZeroVariancePolicy:
    if text == "keep":
        return ZeroVariancePolicy("keep")
    if text == "drop":
        return ZeroVariancePolicy("drop")
    if text == "refill":
        return ZeroVariancePolicy("refill")
    if text.startswith("route:"):
        topic = text.removeprefix("route:")
        _check_topic("--zero-variance route:TOPIC", topic)
        return ZeroVariancePolicy("route", topic)
    raise ConfigError(f"--zero-variance must be keep, drop, refill or route:TOPIC, got {text!r}")


def _check_topic(option: str, name: str) -> None:
    if not _TOPIC_RE.match(name) or name in (".", ".."):
        raise ConfigError(
            f"{option}: {name!r} is not a valid Kafka topic name (letters, digits, '.', '_', '-')"
        )


@dataclass(frozen=True, slots=True)
class TopicNames:
    input: str = "rollouts"
    output: str = "train-data"
    dead_letter: str = "rollouts-dlq"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything `rollout-stream run` needs; validated at construction."""

    bootstrap_servers: str | None = None
    topics: TopicNames = field(default_factory=TopicNames)
    group_id: str = "rollout-stream"
    group_size: int | None = None
    group_timeout_s: float = DEFAULT_GROUP_TIMEOUT_MS / 1000
    advantage_estimator: str = _REWARD_DEFAULTS.advantage_estimator
    rewards_normalization: bool = _REWARD_DEFAULTS.rewards_normalization
    grpo_std_normalization: bool = _REWARD_DEFAULTS.grpo_std_normalization
    reward_key: str | None = _REWARD_DEFAULTS.reward_key
    zero_variance: ZeroVariancePolicy = field(default_factory=ZeroVariancePolicy)
    # caught up: a quarter of it (stream/worker/cadence.py; docs/benchmarks.md)
    commit_interval_s: float = 0.1
    progress_interval_s: float = 10.0
    closed_group_retention_s: float | None = None  # default: max(1 h, 2 × group timeout)
    max_closed_groups: int = DEFAULT_MAX_CLOSED_GROUPS
    max_record_bytes: int = MAX_RECORD_BYTES
    # Output records larger than this go out as chunk records (docs/chunks.md): under a default cluster's
    # 1 MiB message.max.bytes.
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    # Also write one head record per published group to `<train topic>.heads` (stream/worker/heads.py), so
    # trainer ranks fetch only their own share of train-data (docs/reader.md, "Bytes each rank fetches").
    write_heads: bool = False
    heartbeat_file: str | None = None
    shutdown_timeout_s: float = 30.0
    delivery: Literal["exactly-once", "at-least-once"] = "exactly-once"
    instance_id: str | None = None  # stable per worker instance: its transactional id (default: host name)
    transaction_timeout_s: float = 60.0
    commit_max_records: int = 5000
    max_open_groups: int = 100_000
    max_open_bytes: int = DEFAULT_MAX_GROUP_BYTES  # also the largest group (group_too_large above it)
    session_timeout_s: float = 45.0
    # Stopped, leave the group at once, not after the session timeout (a scale-down; stream/worker/leave.py)
    leave_group_on_stop: bool = False
    metrics_port: int | None = None  # Prometheus /metrics, /healthz, /readyz on this port
    # Stop (exit 3) once more than this share of the last `dead_letter_window` resolved records were
    # dead-lettered: a bad producer deploy or a wrong --group-size, never one bad record (docs/operations.md).
    max_dead_letter_ratio: float = 0.4
    dead_letter_window: int = 10_000

    def __post_init__(self) -> None:
        for option, name in (
            ("--input-topic", self.topics.input),
            ("--output-topic", self.topics.output),
            ("--dead-letter-topic", self.topics.dead_letter),
        ):
            _check_topic(option, name)
        names = [self.topics.input, self.topics.output, self.topics.dead_letter]
        if self.zero_variance.topic:
            names.append(self.zero_variance.topic)
        if self.topics.input in names[1:]:
            raise ConfigError(f"--input-topic {self.topics.input!r} must differ from --output-topic, "
                              "--dead-letter-topic and the --zero-variance route topic")
        if self.topics.output == self.topics.dead_letter:
            raise ConfigError("--output-topic and --dead-letter-topic must differ")
        if not self.group_id:
            raise ConfigError("--group-id must not be empty")
        if self.group_size is not None and not 1 <= self.group_size <= MAX_GROUP_SIZE:
            raise ConfigError(f"--group-size must be between 1 and {MAX_GROUP_SIZE}, got {self.group_size}")
        check_seconds("--group-timeout", self.group_timeout_s)
        if self.advantage_estimator not in ADVANTAGE_ESTIMATORS:
            raise ConfigError(
                f"--advantage-estimator must be one of {', '.join(ADVANTAGE_ESTIMATORS)}, "
                f"got {self.advantage_estimator!r}"
            )
        if self.reward_key is not None and not self.reward_key:
            raise ConfigError("--reward-key must not be empty")
        check_seconds("--commit-interval", self.commit_interval_s)
        if self.delivery == "exactly-once" and self.commit_interval_s > self.transaction_timeout_s / 2:
            # the broker aborts a transaction open longer than its timeout: every commit would fail
            raise ConfigError(f"--commit-interval must be at most {self.transaction_timeout_s / 2:g} seconds "
                              f"under exactly-once (half the {self.transaction_timeout_s:g} s transaction "
                              f"timeout, after which the broker aborts a transaction), got "
                              f"{self.commit_interval_s:g}")
        check_seconds("--progress-interval", self.progress_interval_s)
        if not 6 <= self.session_timeout_s <= 1800:
            raise ConfigError(f"--session-timeout must be between 6 and 1800 seconds (the broker's default "
                              f"group.min/max.session.timeout.ms), got {self.session_timeout_s:g}")
        if self.delivery not in ("exactly-once", "at-least-once"):
            raise ConfigError(f"--delivery must be exactly-once or at-least-once, got {self.delivery!r}")
        check_count("--commit-max-records", self.commit_max_records, 1)
        check_count("--max-open-groups", self.max_open_groups, 1)
        if not 1024 <= self.chunk_bytes <= self.max_record_bytes:
            raise ConfigError(f"--chunk-kib must be between 1 and {self.max_record_bytes >> 10} (the largest "
                              f"record), got {self.chunk_bytes / 1024:g}")
        smallest = max(self.max_record_bytes, 1 << 20)
        if self.max_open_bytes < smallest:
            raise ConfigError(f"--max-open-mib must be at least {smallest / (1 << 20):g} (room for one "
                              f"record of the largest size), got {self.max_open_bytes / (1 << 20):g}")
        check_count("--max-open-mib", self.max_open_bytes >> 20, smallest >> 20, INT64_MAX >> 20)
        if self.closed_group_retention_s is not None:
            check_seconds("--closed-group-retention", self.closed_group_retention_s)
        if (
            self.closed_group_retention_s is not None
            and self.closed_group_retention_s < 2 * self.group_timeout_s
        ):
            raise ConfigError(
                f"--closed-group-retention ({self.closed_group_retention_s:g}s) must be at least twice "
                f"--group-timeout ({self.group_timeout_s:g}s) to recognise late members")
        if self.instance_id is not None and not _TOPIC_RE.match(self.instance_id):
            raise ConfigError(
                f"--instance-id {self.instance_id!r} may use letters, digits, '.', '_', '-' only"
            )
        if self.metrics_port is not None and not 1 <= self.metrics_port <= 65535:
            raise ConfigError(f"--metrics-port must be between 1 and 65535, got {self.metrics_port}")
        if not 0 <= self.max_dead_letter_ratio <= 1:
            raise ConfigError(f"--max-dead-letter-ratio must be between 0 and 1 (1: never stop), "
                              f"got {self.max_dead_letter_ratio:g}")
        if not 1 <= self.dead_letter_window <= MAX_WINDOW:
            raise ConfigError(f"--dead-letter-window must be between 1 and {MAX_WINDOW} records, "
                              f"got {self.dead_letter_window}")
        if self.bootstrap_servers is not None and not self.bootstrap_servers.strip():
            raise ConfigError("--bootstrap-servers must not be empty (omit it to use the local broker)")

    @property
    def closed_retention_s(self) -> float:
        if self.closed_group_retention_s is not None:
            return self.closed_group_retention_s
        return max(DEFAULT_CLOSED_RETENTION_MS / 1000, 2 * self.group_timeout_s)

    @property
    def reward(self) -> RewardConfig:
        return RewardConfig(
            advantage_estimator=self.advantage_estimator,  # type: ignore[arg-type]  # a str __post_init__ checked
            rewards_normalization=self.rewards_normalization,
            grpo_std_normalization=self.grpo_std_normalization,
            reward_key=self.reward_key,
        )

    @property
    def windows(self) -> WindowConfig:
        return WindowConfig(
            reward=self.reward,
            limits=SampleLimits(default_group_size=self.group_size),
            group_timeout_ms=int(self.group_timeout_s * 1000),
            closed_retention_ms=int(self.closed_retention_s * 1000),
            max_closed_groups=self.max_closed_groups,
            max_group_bytes=self.max_open_bytes,
        )

    @property
    def dead_letter_limit(self) -> DeadLetterLimit:
        return DeadLetterLimit(self.max_dead_letter_ratio, self.dead_letter_window)

    def effective(self) -> dict[str, Any]:
        """The configuration as logged at start (nothing secret lives here)."""
        out = asdict(self)
        out["zero_variance"] = str(self.zero_variance)
        return out
