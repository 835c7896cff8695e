"""The prompt source through the Kafka seam, on the in-memory cluster: takes, publishes, the declaration,
checkpoints and the end of a source (docs/loop.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout_stream.clients import Connection
from rollout_stream.codec import Sample
from rollout_stream.codec.admission import (
    Checkpoint,
    Dataset,
    Delivered,
    Renew,
    Resolved,
    Sent,
    decode_admission,
)
from rollout_stream.core.prompt_keys import parse_attempt_key
from rollout_stream.core.prompts import PromptLog, epoch_order
from rollout_stream.kafka.memory import MemoryClient, MemoryCluster
from rollout_stream.pacing import AdmissionRevoked, AdmissionWriter
from rollout_stream.pacing.checkpoints import newest_fold
from rollout_stream.prompts import (
    DatasetError,
    DatasetMismatch,
    PromptSource,
    SourceFinished,
    fingerprint,
    load_rows,
)

LOG = "train-data.admission"
ROWS = [{"prompt": f"what is {i} + {i}?", "answer": 2 * i} for i in range(6)]


def source(cluster: MemoryCluster, name: str = "p0", rows: list[dict[str, object]] = ROWS,
           **settings: object) -> PromptSource:
    return PromptSource(Connection("memory:9092"), rows, name="sums", trainer_group_id="trainer",
                        producer_id=name, check=False, kafka_client=MemoryClient(cluster), seed=3,
                        **settings)  # type: ignore[arg-type]


def group(n: int = 2) -> list[Sample]:
    return [Sample(group_index=0, index=i, rollout_id=i, reward=float(i)) for i in range(n)]


def log(cluster: MemoryCluster) -> list[object]:
    return [decode_admission(r.value or b"") for r in cluster.records(LOG)]


def test_two_processes_take_different_prompts_in_the_epoch_s_order_and_publish_by_attempt() -> None:
    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 2)
    a, b = source(cluster, "p0"), source(cluster, "p1")
    try:
        leases = [a.take(timeout=5), b.take(timeout=5), a.take(timeout=5)]
        order = epoch_order(len(ROWS), 3, 0)
        assert [(x.key.epoch, x.key.prompt, x.key.attempt) for x in leases] == [(0, p, 1) for p in order[:3]]
        assert [x.row for x in leases] == [ROWS[p] for p in order[:3]]
        a.publish(leases[2], group())  # out of take order: it takes its own admission
        keys = {r.key.decode() for r in cluster.records("rollouts") if r.key is not None}
        assert keys == {str(leases[2].key)}
        records = log(cluster)
        sent = [r for r in records if isinstance(r, Sent)]
        assert [(s.request, s.key) for s in sent] == [(leases[2].request, str(leases[2].key))]
        assert any(isinstance(r, Delivered) and r.request == leases[2].request for r in records)
        assert sum(isinstance(r, Dataset) for r in records) == 2  # each declares; the first stands
        assert [s.in_flight for s in a.status()] == [3]
    finally:
        a.close()
        b.close()


def test_a_lease_given_back_is_handed_out_next_and_cannot_be_published() -> None:
    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    a = source(cluster)
    try:
        first = a.take(timeout=5)
        a.give_back(first)
        again = a.take(timeout=5)
        assert (again.key.prompt, again.key.attempt) == (first.key.prompt, 2)  # a new key; no attempt counted
        rec = a.gate.follower.read(lambda f: f.prompt("sums", 0, first.key.prompt))
        assert [x.ended.value if x.ended else None for x in rec.attempts] == ["released", None]
        with pytest.raises(AdmissionRevoked, match="no longer holds"):
            a.publish(first, group())
        a.publish(again, group())
    finally:
        a.close()


def test_a_take_whose_attempt_ended_before_it_was_read_takes_again(monkeypatch, caplog) -> None:
    """A process paused inside a take past its lease: the log admitted its request and then ended the attempt
    (the prompt is waiting again) before the take read it. The take says so and takes anew."""
    import logging
    import time

    from rollout_stream.core.pacing import Admission

    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    a = source(cluster)
    try:
        first = a.take(timeout=5)
        a.give_back(first)  # the attempt ends, as a lapsed lease ends it
        deadline = time.monotonic() + 5
        while a.gate.follower.read(lambda f: f.attempt_of(first.request)) is not None:
            assert time.monotonic() < deadline, "the give-back was not folded"
            time.sleep(0.01)
        admit = a.gate.admit
        answers = iter([Admission(None, 0, None, first.request)])
        monkeypatch.setattr(a.gate, "admit", lambda *args: next(answers, None) or admit(*args))
        caplog.set_level(logging.WARNING, logger="rollout_stream.prompts")
        again = a.take(timeout=5)
        assert (again.key.prompt, again.key.attempt) == (first.key.prompt, 2)
        # the prompt source's lines only: a client another test of this process left running may log too
        said = [getattr(r, "event", None) for r in caplog.records if r.name == "rollout_stream.prompts"]
        assert said == ["prompt.take_lapsed"]
    finally:
        a.close()


def test_a_process_over_other_rows_under_the_same_name_is_refused() -> None:
    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    a = source(cluster)
    try:
        with pytest.raises(DatasetMismatch, match="declared over other data"):
            source(cluster, "p1", rows=ROWS[:5])
    finally:
        a.close()


def test_a_newcomer_starts_from_the_newest_checkpoint_and_goes_on_where_the_others_are() -> None:
    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    a = source(cluster, checkpoint_every=5)
    try:
        taken = [a.take(timeout=5).key.prompt for _ in range(3)]
        checkpoints = [r for r in log(cluster) if isinstance(r, Checkpoint)]
        assert checkpoints, "a checkpoint was due"
        fold = newest_fold(MemoryClient(cluster), LOG)
        assert fold.next_offset == checkpoints[-1].through + 1 > 0
        b = source(cluster, "p1")
        try:
            assert b.take(timeout=5).key.prompt == epoch_order(len(ROWS), 3, 0)[3]
            assert taken == epoch_order(len(ROWS), 3, 0)[:3]
        finally:
            b.close()
    finally:
        a.close()


def test_a_source_whose_every_prompt_settled_says_it_is_finished() -> None:
    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    a = source(cluster, rows=ROWS[:2], epochs=1)
    try:
        keys = [str(a.take(timeout=5).key) for _ in range(2)]
        writer = AdmissionWriter(Connection("memory:9092"), LOG, MemoryClient(cluster))
        offset = writer.append(Resolved(keys=keys, reason="shared_reward_violation"))
        writer.close()
        assert a.gate.follower.wait_folded(offset, 5)
        with pytest.raises(SourceFinished):
            a.take()  # no timeout: a finished source says so at once
        fold = PromptLog()
        for offset, rec in enumerate(log(cluster)):
            fold.apply(offset, 0, rec)  # type: ignore[arg-type]
        assert fold.status("sums")[0].dead_lettered == {"shared_reward_violation": 2}
        assert all(parse_attempt_key(k) is not None for k in keys)
    finally:
        a.close()


def test_jsonl_rows_are_read_in_order_and_a_bad_line_is_named(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": 1}\n\n{"q": 2}\n')
    assert load_rows(path) == [{"q": 1}, {"q": 2}]
    path.write_text('{"q": 1}\n[2]\n')
    with pytest.raises(DatasetError, match="line 2: a JSON object expected"):
        load_rows(path)
    with pytest.raises(DatasetError, match="no such file"):
        load_rows(tmp_path / "missing.jsonl")


def test_a_parquet_file_is_read_in_row_order(tmp_path: Path) -> None:
    import pyarrow as pa  # installed with the test extras (TRL's); the package itself does not need it
    import pyarrow.parquet as pq

    rows = [{"prompt": f"p{i}", "answer": i, "tags": ["a", str(i)]} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet", row_group_size=2)  # three row groups
    assert load_rows(tmp_path / "d.parquet") == rows


def test_a_datasets_directory_saved_to_disk_is_read_in_row_order(tmp_path: Path) -> None:
    import datasets

    rows = [{"prompt": f"p{i}", "answer": i} for i in range(7)]
    saved = tmp_path / "saved"
    # two shards: the rows are the shards' in the order state.json lists them
    datasets.Dataset.from_list(rows).save_to_disk(str(saved), num_shards=2)
    assert sorted(f.name for f in saved.glob("*.arrow")) == ["data-00000-of-00002.arrow",
                                                              "data-00001-of-00002.arrow"]
    assert load_rows(saved) == rows
    assert fingerprint(load_rows(saved)) == fingerprint(rows)  # the same rows as a JSONL file of them


def test_an_arrow_directory_without_state_json_is_read_file_by_file(tmp_path: Path) -> None:
    import pyarrow as pa

    table = pa.table({"q": [1, 2, 3]})
    saved = tmp_path / "saved"
    saved.mkdir()
    with pa.ipc.new_stream(saved / "data-00000-of-00001.arrow", table.schema) as w:
        w.write_table(table)
    assert load_rows(saved) == [{"q": 1}, {"q": 2}, {"q": 3}]
    with pytest.raises(DatasetError, match="without .arrow files"):
        load_rows(tmp_path)  # holds only a directory


def test_the_status_table_and_one_prompt_s_attempts_render() -> None:
    from rich.console import Console

    from rollout_stream.ops.prompts import (
        parse_prompt_id,
        prompt_json,
        prompts_report,
        render_prompt,
        render_prompts,
    )
    from tests.core.prompt_world import SOURCE, World

    w = World(prompts=3, epochs=2)
    w.take(0)
    w.kill(0)  # its attempt lapses: re-issued
    w.take(1)
    w.send(1)
    w.stage_step("shared_reward_violation")
    console = Console(record=True, width=120)
    console.print(render_prompts(prompts_report("td.admission", w.fold)))
    text = console.export_text()
    assert f"source {SOURCE}: 3 prompts, 2 epoch(s)" in text
    assert "shared_reward_violation 1" in text
    assert "epoch 0 re-issued after: lease ended 1" in text
    assert prompts_report("td.admission", w.fold).to_json()["sources"][0]["epochs"][0]["reissued_by"] == {
        "lease": 1}
    row = epoch_order(3, 7, 0)[0]
    rec = w.fold.prompt(SOURCE, 0, row)
    assert rec is not None
    console.print(render_prompt(prompt_json(SOURCE, 0, row, rec)))
    text = console.export_text()
    assert "lease" in text and "dead_lettered" in text
    assert parse_prompt_id(f"{SOURCE}@0/{row}") == parse_prompt_id(f"{SOURCE}@0.2/{row}") == (SOURCE, 0, row)
    assert parse_prompt_id("nonsense") is None


def test_the_report_says_what_staleness_left_out_of_the_groups_that_trained() -> None:
    from rich.console import Console

    from rollout_stream.ops.prompts import prompt_json, prompts_report, render_prompt, render_prompts
    from tests.core.prompt_world import SOURCE, World

    w = World(prompts=3, groups_per_batch=1)
    w.take(0)
    w.send(0)
    w.stage_step()
    key = w.train_data[0]
    w.train_batch([], left_out={0: (2, 96)})
    w.commit()
    report = prompts_report("td.admission", w.fold)
    epoch = report.to_json()["sources"][0]["epochs"][0]
    assert (epoch["trained"], epoch["partial"], epoch["excluded_rollouts"], epoch["excluded_tokens"]) == (
        1, 1, 2, 96)
    console = Console(record=True, width=120)
    console.print(render_prompts(report))
    assert "epoch 0: 1 trained in part (staleness by rollout or token left out 2 rollout(s), 96 loss " \
           "token(s))" in console.export_text()
    row = int(key.rsplit("/", 1)[1])
    rec = w.fold.prompt(SOURCE, 0, row)
    assert rec is not None
    detail = prompt_json(SOURCE, 0, row, rec)
    assert detail["attempts"][0]["excluded_rollouts"] == 2
    console.print(render_prompt(detail))
    assert "attempt 1 trained in part: staleness left out 2 rollout(s), 96 loss token(s)" in \
        console.export_text()


def test_the_worker_s_metrics_show_each_source_s_newest_epoch_and_its_settled_prompts() -> None:
    from rollout_stream.worker.progress import prompt_metrics
    from tests.core.prompt_world import SOURCE, World

    w = World(prompts=3, epochs=2, groups_per_batch=1)
    w.take(0)
    w.kill(0)  # re-issued
    w.take(1)
    w.send(1)
    w.stage_step("zero_variance")
    w.drain()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for m in prompt_metrics(w.fold) for s in m.samples}
    assert samples[("rollout_stream_prompt_epoch", (("source", SOURCE),))] == 1
    assert samples[("rollout_stream_prompts", (("source", SOURCE), ("state", "trained")))] == 3
    settled = {state: samples[("rollout_stream_prompts_settled_total", (("source", SOURCE),
                                                                        ("state", state)))]
               for state in ("trained", "filtered", "dead_lettered", "exhausted")}
    assert settled == {"trained": 5, "filtered": 1, "dead_lettered": 0, "exhausted": 0}
    assert samples[("rollout_stream_prompts_reissued_total", (("source", SOURCE),))] == 1
    assert samples[("rollout_stream_prompt_refills_total", (("source", SOURCE),))] == 1
    assert samples[("rollout_stream_prompt_batches_total", (("source", SOURCE),))] == 5  # one group each


def test_the_report_counts_refills_per_trainer_batch() -> None:
    from rich.console import Console

    from rollout_stream.ops.prompts import prompts_report, render_prompts
    from tests.core.prompt_world import World

    w = World(prompts=4, groups_per_batch=1)
    for verdict in ("zero_variance", "zero_variance", "publish", "publish"):
        w.take(0)
        w.send(0)
        w.stage_step(verdict)
        if verdict == "publish":
            w.train_batch([])
            w.commit()
    report = prompts_report("td.admission", w.fold)
    assert (report.sources[0].refills, report.sources[0].batches) == (2, 2)
    assert report.sources[0].batch_refills == {0: 1, 2: 1}
    assert report.to_json()["sources"][0]["batch_refills"] == {0: 1, 2: 1}
    console = Console(record=True, width=120)
    console.print(render_prompts(report))
    assert "refills: 2 zero-variance prompt(s) replaced; batches by refills (2 committed) 0: 1, 2: 1" in \
        console.export_text()


def test_the_report_lists_exhausted_prompts_whose_record_is_not_written_yet() -> None:
    from rich.console import Console

    from rollout_stream.ops.prompts import prompts_report, render_prompts
    from tests.core.prompt_world import SOURCE, World

    w = World(prompts=2, max_attempts=1)
    w.take(0)
    w.kill(0)  # its lease ends: exhausted
    report = prompts_report("td.admission", w.fold)
    assert report.sources[0].exhausted_unrecorded == [f"{SOURCE}@0/{epoch_order(2, 7, 0)[0]}"]
    console = Console(record=True, width=120)
    console.print(render_prompts(report))
    assert "dead-letter record not written yet" in console.export_text()
    w.log(Resolved(keys=[f"{SOURCE}@0.1/{epoch_order(2, 7, 0)[0]}"], reason="prompt_attempts_exhausted"))
    assert prompts_report("td.admission", w.fold).sources[0].exhausted_unrecorded == []


def test_the_reader_s_fence_skips_a_superseded_attempt_with_a_reason_of_its_own(monkeypatch, caplog) -> None:
    """Two attempts of one prompt on train-data: the first trains, the other is skipped as superseded,
    counted and logged apart from invalid groups, with the prompt and the attempt that trained it."""
    import logging

    from rollout_stream.codec import encode_train_sample
    from rollout_stream.core.prompt_keys import PromptFence
    from rollout_stream.reader import TrainDataReader
    from tests.stream.commands.memory_cli import on_memory
    from tests.stream.reader.test_reader import train_sample

    cluster = MemoryCluster()
    on_memory(monkeypatch, cluster, "rollout_stream.reader.train_data", "rollout_stream.topics")
    cluster.create_topic("td", 1)
    producer = cluster.client().producer(transactional_id="stage")
    producer.init_transactions()
    producer.begin_transaction()
    for run, g in (("sums@0.2", 4), ("sums@0.1", 4), ("sums@0.1", 5), ("sums@0.1", 2)):
        for rid in range(2):
            s = train_sample(g, rid, run=run)
            producer.send("td", encode_train_sample(s), s.group_key.encode(), partition=0)
    producer.commit_transaction()
    producer.close()
    caplog.set_level(logging.INFO, logger="rollout_stream.reader")
    with TrainDataReader("memory:9092", "td", "trainer", groups_per_batch=2, publish_progress=False,
                         partition_idle_ms=50, start="earliest",
                         fence=PromptFence({("sums", 0, 2)})) as reader:  # trained before the resume
        first = reader.next_batch(30)
        assert first is not None and [g.key for g in first.groups] == ["sums@0.2/4", "sums@0.1/5"]
        assert (first.skipped_superseded, first.skipped_invalid) == (1, 0)
        assert reader.next_batch(1) is None  # sums@0.1/2 alone: its prompt trained before the resume
        assert reader.stats.skipped_superseded_groups == 1 and reader.stats.skipped_invalid_groups == 0
    lines = {r.fields["group"]: r.fields["problem"]  # type: ignore[attr-defined]
             for r in caplog.records if getattr(r, "event", None) == "group.skipped_superseded"}
    assert lines == {"sums@0.1/4": "superseded: prompt sums@0/4 trained as sums@0.2/4"}
    assert not [r for r in caplog.records if getattr(r, "event", None) == "group.skipped_invalid"]


def test_an_exhausted_prompt_is_dead_lettered_once_whichever_process_writes_it(monkeypatch) -> None:
    """Two processes of one source see the same exhaustion; one writes the dead-letter record with its
    marker in one transaction, the other, folding to the log's end after taking the writer's id, writes
    nothing. `dlq list`, `stats` and `show` read it; `replay` refuses it."""
    import json

    from typer.testing import CliRunner

    from rollout_stream.cli import app
    from rollout_stream.codec import DeadLetterReason
    from rollout_stream.prompts.exhausted import ExhaustedWriter
    from tests.stream.commands.memory_cli import BOOTSTRAP, on_memory

    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    cluster.create_topic("rollouts-dlq", 2)
    a, b = source(cluster, "p0", max_attempts=1), source(cluster, "p1", max_attempts=1)
    try:
        lease = a.take(timeout=5)
        writer = AdmissionWriter(Connection("memory:9092"), LOG, MemoryClient(cluster))
        offset = writer.append(Resolved(keys=[str(lease.key)], reason="incomplete_group"))  # timed out
        writer.close()
        assert a.gate.follower.wait_folded(offset, 5) and b.gate.follower.wait_folded(offset, 5)
        assert len(a.exhausted.pending()) == len(b.exhausted.pending()) == 1
        late = ExhaustedWriter(Connection("memory:9092"), MemoryClient(cluster), a.gate.follower,
                               source="sums", admission_topic=LOG, dead_letter_topic="rollouts-dlq")
        assert b.exhausted.write() == 1
        assert late.write() == 0  # it listed the prompt, took the id, folded the marker: nothing left
        b.take(timeout=5)  # another prompt; nothing more written
    finally:
        a.close()
        b.close()
    dead = cluster.records("rollouts-dlq")
    assert len(dead) == 1
    headers = dict(dead[0].headers or [])
    assert headers["x-dlq-reason"] == DeadLetterReason.PROMPT_ATTEMPTS_EXHAUSTED.value.encode()
    assert headers["x-group-key"] == f"{lease.key}".encode() and headers["x-original-topic"] == LOG.encode()
    assert dead[0].key == f"sums@0/{lease.key.prompt}".encode()
    value = json.loads(dead[0].value or b"")
    assert [a["ended"] for a in value["attempts"]] == ["incomplete"] and value["state"] == "exhausted"
    markers = [r for r in log(cluster) if isinstance(r, Resolved) and r.reason == "prompt_attempts_exhausted"]
    assert [m.keys for m in markers] == [[str(lease.key)]]

    on_memory(monkeypatch, cluster, "rollout_stream.commands.dlq")
    runner = CliRunner()
    listed = runner.invoke(app, ["dlq", "list", *BOOTSTRAP, "--json"], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert "prompt_attempts_exhausted" in listed.stdout and f"sums@0/{lease.key.prompt}" in listed.stdout
    stats = runner.invoke(app, ["dlq", "stats", *BOOTSTRAP], env={"COLUMNS": "200"})
    assert stats.exit_code == 0 and "prompt_attempts_exhausted" in stats.stdout, stats.output
    where = f"{dead[0].partition}:{dead[0].offset}"
    shown = runner.invoke(app, ["dlq", "show", *BOOTSTRAP, where], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "prompt_attempts_exhausted" in shown.stdout, shown.output
    # the record is the prompt and its attempts, readable: no hex dump, times in ISO-8601
    assert f"prompt sums@0/{lease.key.prompt}: exhausted" in shown.stdout and "incomplete" in shown.stdout
    assert "does not decode" not in shown.stdout, shown.stdout
    shown = runner.invoke(app, ["dlq", "show", *BOOTSTRAP, where, "--json"], env={"COLUMNS": "200"})
    doc = json.loads(shown.stdout)
    assert "hex_preview" not in doc and doc["prompt"]["prompt"] == lease.key.prompt, doc
    [attempt] = doc["prompt"]["attempts"]
    assert attempt["ended"] == "incomplete" and attempt["taken_at"].endswith("Z"), attempt
    from rollout_stream.ops.dlq.lineage import decide
    from rollout_stream.ops.dlq.record import parse_record

    action = decide(parse_record(dead[0]), to=None, max_replays=3, replay_id="r")
    assert action.topic is None and action.refused is not None and "prompt's record" in action.refused


def test_a_missing_dead_letter_topic_leaves_the_exhausted_prompt_listed_until_it_exists(caplog) -> None:
    import logging

    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    a = source(cluster, max_attempts=1)
    try:
        lease = a.take(timeout=5)
        writer = AdmissionWriter(Connection("memory:9092"), LOG, MemoryClient(cluster))
        offset = writer.append(Resolved(keys=[str(lease.key)], reason="incomplete_group"))
        writer.close()
        assert a.gate.follower.wait_folded(offset, 5)
        with caplog.at_level(logging.WARNING, logger="rollout_stream.prompts"):
            assert a.exhausted.write() == 0  # no rollouts-dlq: nothing sent, nothing hangs
        assert any(getattr(r, "event", None) == "prompt.dead_letter_topic_missing" for r in caplog.records)
        assert len(a.exhausted.pending()) == 1
        cluster.create_topic("rollouts-dlq", 1)
        assert a.exhausted.write() == 0  # looks again only after a while
        a.exhausted._topic_missing_until = 0.0
        assert a.exhausted.write() == 1 and len(cluster.records("rollouts-dlq")) == 1
    finally:
        a.close()


def test_closing_a_source_twice_is_closing_it_once() -> None:
    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    a = source(cluster)
    a.take(timeout=5)
    a.close()
    released = len(cluster.records(LOG))
    a.close()
    assert len(cluster.records(LOG)) == released


def late_renewal(a: PromptSource, cluster: MemoryCluster, log_ms: int) -> None:
    """As the renewal thread after a pause: the lease ran out by the producer's clock, `log_ms` of log time
    passed since its last renewal, and another party's record was folded first."""
    import time

    from rollout_stream.codec.admission import Hello, encode_admission

    with a.gate.sending():
        a.gate._valid_until = time.monotonic() - 1.0
    cluster.clock_ms += log_ms
    other = cluster.client().producer(client_id="other")
    other.send(LOG, encode_admission(Hello(producer="other", session="s")), b"other", partition=0)
    other.flush()
    a.gate._renewed(time.monotonic(), a.gate._writer.send(Renew(producer=a.gate.producer_id,
                                                                 session=a.gate.session)))


