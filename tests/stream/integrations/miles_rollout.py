"""What miles does with the groups its fully-async data buffer returns, before and during the conversion to
train data: miles' own code when `miles` is importable, else a plain transcription of it.

Source: radixark/miles (Apache-2.0) at 31f1ca9: `miles/ray/rollout/rollout_data_conversion.py`
(`postprocess_rollout_data`, `validate_compact_rollout_ids`), `miles/utils/types.py`
(`Sample.get_reward_value`, `reset_for_retry`), `miles/rollout/fully_async_data_buffer.py`
(`DataBufferConstructorInput`, `DataBufferInput`, `first_sample`); the conversion itself is
tests/core/miles_reference.py's. Same statements in the same order; dropped: multi-LoRA boundaries and the
dynamic global batch size (both off by default).
"""

from __future__ import annotations

import importlib.util
import itertools
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.core import miles_reference


@dataclass
class MilesSample(miles_reference.MilesSample):
    """The transcribed `Sample` plus the two methods this path calls (miles/utils/types.py at 31f1ca9)."""

    def get_reward_value(self, args: Any) -> Any:
        return self.reward if not args.reward_key else self.reward[args.reward_key]

    def reset_for_retry(self) -> None:
        self.tokens, self.response, self.response_length, self.reward = [], "", 0, None
        self.loss_mask, self.weight_versions, self.rollout_log_probs = None, [], None
        self.status = MilesSample.Status.ABORTED  # `self.status = Sample.Status.ABORTED`
        self.remove_sample, self.train_metadata = False, None


@dataclass(frozen=True)
class DataBufferConstructorInput:  # miles/rollout/fully_async_data_buffer.py at 31f1ca9
    args: Namespace
    unused_handler_fn: Callable[[list[Any]], None]


@dataclass
class DataBufferInput:  # miles/rollout/fully_async_data_buffer.py at 31f1ca9
    prompt_group: list[Any]
    group: list[Any]


def first_sample(group: list[Any]) -> Any:  # fully_async_data_buffer.first_sample
    return group[0][0] if isinstance(group[0], list) else group[0]


def validate_compact_rollout_ids(node: Any, depth: int = 0) -> None:
    if isinstance(node, miles_reference.MilesSample):
        return
    assert isinstance(node, list), f"unexpected rollout output node type: {type(node).__name__}"
    if node and isinstance(node[0], miles_reference.MilesSample):
        if depth >= 2 and len(node) > 1:
            rids = [s.rollout_id for s in node]
            missing = [i for i, r in enumerate(rids) if r is None]
            assert not missing, f"Compact rollout returned {len(node)} samples but rollout_id is unset"
            assert len(set(rids)) == 1, f"siblings must share rollout_id: {rids}"
        return
    for item in node:
        validate_compact_rollout_ids(item, depth + 1)


def postprocess_rollout_data(args: Any, data: list[Any], train_parallel_config: Any
                             ) -> tuple[list[Any], dict[str, Any]]:
    metadata: dict[str, Any] = {}
    validate_compact_rollout_ids(data)
    # flatten the data if it is a list of lists
    while isinstance(data[0], list):
        data = list(itertools.chain.from_iterable(data))
    is_compact = any(s.rollout_id is not None for s in data)
    if not args.disable_rollout_trim_samples and not is_compact:
        global_batch_size = args.global_batch_size
        if len(data) % global_batch_size != 0:
            trim_len = (len(data) // global_batch_size) * global_batch_size
            if trim_len == 0:
                raise ValueError(f"Not enough samples {len(data)} for global_batch_size {global_batch_size}")
            data = data[:trim_len]
    return data, metadata


@dataclass(frozen=True)
class Miles:
    """One implementation of the path: its `Sample` class and functions."""

    name: str
    Sample: Any
    DataBufferConstructorInput: Any
    DataBufferInput: Any
    first_sample: Callable[[list[Any]], Any]
    postprocess_rollout_data: Callable[..., tuple[list[Any], dict]]
    convert_samples_to_train_data: Callable[[Any, list[Any], dict[str, Any]], dict[str, Any]]


TRANSCRIBED = Miles("transcribed", MilesSample, DataBufferConstructorInput, DataBufferInput, first_sample,
                    postprocess_rollout_data, miles_reference.convert_samples_to_train_data)


def upstream() -> Miles | None:
    """miles' own code, where it is importable (its modules on this path need only torch and numpy)."""
    if importlib.util.find_spec("miles") is None:
        return None
    from miles.ray.rollout import rollout_data_conversion, train_data_conversion
    from miles.rollout import fully_async_data_buffer as buffer
    from miles.utils.types import Sample

    def convert(args: Any, samples: list[Any], metadata: dict[str, Any]) -> dict[str, Any]:
        return train_data_conversion.convert_samples_to_train_data(args, samples, metadata, None, None)

    return Miles("miles", Sample, buffer.DataBufferConstructorInput, buffer.DataBufferInput,
                 buffer.first_sample, rollout_data_conversion.postprocess_rollout_data, convert)
