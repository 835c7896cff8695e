"""Reading a miles/slime `Sample` (object or dict) into the fields of a rollout sample (`Sample.from_miles`).

Field names are miles' (radixark/miles `miles/utils/types.py`, THUDM/slime likewise). What a trainer needs
travels; what only the rollout side uses (raw multimodal inputs, routing keys, timing, speculative-decoding
and prefix-cache statistics) is left behind; what would change training but has no wire field (processed
multimodal inputs, LoRA adapters) is refused rather than silently dropped.
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from enum import Enum
from typing import Any

import numpy as np

__all__ = ["MILES_STATUSES", "miles_reward", "miles_sample_fields", "miles_status"]

# miles `Sample.Status` values; the wire carries the value string.
MILES_STATUSES: tuple[str, ...] = ("pending", "completed", "truncated", "aborted", "failed")

# Copied as they are (`Sample.__post_init__` packs the arrays).
_PASSED = (
    "group_index",
    "index",
    "rollout_id",
    "response_length",
    "tokens",
    "loss_mask",
    "rollout_log_probs",
    "teacher_log_probs",
    "opd_reverse_kl",
    "rollout_routed_experts",
    "rollout_indexer_topk",
    "rollout_sampling_mask_ids",
    "rollout_sampling_mask_offsets",
    "weight_version_offsets",  # not miles' own: taken where a sample (or its dict) carries it
)
# Set on a miles sample, these would change what is trained, and the wire has no field for them.
_REFUSED = ("multimodal_train_inputs", "adapter")

_MISSING = object()


def _reader(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return lambda name, default: obj.get(name, default)
    return lambda name, default: getattr(obj, name, default)


def miles_status(status: Any) -> str:
    """The wire status of a miles `Sample.Status` member, or of its value or name as a string."""
    if isinstance(status, Enum):
        status = status.value
    if isinstance(status, str) and status.lower() in MILES_STATUSES:
        return status.lower()
    raise ValueError(
        f"status must be a miles Sample.Status or one of {', '.join(MILES_STATUSES)}; got {status!r}"
    )


def _number(value: Any, where: str) -> float | int:
    # bool is a Real, but a reward of True is a bug upstream, not a score.
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where} must be a number; got {value!r}")
    return value.item() if isinstance(value, np.generic) else value  # type: ignore[return-value]


def miles_reward(reward: Any) -> float | int | dict[str, float | int] | None:
    """A miles reward as the wire carries it: None, a number, or a mapping of names to numbers."""
    if reward is None:
        return None
    if isinstance(reward, Mapping):
        out: dict[str, float | int] = {}
        for key, value in reward.items():
            if not isinstance(key, str):
                raise ValueError(f"reward keys must be strings; got {key!r}")
            out[key] = _number(value, f"reward[{key!r}]")
        return out
    return _number(reward, "reward")


def _text(value: Any, name: str) -> str:
    # A miles prompt may be chat messages (a list of dicts); the wire's `prompt` is text: they go as JSON.
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except TypeError as exc:
        raise ValueError(f"{name} must be a string or JSON-serializable; got {type(value).__name__}") from exc


def miles_sample_fields(obj: Any) -> dict[str, Any]:
    """`Sample` keyword arguments from a miles-like sample: attributes of an object, or keys of a dict."""
    get = _reader(obj)
    for name in _REFUSED:
        if get(name, None) is not None:
            raise ValueError(f"{name} is set, but rollout-stream does not carry it (docs/miles.md)")

    fields: dict[str, Any] = {}
    for name in _PASSED:
        value = get(name, _MISSING)
        if value is not _MISSING:
            fields[name] = value
    fields["prompt"] = _text(get("prompt", ""), "prompt")
    fields["response"] = _text(get("response", ""), "response")
    label = get("label", None)
    fields["label"] = None if label is None else _text(label, "label")
    fields["reward"] = miles_reward(get("reward", None))
    fields["status"] = miles_status(get("status", "pending"))  # miles' default status is PENDING
    fields["remove_sample"] = bool(get("remove_sample", False))

    versions = list(get("weight_versions", None) or [])
    if not all(isinstance(v, str) for v in versions):
        raise ValueError(f"weight_versions must be strings; got {versions!r}")
    fields["weight_versions"] = versions

    metadata = get("metadata", None)
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ValueError(f"metadata must be a mapping; got {type(metadata).__name__}")
    fields["metadata"] = dict(metadata or {})
    train_metadata = get("train_metadata", None)
    if train_metadata is not None and not isinstance(train_metadata, Mapping):
        raise ValueError(f"train_metadata must be a mapping or None; got {type(train_metadata).__name__}")
    fields["train_metadata"] = None if train_metadata is None else dict(train_metadata)
    return fields
