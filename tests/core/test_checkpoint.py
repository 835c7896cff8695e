"""The fold's checkpoint (rollout_stream.core.checkpoint): what it holds of a dataset of millions of prompts,
and that a fold loaded from it goes on as the whole fold, with settled prompts shrunk to their codes."""

from __future__ import annotations

import dataclasses
import os
import time

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout_stream.codec.admission import Dataset
from rollout_stream.core import prompt_records
from rollout_stream.core.checkpoint import FOLD_VERSION, CheckpointMismatch, dump_fold, load_fold
from rollout_stream.core.prompt_records import (
    CODES,
    Attempt,
    AttemptEnd,
    Epoch,
    PromptRecord,
    PromptState,
    epoch_permutation,
)
from rollout_stream.core.prompts import PromptLog
from tests.core.prompt_world import SOURCE
from tests.core.test_prompts import STEPS, check_settled, play

EXAMPLES = int(os.environ.get("PROMPT_EXAMPLES", "150"))


def test_every_field_of_an_epoch_travels() -> None:
    """An epoch travels field by field (`_EpochState`): a field added to `Epoch` must be added there too."""
    assert {f.name for f in dataclasses.fields(Epoch)} == {
        "cursor", "prompts", "final", "reissued", "reissued_by", "recent", "codes", "reasons", "partial",
        "excluded_rollouts", "excluded_tokens"}


def test_epoch_order_is_a_permutation_that_does_not_depend_on_the_process() -> None:
    order = epoch_permutation(1_000, 7, 3)
    assert sorted(order.tolist()) == list(range(1_000))
    assert order[:5].tolist() == [239, 158, 549, 422, 122]  # the same in every process and numpy version


def big_fold(prompts: int, handed_out: int) -> PromptLog:
    """A fold whose only epoch has handed out `handed_out` prompts: settled ones shrunk, the newest settled
    and those in flight kept whole, some dead-lettered and filtered among them, built without folding."""
    fold = PromptLog()
    fold.apply(0, 0, Dataset(source=SOURCE, prompts=prompts, fingerprint="f", seed=1, epochs=1))
    order = fold.order(SOURCE, 0)
    kept, flying = 10_000, 64
    shrunk = handed_out - kept - flying
    codes = np.zeros(prompts, dtype=np.uint8)
    codes[order[:shrunk]] = CODES.index(PromptState.TRAINED)
    codes[order[:shrunk:1000]] = CODES.index(PromptState.FILTERED)
    dead = order[500:shrunk:7919].tolist()
    codes[dead] = CODES.index(PromptState.DEAD_LETTERED)
    e = Epoch(cursor=handed_out, final=handed_out - flying, codes=bytearray(codes.data),
              reasons=dict.fromkeys(dead, "invalid_sample"))
    for i, row in enumerate(order[shrunk:handed_out].tolist()):
        attempt = Attempt(1, 10 * i, f"p{i % 8}", f"p{i % 8}-1", 1_000 * i)
        rec = e.prompts[row] = PromptRecord(PromptState.IN_FLIGHT, [attempt])
        if i < kept:
            attempt.sent = attempt.delivered = True
            attempt.ended, attempt.ended_ms, attempt.trainer, attempt.batch = (
                AttemptEnd.TRAINED, 1_000 * i + 500, "trainer", i // 32)
            rec.state = PromptState.TRAINED
            e.recent.append(row)
        else:
            fold.live[10 * i] = (SOURCE, 0, row)
    fold.sources[SOURCE].epochs = [e]
    return fold


def test_a_checkpoint_holds_ten_million_prompts_half_handed_out() -> None:
    started = time.monotonic()
    fold = big_fold(10_000_000, 5_000_000)
    state = dump_fold(fold)
    loaded = load_fold(state, FOLD_VERSION)
    assert len(state) < 900 * 1024  # one record: the shrunk prompts are a prefix of the order
    assert loaded.status(SOURCE) == fold.status(SOURCE)
    status = loaded.status(SOURCE)[0]
    assert (status.waiting, status.in_flight) == (5_000_000, 64)
    assert status.dead_lettered == {"invalid_sample": len(loaded.sources[SOURCE].epochs[0].reasons)}
    order = fold.order(SOURCE, 0)
    for row in order[::99_991].tolist() + order[4_989_900:5_000_000:7].tolist():
        assert loaded.prompt(SOURCE, 0, row) == fold.prompt(SOURCE, 0, row), row
    assert dump_fold(loaded) == state
    assert time.monotonic() - started < 15  # about 3 s on 2 shared vCPUs


def test_a_checkpoint_whose_codes_do_not_fit_its_dataset_is_refused() -> None:
    fold = big_fold(20_000, 15_000)
    fold.sources[SOURCE].dataset = msgspec.structs.replace(fold.sources[SOURCE].dataset, prompts=10_000)
    with pytest.raises(CheckpointMismatch):
        load_fold(dump_fold(fold), FOLD_VERSION)


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, prompts=st.integers(1, 6), cut=st.floats(0, 1))
def test_settled_prompts_shrunk_early_settle_and_travel_as_the_kept_ones_do(
        steps: list[tuple[str, int]], prompts: int, cut: float) -> None:
    """With one settled prompt's attempts kept per epoch, every other settled prompt is shrunk while its
    epoch is open: the loop still settles every prompt once, and a fold loaded at any record (its codes in
    the epoch's order) goes on as the whole fold."""
    keep = prompt_records.KEEP_SETTLED
    prompt_records.KEEP_SETTLED = 1
    try:
        w = play(steps, prompts, 2)
        w.drain()
        check_settled(w)
        k = int(len(w.records) * cut)
        head = PromptLog()
        for offset, ms, record in w.records[:k]:
            head.apply(offset, ms, record)
        tail = load_fold(dump_fold(head), FOLD_VERSION)
        for offset, ms, record in w.records[k:]:
            tail.apply(offset, ms, record)
        assert dump_fold(tail) == dump_fold(w.fold)
        assert tail.status(SOURCE) == w.fold.status(SOURCE)
    finally:
        prompt_records.KEEP_SETTLED = keep
