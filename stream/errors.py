"""The project's one error tree: what failed decides how a command exits.

    RolloutStreamError          exit 1 unless a subclass says otherwise
    ├── ConfigurationError      exit 2: the user must change settings, flags, ACLs or topics, then retry
    │     ConfigError, SecurityConfigError, BadBootstrap, ConnectionCheckFailed (TLS, SASL, listener),
    │     InstanceInUse, AccessDenied, MissingTopic, TopicMismatch, SelectionError, BrokerConfigError
    ├── RuntimeFailure          exit 1: the broker or the data path failed while running; a retry may help
    │     KafkaFailure (and its tree), BrokerUnreachable, ProduceFailed, CommitAborted, RestoreStalled,
    │     InstanceTakenOver, ReaderError, ScanStalled, TopicMissing, RecordNotFound, ReplayFailed,
    │     AclsNotApplied, BrokerError (start, stop, jars), RunnerFailed,
    │     Hung (a client call past its deadline)
    └── PolicyStop              exit 3: the worker stopped itself as configured (DeadLetterLimitExceeded), so
                                a supervisor can tell it from a crash (systemd RestartPreventExitStatus=3)

Classes keep the builtin base callers may catch them by (ConfigError is a ValueError, BrokerUnreachable a
ConnectionError, MissingTopic a LookupError). A command prints `error: ` and one line and exits with
`exit_code`; stream/commands/options.py `error_line` is the one place that does. The line is the message,
after what was being done (`doing`) and before what to do about it (`advice`), which `described` attaches
where the caller knows them. core/ and codec/ import nothing of stream: their errors are not in this tree.

This module imports nothing of the project, so every package may import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ConfigurationError", "PolicyStop", "RolloutStreamError", "RuntimeFailure", "described"]


class RolloutStreamError(Exception):
    """Base class of every error the project raises on purpose. `exit_code`: how a command ends on it."""

    exit_code: int = 1
    doing: str = ""  # what was being done: the message's prefix ("cannot set up topics on HOST")
    advice: str = ""  # what to do about it: after the message ("is the broker running?")


class ConfigurationError(RolloutStreamError):
    """Settings, flags, ACLs or topics a person must change; retrying as is cannot help."""

    exit_code = 2


class RuntimeFailure(RolloutStreamError):
    """The broker or the data path failed at run time."""

    exit_code = 1


class PolicyStop(RolloutStreamError):
    """The worker stopped itself because a limit the user set was crossed (--max-dead-letter-ratio)."""

    exit_code = 3


@contextmanager
def described(
    kinds: type[RolloutStreamError] | tuple[type[RolloutStreamError], ...],
    doing: str = "",
    *,
    advice: str = "",
) -> Iterator[None]:
    """Attach what was being done and what to do to an error of `kinds` raised inside (the innermost wins).

        with described(KafkaFailure, f"cannot set up topics on {conn.bootstrap_servers}"):
            ensure_topics(...)
    """
    try:
        yield
    except kinds as exc:
        if doing and not exc.doing:
            exc.doing = doing
        if advice and not exc.advice:
            exc.advice = advice
        raise
