"""The public API: `rollout_stream`'s names, by audience, importable without torch; the examples use only them
and the framework adapters of `rollout_stream.integrations`."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rollout_stream

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

ROLLOUT_PROCESS = {"RolloutProducer", "PromptSource", "PromptLease"}
TRAINER = {"TrainDataReader", "Batch", "BatchPosition", "prompt_fence"}
CONNECTION = {"Connection", "SecuritySettings"}
ERRORS = {"RolloutStreamError", "ConfigurationError", "RuntimeFailure", "PacingTimeout", "WeightsTooOld",
          "AdmissionRevoked", "NothingToTake", "SourceFinished", "LogNotFolded", "DatasetMismatch",
          "DatasetError"}


def test_all_is_the_api_by_audience():
    assert sorted(rollout_stream.__all__) == sorted(ROLLOUT_PROCESS | TRAINER | CONNECTION | ERRORS)
    assert len(rollout_stream.__all__) == len(set(rollout_stream.__all__))


@pytest.mark.parametrize("name", sorted(rollout_stream.__all__))
def test_every_name_resolves(name):
    value = getattr(rollout_stream, name)
    assert value.__name__ == name
    assert value.__module__.startswith("rollout_stream.")


def test_the_errors_are_one_tree():
    base = rollout_stream.RolloutStreamError
    for name in ERRORS:
        assert issubclass(getattr(rollout_stream, name), base), name


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Worker'"):
        rollout_stream.Worker  # noqa: B018


def test_importing_the_package_loads_neither_torch_nor_a_kafka_client():
    script = """
import sys
import rollout_stream
heavy = sorted(m for m in ("torch", "confluent_kafka", "kafka", "rollout_stream.broker") if m in sys.modules)
assert not heavy, heavy
"""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def public_import_errors(path: Path) -> list[str]:
    """The imports of `path` that reach past the public surface: `rollout_stream` itself with the names of its
    `__all__`, and `rollout_stream.integrations.*`."""
    wrong = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            public = rollout_stream.__all__ if node.module == "rollout_stream" else ()
            names = [f"{node.module}.{a.name}" for a in node.names if a.name not in public]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            inside = name == "rollout_stream" or name.startswith("rollout_stream.")
            public = name == "rollout_stream" or name.startswith("rollout_stream.integrations")
            if inside and not public:
                wrong.append(f"{path.name}:{node.lineno} {name}")
    return wrong


def test_the_examples_import_only_the_public_surface():
    assert EXAMPLES, "no examples found"
    wrong = [line for path in EXAMPLES for line in public_import_errors(path)]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_an_import_past_the_surface(tmp_path):
    example = tmp_path / "example.py"
    example.write_text("from rollout_stream import TrainDataReader, Worker\nimport rollout_stream.ops.synth\n"
                       "from rollout_stream.integrations.trl import completion_samples\n"
                       "def f():\n    from rollout_stream.commands.options import fail\n")
    assert public_import_errors(example) == [
        "example.py:1 rollout_stream.Worker",
        "example.py:2 rollout_stream.ops.synth",
        "example.py:5 rollout_stream.commands.options.fail",
    ]
