"""The error tree (stream/errors.py) and the one place that turns an error into `error: …` and its exit."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import typer
from typer.testing import CliRunner

import rollout_stream
from rollout_stream.clients import BadBootstrap, BrokerUnreachable
from rollout_stream.commands.options import CommandGroup, error_line, fail
from rollout_stream.config import ConfigError
from rollout_stream.errors import (
    ConfigurationError,
    PolicyStop,
    RolloutStreamError,
    RuntimeFailure,
    described,
)
from rollout_stream.kafka import AuthorizationFailed, ConnectionCheckFailed, KafkaFailure
from rollout_stream.topics import MissingTopic
from rollout_stream.worker import DeadLetterLimitExceeded, ProduceFailed

runner = CliRunner()


def test_every_exception_the_stream_package_defines_is_in_the_tree():
    outside = []
    for info in pkgutil.walk_packages(rollout_stream.__path__, "rollout_stream."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
                    and not name.startswith("_") and not issubclass(obj, RolloutStreamError)):
                outside.append(f"{module.__name__}.{name}")
    assert not outside, outside


@pytest.mark.parametrize(("cls", "branch", "builtin", "code"), [
    (ConfigError, ConfigurationError, ValueError, 2),
    (BadBootstrap, ConfigurationError, ValueError, 2),
    (MissingTopic, ConfigurationError, LookupError, 2),
    (ConnectionCheckFailed, ConfigurationError, ConnectionError, 2),
    (BrokerUnreachable, RuntimeFailure, ConnectionError, 1),
    (KafkaFailure, RuntimeFailure, RuntimeError, 1),
    (AuthorizationFailed, RuntimeFailure, RuntimeError, 1),  # 2 once a command explains it (AccessDenied)
    (ProduceFailed, RuntimeFailure, RuntimeError, 1),
    (DeadLetterLimitExceeded, PolicyStop, RuntimeError, 3),
])
def test_each_class_has_its_branch_its_builtin_base_and_its_exit_code(cls, branch, builtin, code):
    assert issubclass(cls, branch) and issubclass(cls, builtin) and cls.exit_code == code


def test_the_line_is_what_was_being_done_the_failure_and_what_to_do():
    assert error_line(RuntimeFailure("boom")) == "error: boom"
    with pytest.raises(KafkaFailure) as caught:
        with described(KafkaFailure, "outer"), described(KafkaFailure, "Kafka error", advice="retry later"):
            raise KafkaFailure("gone", kind="KafkaTimeoutError")
    assert error_line(caught.value) == "error: Kafka error: KafkaTimeoutError: gone; retry later"  # innermost
    with pytest.raises(MissingTopic) as other:
        with described(KafkaFailure, "Kafka error"):  # only the kinds named
            raise MissingTopic({"t": "--input-topic"}, "b:9092", "create it")
    assert not other.value.doing
    stopping = "error: stopping without committing past an unpublished record: x"
    assert error_line(ProduceFailed("x")) == stopping


@pytest.mark.parametrize(("error", "code"), [
    (ConfigError("--group-size must be between 1 and 4096, got 0"), 2),
    (RuntimeFailure("the broker went away"), 1),
    (PolicyStop("dead-letter limit"), 3),
])
def test_a_command_that_raises_exits_with_one_line_and_the_code_of_the_error(error, code):
    app = typer.Typer(cls=CommandGroup)

    @app.command()
    def boom() -> None:
        raise error

    @app.command()
    def other() -> None: ...

    result = runner.invoke(app, ["boom"])
    assert result.exit_code == code
    assert result.stderr.splitlines() == [f"error: {error}"]
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_fail_refuses_with_a_configuration_error_or_fails_at_run_time():
    with pytest.raises(ConfigurationError, match="^--partitions must be at least 1$"):
        fail("--partitions must be at least 1")
    with pytest.raises(RuntimeFailure):
        fail("cannot", 1)
