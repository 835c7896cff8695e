"""The prompt source's fold, pure: which prompt each admission carries, and where every prompt of every
epoch stands (docs/loop.md).

`PromptLog` is the admission fold (`rollout_stream.core.admission.AdmissionLog`) with prompts added: a
`Request` that names a declared source (`Dataset`) is admitted only with a prompt, the next re-issued one
first, else the next of its epoch's seeded order. Every party folds the same log, so every party hands out the
same prompt for the same request, and the log is the checkpoint.

A prompt is in exactly one `PromptState`. An attempt that ends without a result (its lease ended before
delivery, its process failed while holding it, its group timed out at the stage, a committed batch skipped
it, nobody consumed it for the sent expiry) puts its prompt back to waiting, until `max_attempts` such ends
make it exhausted. A lapse is the process's, not the prompt's: a take of a process whose lease has run out is
handed nothing until it renews, so a frozen process's own waiting takes cannot spend the prompt it lost.
Exhaustion waits while a lapsed attempt's sent group may still train, so an exhausted prompt does not train
after all; the one exception, a group trained past the sent expiry, is counted (`late_trained`) and the
prompt becomes trained. A second training of a trained prompt is counted (`duplicates`): the reader's fence
(`rollout_stream.core.prompt_keys.PromptFence`) is what keeps it at zero.
"""

from __future__ import annotations

import numpy as np

from rollout_stream.codec.admission import (
    AdmissionRecord,
    Checkpoint,
    Dataset,
    Delivered,
    Release,
    Request,
    Resolved,
    Sent,
    TrainerMark,
)
from rollout_stream.core.admission import AdmissionLog, AdmittedGroup, Decision
from rollout_stream.core.prompt_keys import AttemptKey, PromptId, parse_attempt_key, valid_source
from rollout_stream.core.prompt_records import (
    COUNTED,
    Attempt,
    AttemptEnd,
    Epoch,
    EpochStatus,
    Exhausted,
    PromptRecord,
    PromptState,
    SourceState,
    epoch_order,
    epoch_permutation,
)

__all__ = ["EXHAUSTED_REASON", "RETRY_REASONS", "Attempt", "AttemptEnd", "EpochStatus", "Exhausted",
           "PromptLog", "PromptRecord", "PromptState", "SourceState", "epoch_order"]

# Dead-letter reasons that say the attempt failed, not the prompt: it is tried again.
RETRY_REASONS = frozenset({"incomplete_group", "incomplete_chunks"})
ZERO_VARIANCE = "zero_variance"
EXHAUSTED_REASON = "prompt_attempts_exhausted"


