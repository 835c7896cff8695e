"""What real runs bring to a prompt source, on the in-memory cluster: a row that makes the process raise,
wrong settings, a take with nothing free, a log that does not fold, a group published in parts
(docs/loop.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from rich.console import Console

from rollout_stream.clients import Connection
from rollout_stream.codec import Sample, decode_sample
from rollout_stream.codec.admission import Dataset, Delivered, Release, decode_admission
from rollout_stream.core.prompts import AttemptEnd, PromptState, epoch_order
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka.memory import MemoryClient, MemoryCluster
from rollout_stream.ops.prompts import prompt_json, render_prompt
from rollout_stream.pacing import PacingTimeout
from rollout_stream.prompts import (
    DatasetError,
    LogNotFolded,
    NothingToTake,
    PromptSource,
    SourceFinished,
)

LOG = "train-data.admission"
ROWS = [{"prompt": f"what is {i} + {i}?", "answer": 2 * i} for i in range(4)]
POISON = epoch_order(len(ROWS), 3, 0)[0]  # the first prompt the epoch hands out
POISONED = [{"prompt": "no answer here"} if i == POISON else row for i, row in enumerate(ROWS)]


def cluster() -> MemoryCluster:
    c = MemoryCluster()
    c.create_topic("rollouts", 1)
    c.create_topic("rollouts-dlq", 1)
    return c


def source(c: MemoryCluster, name: str = "p0", rows: object = ROWS, **settings: object) -> PromptSource:
    return PromptSource(Connection("memory:9092"), rows, name="sums", trainer_group_id="trainer",  # type: ignore[arg-type]
                        producer_id=name, check=False, kafka_client=MemoryClient(c), seed=3, **settings)  # type: ignore[arg-type]


def log(c: MemoryCluster) -> list[object]:
    return [decode_admission(r.value or b"") for r in c.records(LOG)]


def generate(row: dict[str, object], n: int = 2) -> list[Sample]:
    return [Sample(group_index=0, index=i, rollout_id=i, reward=float(row["answer"] == 2))  # type: ignore[arg-type]
            for i in range(n)]


def rollout_process(c: MemoryCluster, run: int) -> None:
    """One run of a rollout process: take, generate, publish, until its row raises."""
    with source(c, f"p{run}", POISONED, max_attempts=3) as s:
        while True:
            lease = s.take(timeout=5)
            s.publish(lease, generate(lease.row))


def wait(check: object, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_poison_row_is_exhausted_after_its_failed_attempts_and_the_run_goes_on() -> None:
    """A row without the key the rollout reads: each process that takes it raises inside its `with`. Each
    time the attempt ends as failed with the KeyError in the log; the third makes the prompt exhausted, its
    dead-letter record lists the three errors, and the next process takes the other prompts."""
    c = cluster()
    for run in range(3):
        with pytest.raises(KeyError, match="answer"):
            rollout_process(c, run)
    failures = [r for r in log(c) if isinstance(r, Release) and r.error is not None]
    assert [r.error for r in failures] == ["KeyError: 'answer'"] * 3
    with source(c, "p3", POISONED, max_attempts=3) as s:
        rec = s.gate.follower.read(lambda f: f.prompt("sums", 0, POISON))
        assert rec.state is PromptState.EXHAUSTED
        assert [(a.ended, a.error) for a in rec.attempts] == [(AttemptEnd.FAILED, "KeyError: 'answer'")] * 3
        detail = prompt_json("sums", 0, POISON, rec)
        assert [a["error"] for a in detail["attempts"]] == ["KeyError: 'answer'"] * 3
        assert all(a["taken_at"].endswith("Z") and "T" in a["taken_at"] for a in detail["attempts"])
        console = Console(record=True, width=160)
        console.print(render_prompt(detail))
        shown = console.export_text()
        assert "attempt 3 error: KeyError: 'answer'" in shown and "taken (UTC)" in shown
        assert detail["attempts"][0]["taken_at"][:4] in shown  # a year, not epoch milliseconds
        taken = [s.take(timeout=5) for _ in range(3)]  # the run goes on: every other prompt
        assert sorted(x.key.prompt for x in taken) == sorted(set(range(4)) - {POISON})
        for lease in taken:
            s.publish(lease, generate(lease.row))
        wait(lambda: not s.exhausted.pending(), "the exhausted prompt's record written")
    [dead] = c.records("rollouts-dlq")
    value = json.loads(dead.value or b"")
    assert [(a["ended"], a["error"]) for a in value["attempts"]] == [("failed", "KeyError: 'answer'")] * 3
    assert "failed (KeyError: 'answer')" in dict(dead.headers or [])["x-dlq-message"].decode()


def test_fail_ends_one_lease_as_failed_and_give_back_stays_free() -> None:
    c = cluster()
    with source(c, max_attempts=2) as s:
        bad, other = s.take(timeout=5), s.take(timeout=5)
        assert s.fail(bad, ValueError("row 3: no image")) is True
        assert s.fail(bad, ValueError("again")) is False  # not held any more: nothing written
        s.give_back(other)
        wait(lambda: s.gate.follower.read(lambda f: f.attempt_of(other.request)) is None, "folded")
        ends = [s.gate.follower.read(lambda f, x=x: f.prompt("sums", 0, x.key.prompt).attempts[0])
                for x in (bad, other)]
        assert [(a.ended, a.error) for a in ends] == [(AttemptEnd.FAILED, "ValueError: row 3: no image"),
                                                      (AttemptEnd.RELEASED, None)]
        assert [s.take(timeout=5).key.prompt for _ in range(2)] == [other.key.prompt, bad.key.prompt]


def test_an_operator_s_stop_gives_the_held_leases_back_free() -> None:
    c = cluster()
    with pytest.raises(KeyboardInterrupt):
        with source(c) as s:
            held = s.take(timeout=5)
            raise KeyboardInterrupt
    assert not [r for r in log(c) if isinstance(r, Release) and r.error is not None]
    with source(c, "p1") as again:
        assert (again.take(timeout=5).key.prompt, held.key.prompt) == (held.key.prompt, held.key.prompt)


def test_an_exception_after_the_group_went_out_costs_nothing_more() -> None:
    c = cluster()
    with pytest.raises(RuntimeError):
        with source(c) as s:
            lease = s.take(timeout=5)
            s.publish(lease, generate(lease.row))
            raise RuntimeError("the trainer said no")
    assert not [r for r in log(c) if isinstance(r, Release) and r.error is not None]


@pytest.mark.parametrize(("settings", "message"), [
    ({"epochs": 0}, "epochs must be at least 1"),
    ({"epochs": -1}, "epochs must be at least 1"),
    ({"max_attempts": 0}, "max_attempts must be at least 1"),
    ({"rows": []}, "no rows"),
    ({"max_policy_lag": -1}, "max_policy_lag"),
])
def test_wrong_settings_are_refused_before_anything_is_written(settings: dict[str, object],
                                                               message: str) -> None:
    c = cluster()
    with pytest.raises(ConfigurationError, match=message) as refused:
        source(c, **settings)
    assert "\n" not in str(refused.value)
    assert c.records(LOG) == []
    with source(c) as s:  # the corrected process is not refused over it
        assert s.take(timeout=5).key.attempt == 1


def test_an_empty_dataset_file_is_refused_naming_it(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    c = cluster()
    with pytest.raises(DatasetError, match=f"dataset {empty}: no rows"):
        source(c, rows=empty)
    assert c.records(LOG) == []


def test_a_declaration_of_zero_epochs_an_older_version_wrote_does_not_refuse_the_corrected_one() -> None:
    from rollout_stream.pacing import AdmissionWriter, ensure_admission_topic
    from rollout_stream.prompts import fingerprint

    c = cluster()
    ensure_admission_topic(Connection("memory:9092"), LOG, MemoryClient(c))
    writer = AdmissionWriter(Connection("memory:9092"), LOG, MemoryClient(c))
    writer.append(Dataset(source="sums", prompts=len(ROWS), fingerprint=fingerprint(ROWS), seed=3, epochs=0))
    writer.close()
    with source(c, epochs=1) as s:
        assert s.take(timeout=5).key.epoch == 0


def test_a_take_with_every_prompt_in_flight_elsewhere_says_so() -> None:
    c = cluster()
    with source(c, "p0", ROWS[:1], epochs=1) as a, source(c, "p1", ROWS[:1], epochs=1) as b:
        a.take(timeout=5)
        started = time.monotonic()
        with pytest.raises(NothingToTake, match="in flight") as caught:
            b.take(timeout=0.5)
        assert time.monotonic() - started < 15
        assert "trainer" not in str(caught.value)
        assert isinstance(caught.value, PacingTimeout)  # what a caller of take catches for any timeout
    with source(c, "p2", ROWS[:1], epochs=1) as again:  # the holder closed: its lease came back
        assert again.take(timeout=5).key.attempt == 2
        with pytest.raises(NothingToTake):
            again.take(timeout=0.5)


def test_a_source_whose_log_does_not_fold_to_its_declaration_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not `DatasetMismatch` over a declaration it has not read: how far the fold got, and that it stalled."""
    from rollout_stream.kafka.memory._consumers import MemoryAssignedConsumer

    monkeypatch.setattr("rollout_stream.prompts.source.FOLD_STALL_S", 0.3)
    original = MemoryAssignedConsumer.poll

    def stalled(self: MemoryAssignedConsumer, timeout_s: float, max_records: int | None = None) -> object:
        if any(tp.topic == LOG and (state.position or 0) >= 1 for tp, state in self._assignment.items()):
            time.sleep(timeout_s)  # the log's reader gets nothing past its first record
            return {}
        return original(self, timeout_s, max_records)

    monkeypatch.setattr(MemoryAssignedConsumer, "poll", stalled)
    c = cluster()
    with pytest.raises(LogNotFolded, match=r"not folded up to this process's declaration \(offset 1\).*"
                                           r"folded through offset 0, and no further for 0.3s"):
        source(c)


