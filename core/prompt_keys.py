"""Naming a prompt's attempt in the group key, and the fence that lets one attempt of a prompt train.

An attempt's group is keyed `<source>@<epoch>.<attempt>/<prompt>` (`run_id` `<source>@<epoch>.<attempt>`,
`group_index` the prompt's row), so the stage, the reader and the fold all see which prompt and which
attempt a group is, from the key alone (docs/loop.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["AttemptKey", "PromptFence", "PromptId", "attempt_run_id", "parse_attempt_key", "valid_source"]

PromptId = tuple[str, int, int]  # (source, epoch, prompt)

_SOURCE = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
_KEY = re.compile(r"(?P<source>[A-Za-z0-9_.:-]{1,100})@(?P<epoch>\d+)\.(?P<attempt>\d+)/(?P<prompt>\d+)")


def valid_source(name: str) -> bool:
    """A source name fits in a key unambiguously: letters, digits, `_ . : -`, at most 100."""
    return _SOURCE.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class AttemptKey:
    source: str
    epoch: int
    attempt: int  # 1 for the first
    prompt: int

    @property
    def prompt_id(self) -> PromptId:
        return (self.source, self.epoch, self.prompt)

    def __str__(self) -> str:
        return f"{attempt_run_id(self.source, self.epoch, self.attempt)}/{self.prompt}"


def attempt_run_id(source: str, epoch: int, attempt: int) -> str:
    """The `run_id` of an attempt's samples (the group index is the prompt's row)."""
    return f"{source}@{epoch}.{attempt}"


def parse_attempt_key(key: str) -> AttemptKey | None:
    """The attempt a group key names; None for a key no prompt source made."""
    m = _KEY.fullmatch(key)
    if m is None:
        return None
    return AttemptKey(m["source"], int(m["epoch"]), int(m["attempt"]), int(m["prompt"]))


class PromptFence:
    """Exactly one attempt of a prompt trains: in the one sequence of groups every trainer rank agrees on,
    the first group of a prompt that would train claims it, and any other group of that prompt (whatever
    its attempt) is refused while the claim stands. A claim stands once its group trains; a group skipped
    after all (it went stale while it waited) gives its claim back (`release`).

    `trained`: the prompts already trained when the reader resumed (the fold's, as of its committed batch).
    `uncommitted`: per trainer group, the prompts of the batches the log lists and has not seen committed,
    by batch index: the predecessor may have committed some of them just before it died, before its mark
    said so; the reader says where it resumes (`resumed`) and those below count as trained. A function of
    that and of the sequence, so every rank refuses the same groups.
    """

    def __init__(self, trained: Iterable[PromptId] = (),
                 uncommitted: Mapping[str, Mapping[int, Iterable[PromptId]]] | None = None) -> None:
        self._claims: dict[PromptId, str | None] = dict.fromkeys(trained)  # None: trained before the resume
        self._uncommitted = {t: {b: list(p) for b, p in batches.items()}
                             for t, batches in (uncommitted or {}).items()}

    def resumed(self, trainer: str, next_batch: int) -> None:
        """The reader of `trainer` resumes at batch `next_batch`: the batches before it were committed, so
        their prompts trained (whatever the log had folded of that commit when the fence was built)."""
        for batch, prompts in self._uncommitted.pop(trainer, {}).items():
            if batch < next_batch:
                for prompt in prompts:
                    self._claims.setdefault(prompt, None)

    def admit(self, key: str) -> bool:
        """Whether the group keyed `key`, which would otherwise train (neither stale nor invalid), may; a
        group no prompt source made always may. Asking again for the same group gives the same answer."""
        parsed = parse_attempt_key(key)
        if parsed is None:
            return True
        claim = self._claims.setdefault(parsed.prompt_id, key)
        return claim == key

    def refusal(self, key: str) -> str | None:
        """Why the group keyed `key` may not train (None: it may, or it is no prompt source's); unlike
        `admit`, it claims nothing."""
        parsed = parse_attempt_key(key)
        if parsed is None or parsed.prompt_id not in self._claims:
            return None
        claim = self._claims[parsed.prompt_id]
        if claim == key:
            return None
        source, epoch, prompt = parsed.prompt_id
        by = "before the reader resumed" if claim is None else f"as {claim}"
        return f"superseded: prompt {source}@{epoch}/{prompt} trained {by}"

    def release(self, key: str) -> None:
        """The group keyed `key` was skipped after all: its prompt may be claimed by another."""
        parsed = parse_attempt_key(key)
        if parsed is not None and self._claims.get(parsed.prompt_id) == key:
            del self._claims[parsed.prompt_id]