class PromptLog(AdmissionLog):
    """The admission fold with a prompt source's decisions: `apply` each record in offset order."""

    def __init__(self, **limits: int) -> None:
        super().__init__(**limits)
        self.sources: dict[str, SourceState] = {}
        self.live: dict[int, tuple[str, int, int]] = {}  # request -> its live attempt's (source, epoch, row)
        self.uncommitted: dict[str, dict[int, dict[str, bool]]] = {}  # trainer -> batch -> key -> skipped
        # trainer -> batch -> key -> (rollouts, loss tokens) staleness left out of a group that trains
        self.excluded: dict[str, dict[int, dict[str, tuple[int, int]]]] = {}
        self.trainer_sessions: dict[str, str] = {}
        self.settled_through: dict[str, int] = {}  # trainer -> batches below it are settled
        self.duplicates = 0  # trainings of a prompt already trained (the reader's fence keeps it at 0)
        self.late_trained = 0  # exhausted prompts that trained after all
        self.checkpointed_through = -1  # the newest checkpoint record folded holds the state through here
        self._orders: dict[tuple[str, int], np.ndarray] = {}  # derived, not state
        self._failing: dict[int, str] = {}  # while a failure's Release is folded: request -> error

    # ---- the fold --------------------------------------------------------------------------------
    def apply(self, offset: int, log_ms: int, record: AdmissionRecord) -> list[Decision]:
        if offset < self.next_offset:
            return []
        if isinstance(record, Dataset):  # before the scan, so waiting takes can be granted at once
            self._declare(record)
        if isinstance(record, Release) and record.error is not None and record.requests:
            # the admission fold drops the unsent groups as for any release; `_dropped` ends them as failed
            self._failing = dict.fromkeys(record.requests, record.error)
            try:
                decisions = super().apply(offset, log_ms, record)
            finally:
                self._failing = {}
            self._failed_sent(record)
            self._deferred_due()
            return decisions
        decisions = super().apply(offset, log_ms, record)
        self._deferred_due()
        if isinstance(record, Sent | Delivered):
            attempt = self._live_attempt(record.request)
            if attempt is not None and attempt.session == record.session:
                attempt.sent = True
                attempt.delivered = attempt.delivered or isinstance(record, Delivered)
        elif isinstance(record, Resolved):
            self._resolved(record)
        elif isinstance(record, TrainerMark):
            self._trainer_mark(record)
        elif isinstance(record, Checkpoint):
            self.checkpointed_through = max(self.checkpointed_through, record.through)
        return decisions

    def tick(self, offset: int, log_ms: int) -> list[Decision]:
        decisions = super().tick(offset, log_ms)
        self._deferred_due()
        return decisions

    def _declare(self, d: Dataset) -> None:
        current = self.sources.get(d.source)
        if current is None:
            # a declaration nothing can be taken from is not one: a corrected process's declaration stands
            if (valid_source(d.source) and d.prompts >= 1 and d.max_attempts >= 1
                    and (d.epochs is None or d.epochs >= 1)):
                self.sources[d.source] = SourceState(d)
        elif current.dataset != d:
            current.refused += 1

    def _granted(self, request: int, r: Request) -> bool:
        if r.source is None:
            return True
        src = self.sources.get(r.source)
        if src is None:
            return False  # its source is not declared yet
        if r.producer in self._suspected:
            # its lease ran out (frozen, starved): what it was granted now would be revoked at the next record
            # and charged to the prompt, so a frozen process's waiting takes would spend the prompt it just
            # lost. It waits until its session renews, or ends with it.
            return False
        picked = self._next(r.source, src)
        if picked is None:
            return False  # nothing to hand out now: it waits for a re-issue (or is cancelled)
        epoch, prompt = picked
        rec = src.epochs[epoch].prompts.setdefault(prompt, PromptRecord(PromptState.WAITING))
        rec.state = PromptState.IN_FLIGHT
        rec.attempts.append(Attempt(len(rec.attempts) + 1, request, r.producer, r.session, self.clock_ms))
        self.live[request] = (r.source, epoch, prompt)
        return True

    def _next(self, name: str, src: SourceState) -> tuple[int, int] | None:
        while src.retry:
            epoch, prompt = src.retry.pop(0)
            rec = src.epochs[epoch].prompts.get(prompt)
            if rec is not None and rec.state is PromptState.WAITING:  # a waiting prompt is never shrunk
                return epoch, prompt
            # settled while it waited: a lapsed attempt's group still made it
        n = src.dataset.prompts
        if n == 0:
            return None
        if not src.epochs or src.epochs[-1].cursor >= n:
            if src.dataset.epochs is not None and len(src.epochs) >= src.dataset.epochs:
                return None
            src.epochs.append(Epoch())
        epoch = len(src.epochs) - 1
        e = src.epochs[epoch]
        e.cursor += 1
        return epoch, int(self.order(name, epoch)[e.cursor - 1])

    def order(self, name: str, epoch: int) -> np.ndarray:
        """Epoch `epoch`'s order of source `name` (`epoch_permutation`, cached)."""
        cached = self._orders.get((name, epoch))
        if cached is None:
            d = self.sources[name].dataset
            if len(self._orders) > 4:
                self._orders.clear()
            cached = self._orders[(name, epoch)] = epoch_permutation(d.prompts, d.seed, epoch)
        return cached

    # ---- attempts ending -------------------------------------------------------------------------
    def _revoked(self, request: int, group: AdmittedGroup) -> None:
        attempt = self._live_attempt(request)
        if attempt is not None and not attempt.delivered:
            self._end(request, AttemptEnd.LEASE)

    def _dropped(self, request: int, group: AdmittedGroup) -> None:
        attempt = self._live_attempt(request)
        if attempt is None:
            return
        if not attempt.sent:
            error = self._failing.get(request)
            if error is not None:
                attempt.error = error
            self._end(request, AttemptEnd.RELEASED if error is None else AttemptEnd.FAILED)
        else:
            self._end(request, AttemptEnd.UNCONSUMED if attempt.delivered else AttemptEnd.LEASE)

    def _failed_sent(self, record: Release) -> None:
        """A failure of an attempt whose group is sent already: the group may still complete, so the attempt
        goes on (its group's fate ends it); the error is kept for whoever looks."""
        for request in record.requests or ():
            attempt = self._live_attempt(request)
            if attempt is not None and attempt.session == record.session and attempt.error is None:
                attempt.error = record.error

    def _resolved(self, record: Resolved) -> None:
        if record.reason == EXHAUSTED_REASON:  # a prompt source's marker: the dead-letter records are written
            self._recorded(record.keys)
            return
        for key in record.keys:
            found = self._by_key(key)
            if found is None:
                continue
            parsed, rec, attempt = found
            if attempt.ended is not None or rec.state.final:
                self._group_ended(parsed, rec, attempt)
                continue  # an attempt that already ended says nothing more, but its group cannot train
            request = attempt.request
            if record.reason in RETRY_REASONS:
                self._end(request, AttemptEnd.INCOMPLETE)
            elif record.reason == ZERO_VARIANCE:
                self._settle(parsed, rec, attempt, PromptState.FILTERED, AttemptEnd.FILTERED, None)
                src = self.sources[parsed.source]
                src.refills += 1  # the next take of the source is another prompt: a refill
                src.refills_pending += 1
            else:
                self._settle(parsed, rec, attempt, PromptState.DEAD_LETTERED, AttemptEnd.DEAD_LETTERED,
                             record.reason)

    def _trainer_mark(self, mark: TrainerMark) -> None:
        pending = self.uncommitted.setdefault(mark.trainer, {})
        session = self.trainer_sessions.get(mark.trainer)
        if session is not None and session != mark.session:
            # a restarted reader: what its predecessor committed stands, the rest it reads again
            resumed = mark.resumed_from if mark.resumed_from is not None else -1
            for batch in sorted(b for b in pending if 0 <= b < resumed):
                self._settle_batch(mark.trainer, batch, pending.pop(batch))
            pending.clear()
            self.excluded.pop(mark.trainer, None)
            self.settled_through[mark.trainer] = resumed
        self.trainer_sessions[mark.trainer] = mark.session
        settled = self.settled_through.get(mark.trainer, 0)
        for batch, keys in mark.consumed.items():
            if 0 <= batch < settled:
                continue  # listed again after its commit was folded
            skipped = set(mark.skipped.get(batch, ()))
            listed = pending.setdefault(batch, {})
            for key in keys:
                if parse_attempt_key(key) is not None:
                    listed[key] = key in skipped
            left_out = {k: (int(v[0]), int(v[1])) for k, v in mark.excluded.get(batch, {}).items()
                        if k in listed and len(v) == 2}
            if left_out:
                self.excluded.setdefault(mark.trainer, {})[batch] = left_out
        if mark.committed_batch is not None:
            for batch in sorted(b for b in pending if b < mark.committed_batch):
                self._settle_batch(mark.trainer, batch, pending.pop(batch))
            self.settled_through[mark.trainer] = max(settled, mark.committed_batch)

    def _settle_batch(self, trainer: str, batch: int, keys: dict[str, bool]) -> None:
        # what trained first: a group of its prompt skipped in the same batch (fenced) re-issues nothing
        fed: set[str] = set()  # sources this batch trained a group of
        by_trainer = self.excluded.get(trainer)
        left_out = by_trainer.pop(batch, {}) if by_trainer is not None else {}
        if by_trainer is not None and not by_trainer:
            del self.excluded[trainer]
        for key, skipped in sorted(keys.items(), key=lambda item: item[1]):
            found = self._by_key(key)
            if found is None:
                continue
            parsed, rec, attempt = found
            if skipped:
                if attempt.ended is None:
                    self._end(attempt.request, AttemptEnd.SKIPPED)
                else:
                    self._group_ended(parsed, rec, attempt)
                continue
            if rec.state is PromptState.TRAINED:
                self.duplicates += 1
                continue
            if rec.state is PromptState.EXHAUSTED:
                self.late_trained += 1
                self._unexhausted(parsed)
            attempt.trainer, attempt.batch = trainer, batch
            rollouts, tokens = left_out.get(key, (0, 0))
            if rollouts or tokens:  # a group trains if any of it does; what was left out is said
                attempt.excluded_rollouts, attempt.excluded_tokens = rollouts, tokens
                ep = self.sources[parsed.source].epochs[parsed.epoch]
                ep.partial += 1
                ep.excluded_rollouts += rollouts
                ep.excluded_tokens += tokens
            self._settle(parsed, rec, attempt, PromptState.TRAINED, AttemptEnd.TRAINED, None)
            fed.add(parsed.source)
        for name in fed:  # the refills since the source's previous batch went into this one
            src = self.sources[name]
            src.batch_refills[src.refills_pending] = src.batch_refills.get(src.refills_pending, 0) + 1
            src.refills_pending = 0

    def _settle(self, key: AttemptKey, rec: PromptRecord, attempt: Attempt, state: PromptState,
                end: AttemptEnd, reason: str | None) -> None:
        for a in rec.attempts:
            if a.ended is None:
                self.live.pop(a.request, None)
                a.ended, a.ended_ms = (end if a is attempt else AttemptEnd.SUPERSEDED), self.clock_ms
        if attempt.ended is not end:  # it had ended (lapsed) and still made it
            attempt.ended, attempt.ended_ms = end, self.clock_ms
        was_final = rec.state.final
        rec.state, rec.reason = state, reason
        if not was_final:
            src = self.sources[key.source]
            if src.deferred:
                src.deferred = [d for d in src.deferred if (d[0], d[1]) != (key.epoch, key.prompt)]
            src.epochs[key.epoch].finalized(key.prompt, src.dataset.prompts)

    def _end(self, request: int, end: AttemptEnd) -> None:
        """The live attempt admitted by `request` ended without a result: hand its prompt out again."""
        name, epoch, prompt = self.live.pop(request)
        src = self.sources[name]
        rec = src.epochs[epoch].prompts[prompt]
        attempt = rec.attempts[-1]
        attempt.ended, attempt.ended_ms = end, self.clock_ms
        if rec.state.final:
            return
        if sum(a.ended in COUNTED for a in rec.attempts) >= src.dataset.max_attempts:
            if any(_may_train(a) for a in rec.attempts):
                # a lapsed attempt's group is out there: exhausted now, it could still train after its
                # dead-letter record; in flight until its fate is known, or until the sent expiry
                src.deferred.append([epoch, prompt, self.clock_ms + self.sent_expiry_ms])
                return
            self._exhaust(src, epoch, prompt, rec)
            return
        rec.state = PromptState.WAITING
        if end is AttemptEnd.RELEASED:
            src.retry.insert(0, [epoch, prompt])  # never started: it keeps its place at the front
        else:
            src.retry.append([epoch, prompt])
            src.reissued += 1
            e = src.epochs[epoch]
            e.reissued += 1
            e.reissued_by[end.value] = e.reissued_by.get(end.value, 0) + 1

    def _exhaust(self, src: SourceState, epoch: int, prompt: int, rec: PromptRecord) -> None:
        rec.state, rec.reason = PromptState.EXHAUSTED, EXHAUSTED_REASON
        src.unrecorded.append(Exhausted(epoch, prompt, list(rec.attempts), self.next_offset - 1,
                                        self.clock_ms))
        src.epochs[epoch].finalized(prompt, src.dataset.prompts)

    def _group_ended(self, key: AttemptKey, rec: PromptRecord, attempt: Attempt) -> None:
        """An ended attempt's group was resolved or skipped: it cannot train. A prompt whose exhaustion waited
        on it is exhausted once no attempt's group can train."""
        if not _may_train(attempt):
            return
        attempt.group_ended = True
        src = self.sources[key.source]
        if rec.state.final or any(_may_train(a) for a in rec.attempts):
            return
        before = len(src.deferred)
        src.deferred = [d for d in src.deferred if (d[0], d[1]) != (key.epoch, key.prompt)]
        if len(src.deferred) < before:
            self._exhaust(src, key.epoch, key.prompt, rec)

    def _deferred_due(self) -> None:
        """Deferred exhaustions whose lapsed groups had the sent expiry to arrive: given up on."""
        for src in self.sources.values():
            while src.deferred and src.deferred[0][2] <= self.clock_ms:  # due times grow with the clock
                epoch, prompt, _ = src.deferred.pop(0)
                self._exhaust(src, epoch, prompt, src.epochs[epoch].prompts[prompt])

    # ---- the exhausted prompts' dead-letter records -----------------------------------------------
    def _recorded(self, keys: list[str]) -> None:
        """A marker: the dead-letter records of these exhausted prompts (keys of their last attempts) are
        written. The first marker of a prompt counts; a later one finds nothing to remove."""
        for key in keys:
            parsed = parse_attempt_key(key)
            src = None if parsed is None else self.sources.get(parsed.source)
            if parsed is None or src is None:
                continue
            before = len(src.unrecorded)
            src.unrecorded = [x for x in src.unrecorded
                              if (x.epoch, x.prompt) != (parsed.epoch, parsed.prompt)]
            src.recorded += before - len(src.unrecorded)

    def _unexhausted(self, key: AttemptKey) -> None:
        """An exhausted prompt trained after all: a record not written yet is not written."""
        src = self.sources[key.source]
        src.unrecorded = [x for x in src.unrecorded if (x.epoch, x.prompt) != (key.epoch, key.prompt)]

    def unrecorded(self, source: str) -> list[Exhausted]:
        """Exhausted prompts of `source` whose dead-letter record is not in the log yet, oldest first."""
        src = self.sources.get(source)
        return [] if src is None else list(src.unrecorded)

    # ---- lookups ---------------------------------------------------------------------------------
    def _live_attempt(self, request: int) -> Attempt | None:
        where = self.live.get(request)
        if where is None:
            return None
        name, epoch, prompt = where
        return self.sources[name].epochs[epoch].prompts[prompt].attempts[-1]

    def _by_key(self, key: str) -> tuple[AttemptKey, PromptRecord, Attempt] | None:
        parsed = parse_attempt_key(key)
        rec = None if parsed is None else self.prompt(parsed.source, parsed.epoch, parsed.prompt)
        if rec is None or parsed is None or not 1 <= parsed.attempt <= len(rec.attempts):
            return None  # not a prompt's, or its epoch is compacted (no attempts kept)
        return parsed, rec, rec.attempts[parsed.attempt - 1]

    def prompt(self, source: str, epoch: int, prompt: int) -> PromptRecord | None:
        """One prompt's record (None: its epoch has not handed it out yet)."""
        src = self.sources.get(source)
        if src is None or not 0 <= epoch < len(src.epochs):
            return None
        return src.epochs[epoch].record(prompt)

    def attempt_of(self, request: int) -> AttemptKey | None:
        """The attempt an admitted request carries (None: not a take, or it has ended)."""
        where = self.live.get(request)
        if where is None:
            return None
        name, epoch, prompt = where
        rec = self.sources[name].epochs[epoch].prompts[prompt]
        return AttemptKey(name, epoch, rec.attempts[-1].number, prompt)

    def ended_attempt(self, request: int) -> AttemptKey | None:
        """The attempt `request` carried, if it has ended already: its producer's lease ended between the
        admission and the producer reading it (a process paused inside a take). None: no such attempt."""
        for name, src in self.sources.items():
            for number, ep in enumerate(src.epochs):
                for row, rec in ep.prompts.items():
                    for attempt in rec.attempts:
                        if attempt.request == request and attempt.ended is not None:
                            return AttemptKey(name, number, attempt.number, row)
        return None

    def trained(self, source: str) -> set[PromptId]:
        """Every trained prompt of `source`: what a resuming reader's fence starts from."""
        src = self.sources.get(source)
        if src is None:
            return set()
        return {(source, e, p) for e, ep in enumerate(src.epochs) for p in ep.rows(PromptState.TRAINED)}

    def status(self, source: str) -> list[EpochStatus]:
        """Per epoch handed out so far: how many prompts are in each state."""
        src = self.sources.get(source)
        if src is None:
            return []
        out = []
        for number, ep in enumerate(src.epochs):
            counts, dead = ep.tally()
            out.append(EpochStatus(number, src.dataset.prompts,
                                   counts[PromptState.WAITING] + src.dataset.prompts - ep.cursor,
                                   counts[PromptState.IN_FLIGHT], counts[PromptState.TRAINED], dead,
                                   counts[PromptState.FILTERED], counts[PromptState.EXHAUSTED], ep.reissued,
                                   dict(sorted(ep.reissued_by.items())), ep.partial, ep.excluded_rollouts,
                                   ep.excluded_tokens))
        return out


def _may_train(attempt: Attempt) -> bool:
    """An attempt ended by its lease whose group was sent, and whose group's fate is not known yet."""
    return attempt.ended is AttemptEnd.LEASE and attempt.sent and not attempt.group_ended