def test_a_group_published_in_parts_keeps_its_size_and_is_delivered_once_whole() -> None:
    """One call per rollout as rollouts finish: each sample says the group has 4; the stage sees a group of
    4, and the log says it is whole only once the fourth is acknowledged."""
    c = cluster()
    with source(c) as s:
        lease = s.take(timeout=5)
        for i in range(4):
            s.publish(lease, [Sample(group_index=0, index=i, rollout_id=i, reward=float(i), group_size=4)])
            delivered = [r for r in log(c) if isinstance(r, Delivered)]
            if i < 3:
                time.sleep(0.1)
                assert delivered == [], i
        wait(lambda: any(isinstance(r, Delivered) for r in log(c)), "delivered once whole")
        samples = [decode_sample(r.value or b"") for r in c.records("rollouts")]
        assert [(x.group_size, x.rollout_id, x.run_id) for x in samples] == [
            (4, i, lease.run_id) for i in range(4)]
        other = s.take(timeout=5)  # miles-like samples carry no size: the call's, or the count
        s.publish(other, [{"index": 0, "rollout_id": 0, "reward": 1.0}], group_size=2)
        assert decode_sample(c.records("rollouts")[-1].value or b"").group_size == 2


def test_a_finished_source_still_says_so() -> None:
    c = cluster()
    with source(c, rows=ROWS[:1], epochs=1) as s:
        lease = s.take(timeout=5)
        assert s.fail(lease, "KeyError: 'answer'")
        for _ in range(2):
            s.fail(s.take(timeout=5), KeyError("answer"))
        with pytest.raises(SourceFinished):
            s.take(timeout=5)
        assert s.status()[0].exhausted == 1
