"""rollout-stream's public API, by who uses it: `from rollout_stream import TrainDataReader`.

* A rollout process: `RolloutProducer` sends finished prompt groups (paced to a trainer when asked);
  `PromptSource` hands out a dataset's prompts as `PromptLease`s.
* A trainer: `TrainDataReader` reads whole groups as a `Batch`, resumes from a `BatchPosition`;
  `prompt_fence` is where a resuming trainer's reader starts when prompts come from a `PromptSource`.
* Either: `Connection` (address, client, TLS/SASL) and `SecuritySettings`.
* The errors a loop catches, all `RolloutStreamError`s: a `ConfigurationError` needs a change before a retry,
  a `RuntimeFailure` may pass; `PacingTimeout`, `WeightsTooOld`, `AdmissionRevoked` come from pacing,
  `NothingToTake`, `SourceFinished`, `LogNotFolded`, `DatasetMismatch`, `DatasetError` from a prompt source.

Framework adapters are in `rollout_stream.integrations` (miles, TRL, verl). Each name is imported when first
used, so `import rollout_stream` loads neither a Kafka client nor torch.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from rollout_stream.errors import ConfigurationError, RolloutStreamError, RuntimeFailure

__all__ = [
    "AdmissionRevoked",
    "Batch",
    "BatchPosition",
    "ConfigurationError",
    "Connection",
    "DatasetError",
    "DatasetMismatch",
    "LogNotFolded",
    "NothingToTake",
    "PacingTimeout",
    "PromptLease",
    "PromptSource",
    "RolloutProducer",
    "RolloutStreamError",
    "RuntimeFailure",
    "SecuritySettings",
    "SourceFinished",
    "TrainDataReader",
    "WeightsTooOld",
    "prompt_fence",
]

if TYPE_CHECKING:
    from rollout_stream.clients import Connection
    from rollout_stream.pacing import AdmissionRevoked, PacingTimeout, WeightsTooOld
    from rollout_stream.producer import RolloutProducer
    from rollout_stream.prompts import (
        DatasetError,
        DatasetMismatch,
        LogNotFolded,
        NothingToTake,
        PromptLease,
        PromptSource,
        SourceFinished,
        prompt_fence,
    )
    from rollout_stream.reader import Batch, BatchPosition, TrainDataReader
    from rollout_stream.security import SecuritySettings

# name → the module that defines it, imported on first use (the reader pulls in torch, the producer a Kafka
# client: a command or a process that never uses them does not pay for them)
_LAZY = {
    "Connection": "rollout_stream.clients",
    "SecuritySettings": "rollout_stream.security",
    "RolloutProducer": "rollout_stream.producer",
    "AdmissionRevoked": "rollout_stream.pacing",
    "PacingTimeout": "rollout_stream.pacing",
    "WeightsTooOld": "rollout_stream.pacing",
    "PromptSource": "rollout_stream.prompts",
    "PromptLease": "rollout_stream.prompts",
    "prompt_fence": "rollout_stream.prompts",
    "DatasetError": "rollout_stream.prompts",
    "DatasetMismatch": "rollout_stream.prompts",
    "LogNotFolded": "rollout_stream.prompts",
    "NothingToTake": "rollout_stream.prompts",
    "SourceFinished": "rollout_stream.prompts",
    "TrainDataReader": "rollout_stream.reader",
    "Batch": "rollout_stream.reader",
    "BatchPosition": "rollout_stream.reader",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'rollout_stream' has no attribute {name!r}")
    value = getattr(_imported(_LAZY[name]), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def _imported(module: str) -> ModuleType:
    # Spelled out, not importlib.import_module(module): tests/test_layout.py follows these imports.
    if module == "rollout_stream.clients":
        import rollout_stream.clients
        return rollout_stream.clients
    if module == "rollout_stream.security":
        import rollout_stream.security
        return rollout_stream.security
    if module == "rollout_stream.producer":
        import rollout_stream.producer
        return rollout_stream.producer
    if module == "rollout_stream.pacing":
        import rollout_stream.pacing
        return rollout_stream.pacing
    if module == "rollout_stream.prompts":
        import rollout_stream.prompts
        return rollout_stream.prompts
    if module == "rollout_stream.reader":
        import rollout_stream.reader
        return rollout_stream.reader
    raise AssertionError(module)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
