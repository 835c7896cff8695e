"""A whole loop in one process, for the prompt fold's tests: producers, the stage and a trainer write the
admission-log records they write in production, and one `PromptLog` folds them (docs/loop.md).

Faults are steps: a producer killed with its attempt, frozen past its lease and resumed, a group dead-
lettered or filtered, a group skipped stale, a trainer restarted with batches uncommitted. The trainer
keeps the truth the fold is checked against: which prompts it really trained, how often.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rollout_stream.codec.admission import (
    AdmissionRecord,
    Cancel,
    Dataset,
    Delivered,
    Hello,
    Release,
    Renew,
    Request,
    Resolved,
    Sent,
    TrainerMark,
)
from rollout_stream.core.admission import Outcome
from rollout_stream.core.prompt_keys import AttemptKey, PromptFence, PromptId, parse_attempt_key
from rollout_stream.core.prompts import PromptLog

SOURCE = "gsm8k"
TRAINER = "trainer"


@dataclass
class Producer:
    name: str
    session: int = 0
    frozen: bool = False
    holding: list[tuple[int, AttemptKey, bool]] = field(default_factory=list)  # request, attempt, sent
    waiting: list[int] = field(default_factory=list)  # takes asked and not decided yet (a take's threads)

    @property
    def sid(self) -> str:
        return f"{self.name}-{self.session}"


@dataclass
class World:
    prompts: int
    epochs: int = 1
    max_attempts: int = 3
    groups_per_batch: int = 2
    fold: PromptLog = field(default_factory=PromptLog)
    clock: int = 0
    offset: int = 0
    producers: list[Producer] = field(default_factory=list)
    stage: list[tuple[str, bool]] = field(default_factory=list)  # key, whole
    train_data: list[str] = field(default_factory=list)
    uncommitted: list[list[tuple[str, bool]]] = field(default_factory=list)  # batches: (key, skipped)
    # per uncommitted batch: group key -> [rollouts, loss tokens] staleness by rollout or token left out
    left_out: list[dict[str, list[int]]] = field(default_factory=list)
    committed: int = 0
    trainer_session: int = 0
    fence: PromptFence = field(default_factory=PromptFence)
    trained: Counter[PromptId] = field(default_factory=Counter)  # the truth: committed trainings
    records: list[tuple[int, int, AdmissionRecord]] = field(default_factory=list)  # the log: offset, time

    def __post_init__(self) -> None:
        self.log(Dataset(source=SOURCE, prompts=self.prompts, fingerprint="f", seed=7, epochs=self.epochs,
                         max_attempts=self.max_attempts))
        self._mark(resumed=0)
        for i in range(3):
            p = Producer(f"p{i}")
            self.producers.append(p)
            self.log(Hello(producer=p.name, session=p.sid))

    def log(self, record: AdmissionRecord) -> int:
        self.records.append((self.offset, self.clock, record))
        self.fold.apply(self.offset, self.clock, record)
        self.offset += 1
        for p in self.producers:
            for request in list(p.waiting):
                decision = self.fold.decided.get(request)
                if decision is None:
                    continue
                p.waiting.remove(request)
                attempt = self.fold.attempt_of(request)
                if decision.outcome is Outcome.ADMITTED and attempt is not None:
                    p.holding.append((request, attempt, False))
        return self.offset - 1

    # ---- time ------------------------------------------------------------------------------------
    def tick(self, ms: int) -> None:
        """`ms` of log time pass; live producers renew every second of it, the trainer marks."""
        end = self.clock + ms
        while self.clock < end:
            self.clock = min(end, self.clock + 1000)
            for p in self.producers:
                if not p.frozen:
                    self.log(Renew(producer=p.name, session=p.sid))

    # ---- producers -------------------------------------------------------------------------------
    def take(self, i: int, *, wait: bool = False) -> None:
        """A take; `wait`: one not granted at once stays asked (another thread of the process waits on it)
        and is granted when the fold hands it a prompt."""
        p = self.producers[i]
        if p.frozen:
            return
        request = self.log(Request(producer=p.name, session=p.sid, trainer=TRAINER, weight_version=0,
                                   max_policy_lag=None, max_unconsumed_groups=None, source=SOURCE))
        decision = self.fold.decided.get(request)
        if decision is not None and decision.outcome is Outcome.ADMITTED:
            attempt = self.fold.attempt_of(request)
            assert attempt is not None
            p.holding.append((request, attempt, False))
        elif decision is None and wait:
            p.waiting.append(request)
        elif decision is None:  # nothing to hand out now
            self.log_cancel(p, request)

    def log_cancel(self, p: Producer, request: int) -> None:
        self.log(Cancel(producer=p.name, session=p.sid, request=request))

    def send(self, i: int, *, whole: bool = True) -> None:
        """The producer names its oldest group and sends it (`whole`: every record; else it dies half way)."""
        p = self.producers[i]
        if p.frozen or not p.holding:
            return
        request, attempt, _ = p.holding.pop(0)
        self.log(Sent(producer=p.name, session=p.sid, request=request, key=str(attempt)))
        self.stage.append((str(attempt), whole))
        if whole:
            self.log(Delivered(producer=p.name, session=p.sid, request=request))

    def fail(self, i: int, error: str = "KeyError: 'answer'") -> None:
        """The producer raised while holding its oldest attempt, nothing of it sent: it fails it in the log
        (`PromptSource.fail`, or an exception leaving its `with` block)."""
        p = self.producers[i]
        if p.frozen or not p.holding or p.holding[0][2]:
            return
        request, _, _ = p.holding.pop(0)
        self.log(Release(producer=p.name, session=p.sid, requests=[request], error=error))

    def freeze_mid_send(self, i: int) -> None:
        """Named and half sent, then frozen: the rest of its records arrive when it resumes."""
        p = self.producers[i]
        if p.frozen or not p.holding:
            return
        request, attempt, _ = p.holding[0]
        self.log(Sent(producer=p.name, session=p.sid, request=request, key=str(attempt)))
        p.holding[0] = (request, attempt, True)
        p.frozen = True

    def freeze(self, i: int) -> None:
        """SIGSTOP: it holds what it took and its takes stay asked; it renews nothing."""
        self.producers[i].frozen = True

    def resume(self, i: int, *, same_session: bool = False) -> None:
        """SIGCONT. `same_session`: its late renewal goes on with the session (the gate drops what the log
        no longer holds); else it restarts its session."""
        p = self.producers[i]
        if not p.frozen:
            return
        p.frozen = False
        if p.holding and p.holding[0][2]:  # the group half sent before the freeze completes now
            request, attempt, _ = p.holding.pop(0)
            self.stage.append((str(attempt), True))
            self.log(Delivered(producer=p.name, session=p.sid, request=request))
        if same_session:
            self.log(Renew(producer=p.name, session=p.sid))
            p.holding = [h for h in p.holding if self.fold.attempt_of(h[0]) == h[1]]
            return
        # what it held unsent: its gate refuses to send on a lapsed lease (AdmissionRevoked)
        p.holding.clear()
        p.waiting.clear()
        p.session += 1
        self.log(Hello(producer=p.name, session=p.sid))

    def kill(self, i: int) -> None:
        """kill -9 and restart: what it held is lost; the new session's Hello ends the old one."""
        p = self.producers[i]
        if p.holding and p.holding[0][2]:
            self.stage.append((str(p.holding[0][1]), False))
        p.holding.clear()
        p.waiting.clear()
        p.frozen = False
        p.session += 1
        self.log(Hello(producer=p.name, session=p.sid))

    # ---- the stage -------------------------------------------------------------------------------
    def stage_step(self, verdict: str = "publish") -> None:
        """The stage decides its oldest group: published, or resolved with a reason (an incomplete group
        always times out)."""
        if not self.stage:
            return
        key, whole = self.stage.pop(0)
        if not whole:
            self.log(Resolved(keys=[key], reason="incomplete_group"))
        elif verdict == "publish":
            self.train_data.append(key)
        else:
            self.log(Resolved(keys=[key], reason=verdict))

    # ---- the trainer -----------------------------------------------------------------------------
    def train_batch(self, stale: list[bool], left_out: dict[int, tuple[int, int]] | None = None) -> None:
        """Take the next batch: a group judged stale is skipped, one the fence refuses too; `left_out`: by
        place in the batch, the rollouts and loss tokens staleness by rollout or token left out of a group
        that trains."""
        batch: list[tuple[str, bool]] = []
        good = 0
        while self.train_data and good < self.groups_per_batch:
            key = self.train_data.pop(0)
            skip = (stale.pop(0) if stale else False) or not self.fence.admit(key)
            if skip:
                self.fence.release(key)
            batch.append((key, skip))
            good += not skip
        if batch:
            self.uncommitted.append(batch)
            self.left_out.append({batch[n][0]: list(parts) for n, parts in (left_out or {}).items()})
            self._mark()

    def commit(self) -> None:
        for batch in self.uncommitted:
            for key, skipped in batch:
                parsed = parse_attempt_key(key)
                if not skipped and parsed is not None:
                    self.trained[parsed.prompt_id] += 1
        self.committed += len(self.uncommitted)
        self.uncommitted, self.left_out = [], []
        self._mark(committed=True)

    def restart_trainer(self) -> None:
        """kill -9: uncommitted batches are read again; the fence starts from what the fold says trained."""
        again = [key for batch in self.uncommitted for key, _ in batch]
        self.train_data[:0] = again
        self.uncommitted, self.left_out = [], []
        self.trainer_session += 1
        self._mark(resumed=self.committed)
        self.fence = PromptFence(self.fold.trained(SOURCE))

    def _mark(self, *, committed: bool = False, resumed: int | None = None) -> None:
        first = self.committed
        consumed = {first + i: [k for k, _ in b] for i, b in enumerate(self.uncommitted)}
        skipped = {first + i: [k for k, s in b if s] for i, b in enumerate(self.uncommitted)}
        self.log(TrainerMark(trainer=TRAINER, session=f"t{self.trainer_session}", weight_version=0,
                             batch_version=0, batches=first + len(self.uncommitted),
                             groups_per_batch=self.groups_per_batch, max_weight_staleness=None,
                             consumed=consumed, skipped={b: k for b, k in skipped.items() if k},
                             excluded={first + i: x for i, x in enumerate(self.left_out) if x},
                             committed_batch=first if committed or resumed is not None else None,
                             resumed_from=resumed))

    # ---- to the end ------------------------------------------------------------------------------
    def drain(self, max_rounds: int = 2000) -> None:
        """No more faults: resume, take, send, publish, train and commit until nothing is left."""
        for i in range(len(self.producers)):
            self.resume(i)
        for _ in range(max_rounds):
            self.tick(31_000)  # long enough for any lease to end
            for i in range(len(self.producers)):
                self.take(i)
                self.send(i)
            while self.stage:
                self.stage_step()
            while self.train_data:
                self.train_batch([])
            self.commit()
            if self.done():
                return
        raise AssertionError("the loop did not settle every prompt")

    def done(self) -> bool:
        status = self.fold.status(SOURCE)
        return (len(status) == self.epochs and all(s.waiting == 0 and s.in_flight == 0 for s in status)
                and not self.stage and not self.train_data)