@pytest.fixture
def no_renewals(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sources' own renewal threads stay quiet: the test renews."""
    monkeypatch.setattr("rollout_stream.pacing.gate.RENEW_S", 3600.0)


def test_a_lease_renewed_after_the_log_ended_it_does_not_make_the_held_prompts_good_again(
        caplog, no_renewals) -> None:
    """A process paused past its lease: the renewal thread may renew before the main thread publishes. The
    log ended the admissions and may have handed their prompts out again, so the renewal drops them and their
    groups are refused, never sent."""
    import logging

    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    a = source(cluster)
    try:
        held = [a.take(timeout=5) for _ in range(2)]
        caplog.set_level(logging.WARNING, logger="rollout_stream.pacing")
        late_renewal(a, cluster, log_ms=4_000)  # past the log's 3 s
        for lease in held:
            with pytest.raises(AdmissionRevoked, match="no longer holds"):
                a.publish(lease, group())
        assert not any(isinstance(r, Sent) for r in log(cluster))
        again = [a.take(timeout=5) for _ in range(2)]  # their prompts come back first
        assert sorted((x.key.prompt, x.key.attempt) for x in again) == sorted(
            (x.key.prompt, 2) for x in held)
        assert "admission.lapsed" in [getattr(r, "event", None) for r in caplog.records]
    finally:
        a.close()


def test_a_renewal_that_was_late_only_by_the_producer_s_clock_keeps_the_prompts_held(
        caplog, no_renewals) -> None:
    """A starved process whose renewal is late by its own clock, while the log still holds its lease: the
    held prompts stay good and publish."""
    import logging

    cluster = MemoryCluster()
    cluster.create_topic("rollouts", 1)
    a = source(cluster)
    try:
        held = [a.take(timeout=5) for _ in range(2)]
        caplog.set_level(logging.WARNING, logger="rollout_stream.pacing")
        late_renewal(a, cluster, log_ms=1_000)  # within the log's 3 s
        for lease in held:
            a.publish(lease, group())
        assert "admission.lapsed" not in [getattr(r, "event", None) for r in caplog.records]
    finally:
        a.close()


def test_a_fence_built_before_the_predecessor_s_last_commit_was_marked_still_refuses_its_prompts() -> None:
    """The trainer commits batch 0 and dies before its mark says so: the log still lists batch 0 uncommitted
    when the next reader builds its fence. Resuming at batch 1, the reader counts batch 0's prompts as
    trained, so a re-issued twin of one of them is refused; resuming at batch 0 (the commit did not happen)
    the batch trains again, as it must."""
    from rollout_stream.prompts.fence import fence_of
    from tests.core.prompt_world import TRAINER, World

    w = World(prompts=4, groups_per_batch=2)
    for _ in range(2):
        w.take(0)
        w.send(0)
    while w.stage:
        w.stage_step()
    keys = list(w.train_data)
    w.train_batch([])  # batch 0, listed by the mark; its commit is never marked
    assert w.fold.uncommitted[TRAINER] == {0: dict.fromkeys(keys, False)}
    twin = keys[0].replace(".1/", ".2/")  # another attempt of the same prompt
    committed = fence_of(w.fold)
    committed.resumed(TRAINER, 1)
    assert not committed.admit(twin)
    assert "trained before the reader resumed" in (committed.refusal(twin) or "")
    again = fence_of(w.fold)
    again.resumed(TRAINER, 0)
    assert again.admit(keys[0]) and again.admit(keys[1])  # batch 0 is read again and trains
    assert fence_of(w.fold).admit(twin)  # the hole this closes: without the resume point, the twin trains
