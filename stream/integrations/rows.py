"""A train sample as one token-aligned row, the shape TRL and verl both build their batches from.

The stage's samples hold the whole sequence (prompt then response) and response-aligned loss mask and
log-probs; the frameworks want them aligned with the tokens, prompt positions masked out.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from rollout_stream.codec import TrainSample
from rollout_stream.core.staleness import token_versions

__all__ = ["Row", "row_of", "weight_version_of"]


@dataclass(frozen=True)
class Row:
    """One sample: `tokens` (int64), `prompt_length`, and token-aligned `mask` (int64: 1 on trained response
    tokens), `log_probs` (float32, 0.0 off the response or where the rollout recorded none) and `versions`
    (int64: the weight version each response token was generated under, from `weight_version_offsets`, else
    the oldest listed; -1 off the response or where the sample lists none), what a TIS/MIS trainer reads."""

    tokens: npt.NDArray[np.int64]
    prompt_length: int
    mask: npt.NDArray[np.int64]
    log_probs: npt.NDArray[np.float32]
    versions: npt.NDArray[np.int64]

    @property
    def response(self) -> npt.NDArray[np.int64]:
        return self.tokens[self.prompt_length:]


def row_of(train: TrainSample) -> Row:
    """The token-aligned row of a train sample (a `remove_sample` sample trains no token, as in the
    reference trainer)."""
    sample = train.sample
    tokens = np.asarray(sample.tokens if sample.tokens is not None else (), dtype=np.int64)
    n, r = len(tokens), sample.response_length
    mask = np.zeros(n, dtype=np.int64)
    log_probs = np.zeros(n, dtype=np.float32)
    if r:
        mask[n - r:] = 1 if sample.loss_mask is None else np.asarray(sample.loss_mask, dtype=np.int64)
        if sample.rollout_log_probs is not None:
            log_probs[n - r:] = np.asarray(sample.rollout_log_probs, dtype=np.float32)
    if sample.remove_sample:
        mask[:] = 0
    versions = np.full(n, -1, dtype=np.int64)
    if r:
        try:
            spans = token_versions(sample)
        except ValueError:  # versions that are not integers: none known (the reader refuses to judge them)
            spans = None
        if spans is not None:
            versions[n - r:] = spans
    return Row(tokens, n - r, mask, log_probs, versions)


def weight_version_of(train: TrainSample) -> int | None:
    """The oldest weight version a sample was generated with (None when it has none or they are not
    integers), the same rule the reader judges staleness by."""
    try:
        return min(int(v) for v in train.sample.weight_versions) if train.sample.weight_versions else None
    except ValueError:
        return None
