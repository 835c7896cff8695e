"""miles' data source on the stage's prompt source, on the in-memory cluster, driven by the calls miles makes
(radixark/miles at 31f1ca9; quoted where the test follows them): `RolloutManager.__init__` builds it,
`FullyAsyncRolloutFn._submit_one_group` takes a group, the data buffer's `put` publishes it or hands an
aborted one to `_recycle`, and `RolloutManager.save`/`load`/`dispose` checkpoint and close it."""

from __future__ import annotations

import asyncio
from argparse import Namespace
from typing import Any

import pytest

from rollout_stream.clients import Connection
from rollout_stream.codec import decode_sample
from rollout_stream.codec.admission import Delivered, Release, Sent, decode_admission
from rollout_stream.config import WorkerConfig
from rollout_stream.core.prompt_records import PromptState
from rollout_stream.core.prompts import PromptLog, epoch_order
from rollout_stream.errors import ConfigurationError
from rollout_stream.integrations.miles import stage_data_buffer
from rollout_stream.integrations.miles_prompts import (
    ATTEMPT_KEY,
    GROUP_INDEX_KEY,
    RowError,
    StageDataSource,
    miles_prompt_sample,
    stage_data_source,
)
from rollout_stream.kafka.memory import MemoryClient, MemoryCluster
from rollout_stream.prompts import SourceFinished
from tests.stream.helpers import new_topics, running_worker, wait_until
from tests.stream.integrations.test_miles_buffer import (
    DataBufferConstructorInput,
    DataBufferInput,
    MilesSample,
    first_sample,
)

ROWS = [{"input": f"what is {i} + {i}?", "label": str(2 * i), "metadata": {"row": i}} for i in range(5)]
LOG = "train-data.admission"


def args(**over: Any) -> Namespace:  # the miles arguments the data source reads (miles' defaults)
    return Namespace(**{"n_samples_per_prompt": 3, "input_key": "input", "label_key": "label",
                        "metadata_key": "metadata", "tool_key": "tools", "apply_chat_template": False,
                        "multimodal_keys": None, "async_unused_samples_handler": "retry",
                        "max_weight_staleness": 1, **over})


def source_class(cluster: MemoryCluster, producer: str = "p0") -> type[StageDataSource]:
    return stage_data_source(Connection("memory:9092"), ROWS, name="sums", trainer_group_id="trainer",
                             seed=3, sample_type=MilesSample, kafka_client=MemoryClient(cluster),
                             producer_id=producer, check=False)


def cluster() -> MemoryCluster:
    c = MemoryCluster()
    c.create_topic("rollouts", 2)
    return c


def generated(prompt_group: list[Any], status: Any = MilesSample.Status.COMPLETED,
              version: str = "4") -> list[Any]:
    """What `generate_and_rm_group` returns: the prompt group's samples, generated and rewarded."""
    for r, s in enumerate(prompt_group):
        s.tokens, s.response, s.response_length = [1, 2, 3 + r], f"r{r}", 1
        s.reward, s.loss_mask, s.weight_versions, s.status = float(r), [1], [version], status
    return prompt_group


def log(c: MemoryCluster) -> list[object]:
    return [decode_admission(r.value or b"") for r in c.records(LOG)]


def test_a_taken_prompt_is_a_miles_prompt_group_of_one_attempt() -> None:
    c = cluster()
    data_source = source_class(c)(args())  # RolloutManager: `self.data_source = data_source_cls(args)`
    try:
        firsts = []
        for _ in range(2):
            # FullyAsyncRolloutFn._submit_one_group: `samples = self.data_source.get_samples(1)`, then
            # `[prompt_group] = samples`
            [prompt_group] = data_source.get_samples(1)
            assert len(prompt_group) == 3
            firsts.append(prompt_group[0])
            attempts = {s.metadata[ATTEMPT_KEY] for s in prompt_group}
            assert len(attempts) == 1 and {s.group_index for s in prompt_group} == \
                {prompt_group[0].metadata[GROUP_INDEX_KEY]}
            assert [s.index for s in prompt_group] == [prompt_group[0].group_index * 3 + i for i in range(3)]
            assert all(s.tokens == [] and s.status is MilesSample.Status.PENDING for s in prompt_group)
        rows = epoch_order(len(ROWS), 3, 0)[:2]
        assert [(s.prompt, s.label, s.metadata["row"]) for s in firsts] == \
            [(ROWS[r]["input"], ROWS[r]["label"], r) for r in rows]
        assert [s.metadata[ATTEMPT_KEY] for s in firsts] == [f"sums@0.1/{r}" for r in rows]
        assert firsts[0].group_index != firsts[1].group_index  # the admissions', unique in the run
        assert data_source.held() == 2
        # RolloutManager.save: `self.data_source.save(rollout_id)`; load: `self.data_source.load(rollout_id)`
        records = len(c.records(LOG))
        data_source.save(7)
        data_source.load(7)
        assert len(c.records(LOG)) == records  # nothing to write: the log is the checkpoint
    finally:
        data_source.close()  # RolloutManager.dispose: `close()` when the data source has it


def test_the_buffer_publishes_a_finished_group_keyed_by_its_attempt() -> None:
    c = cluster()
    source_cls = source_class(c)
    data_source = source_cls(args())
    buffer_cls = stage_data_buffer(Connection("memory:9092"), input_topic="rollouts",
                                   output_topic="train-data", group_id="trainer", sample_type=MilesSample,
                                   prompts=source_cls)
    # FullyAsyncRolloutFn.__call__: `buffer_cls(DataBufferConstructorInput(args=self.args,
    # unused_handler_fn=self._handle_unused))`
    buffer = buffer_cls(DataBufferConstructorInput(args=args(), unused_handler_fn=lambda group: None))
    try:
        [prompt_group] = data_source.get_samples(1)
        key = prompt_group[0].metadata[ATTEMPT_KEY]
        # _worker_loop: `await self._output.put(task.result())`, the task's result being
        # `DataBufferInput(prompt_group=prompt_group, group=result)`
        asyncio.run(buffer.put(DataBufferInput(prompt_group=prompt_group, group=generated(prompt_group))))
        records = c.records("rollouts")
        assert {r.key.decode() for r in records if r.key is not None} == {key}
        samples = [decode_sample(r.value or b"") for r in records]
        assert sorted(s.reward for s in samples) == [0.0, 1.0, 2.0]
        assert {(s.run_id, s.group_index, s.group_size) for s in samples} == \
            {(key.split("/")[0], int(key.split("/")[1]), 3)}
        sent = [r for r in log(c) if isinstance(r, Sent)]
        assert [r.key for r in sent] == [key]
        assert any(isinstance(r, Delivered) and r.request == sent[0].request for r in log(c))
        assert data_source.held() == 0
        assert buffer.get_metrics()["rollout/fully_async/stage_groups_published"] == 1.0
    finally:
        buffer.close()
        data_source.close()


@pytest.mark.parametrize("handler", ["retry", "drop"])
def test_an_aborted_group_gives_its_attempt_back_and_its_prompt_is_taken_next(handler: str) -> None:
    c = cluster()
    source_cls = source_class(c)
    data_source = source_cls(args(async_unused_samples_handler=handler))

    def recycle(prompt_group: list[Any]) -> None:  # FullyAsyncRolloutFn._recycle
        for sample in prompt_group:
            sample.reset_for_retry()
        data_source.add_samples([prompt_group])

    # FullyAsyncRolloutFn.__init__: `self._recycle if ... == "retry" else (lambda prompt_group: None)`
    unused = recycle if handler == "retry" else (lambda prompt_group: None)
    buffer = stage_data_buffer(Connection("memory:9092"), input_topic="rollouts", output_topic="train-data",
                               group_id="trainer", sample_type=MilesSample, prompts=source_cls)(
        DataBufferConstructorInput(args=args(), unused_handler_fn=unused))
    try:
        [aborted] = data_source.get_samples(1)
        first = aborted[0].metadata[ATTEMPT_KEY]
        asyncio.run(buffer.put(DataBufferInput(prompt_group=aborted,
                                               group=generated(aborted, MilesSample.Status.ABORTED))))
        assert c.records("rollouts") == [] and data_source.held() == 0
        assert any(isinstance(r, Release) and r.requests for r in log(c))
        # the prompt comes back from the log, first, as another attempt (none counted); nothing kept here
        [again] = data_source.get_samples(1)
        row = int(first.split("/")[1])
        assert again[0].metadata[ATTEMPT_KEY] == f"sums@0.2/{row}"
        rec = data_source.source.gate.follower.read(lambda f: f.prompt("sums", 0, row))
        assert [a.ended.value if a.ended else None for a in rec.attempts] == ["released", None]
        with pytest.raises(ConfigurationError, match="not held"):
            data_source.publish(generated(aborted))  # the given-back attempt cannot be sent
        data_source.publish(generated(again))
        assert buffer.get_metrics()["rollout/fully_async/aborted_groups_filtered"] == 1.0
    finally:
        buffer.close()
        data_source.close()


def test_closing_gives_back_what_is_held_and_a_restarted_process_takes_it_first() -> None:
    c = cluster()
    data_source = source_class(c, "p0")(args())
    [held] = data_source.get_samples(1)
    data_source.close()  # RolloutManager.dispose
    restarted = source_class(c, "p1")(args())
    try:
        [group] = restarted.get_samples(1)
        assert group[0].metadata[ATTEMPT_KEY].split("/")[1] == held[0].metadata[ATTEMPT_KEY].split("/")[1]
        assert group[0].group_index != held[0].group_index
    finally:
        restarted.close()


def test_a_group_not_taken_from_the_stage_is_refused() -> None:
    c = cluster()
    data_source = source_class(c)(args())
    try:
        with pytest.raises(ConfigurationError, match="attempt in metadata"):
            data_source.add_samples([[MilesSample(prompt="x") for _ in range(3)]])
    finally:
        data_source.close()


def test_prompts_are_read_from_rows_as_miles_dataset_reads_them() -> None:
    row = {"q": "hi", "answer": "4", "meta": {"k": 1}, "tools": '[{"name": "calc"}]'}
    chat = args(input_key="q", label_key="answer", metadata_key="meta", apply_chat_template=True)
    rendered = miles_prompt_sample(row, chat, MilesSample,
                                   template=lambda messages, tools: f"{messages!r}|{tools!r}")
    assert rendered.prompt == "[{'role': 'user', 'content': 'hi'}]|[{'name': 'calc'}]"
    assert (rendered.label, rendered.metadata) == ("4", {"k": 1, "tools": [{"name": "calc"}]})
    assert row["meta"] == {"k": 1}  # the row is left alone
    plain = miles_prompt_sample({"input": [{"role": "user", "content": "x"}]}, args(label_key=None),
                                MilesSample)
    assert (plain.prompt, plain.label, plain.metadata) == ([{"role": "user", "content": "x"}], None, {})
    with pytest.raises(ConfigurationError, match="template"):
        miles_prompt_sample(row, chat, MilesSample)
    with pytest.raises(ConfigurationError, match="multimodal"):
        miles_prompt_sample(row, args(multimodal_keys={"image": "img"}), MilesSample)


def test_the_source_is_not_paced_and_the_buffer_shares_its_topics() -> None:
    with pytest.raises(ConfigurationError, match="not paced"):
        stage_data_source("k:9092", ROWS, name="s", trainer_group_id="t", max_policy_lag=1)
    source_cls = stage_data_source("k:9092", ROWS, name="s", trainer_group_id="t")
    with pytest.raises(ConfigurationError, match="topics and trainer group"):
        stage_data_buffer("k:9092", input_topic="rollouts", output_topic="train-data", group_id="other",
                          prompts=source_cls)
    buffer_cls = stage_data_buffer("k:9092", input_topic="rollouts", output_topic="train-data", group_id="t",
                                   prompts=source_cls, sample_type=MilesSample)
    with pytest.raises(ConfigurationError, match="was not built"):
        buffer_cls(DataBufferConstructorInput(args=args(), unused_handler_fn=lambda group: None))


@pytest.mark.parametrize(("broken", "problem"), [
    ({"input": "no label here", "metadata": {}}, "no 'label' (--label-key"),
    ({"label": "4", "metadata": {}}, "no 'input' (--input-key)"),
    ({"input": None, "label": "4"}, "'input' (--input-key) is null"),
    ({"input": 7, "label": "4"}, "'input' (--input-key) is a int, not a string or a list of messages"),
    ({"input": "x", "label": "4", "tools": "[not json"}, "'tools' (--tool-key) is a string but not JSON"),
])
def test_a_row_miles_cannot_use_is_a_failed_attempt_and_the_next_prompt_is_taken(
        broken: dict[str, Any], problem: str) -> None:
    """miles' own `Dataset` raises a raw KeyError, or hands a rollout `prompt=None`; here the row's attempt
    fails with a typed error naming the row and the key, the lease is not left held, and miles gets the next
    prompt. After `max_attempts` the row is exhausted."""
    c = cluster()
    bad = epoch_order(len(ROWS), 3, 0)[0]
    rows = [broken if i == bad else row for i, row in enumerate(ROWS)]
    data_source = stage_data_source(Connection("memory:9092"), rows, name="sums", trainer_group_id="trainer",
                                    seed=3, max_attempts=2, sample_type=MilesSample,
                                    kafka_client=MemoryClient(c), producer_id="p0", check=False)(args())
    try:
        [group] = data_source.get_samples(1)
        assert int(group[0].metadata[ATTEMPT_KEY].split("/")[1]) != bad
        assert data_source.held() == 1 and len(data_source.source.held()) == 1
        [again] = data_source.get_samples(1)  # the bad row came back first, failed again: exhausted
        assert int(again[0].metadata[ATTEMPT_KEY].split("/")[1]) != bad
        failures = [r.error for r in log(c) if isinstance(r, Release) and r.error is not None]
        assert len(failures) == 2 and len(set(failures)) == 1
        assert failures[0].startswith(f"RowError: row {bad} of prompt source 'sums': {problem}")
        rec = data_source.source.gate.follower.read(lambda f: f.prompt("sums", 0, bad))
        assert rec.state is PromptState.EXHAUSTED
    finally:
        data_source.close()


def test_a_key_no_row_has_is_a_wrong_argument_refused_before_anything_is_written() -> None:
    c = cluster()
    with pytest.raises(ConfigurationError, match="--label-key 'answer': no row of the dataset has it"):
        source_class(c)(args(label_key="answer"))
    assert c.records(LOG) == []


def test_miles_prompt_sample_names_the_row_it_could_not_read() -> None:
    with pytest.raises(RowError, match="^row 3 of 'x': no 'label'"):
        miles_prompt_sample({"input": "hi"}, args(), MilesSample, where="row 3 of 'x'")


@pytest.mark.any_client
@pytest.mark.kafka(timeout=150)
def test_miles_trains_every_prompt_of_an_epoch_once_through_the_stage(kafka_bootstrap, unique_group_id):
    """An aborted group and a stale one come back through the log and train; every prompt trains once."""
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="miles-prompts")
    miles_args = args(rollout_batch_size=2, rollout_global_dataset=True)
    source_cls = stage_data_source(kafka_bootstrap, ROWS, name="sums", trainer_group_id=unique_group_id,
                                   topic=topics.input, train_data_topic=topics.output, seed=3, epochs=1,
                                   sample_type=MilesSample)
    buffer_cls = stage_data_buffer(kafka_bootstrap, input_topic=topics.input, output_topic=topics.output,
                                   group_id=unique_group_id, sample_type=MilesSample, prompts=source_cls,
                                   start="earliest", partition_idle_ms=200)
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"w-{topics.input}",
                          group_timeout_s=5.0, commit_interval_s=0.2)
    with running_worker(config):
        data_source = source_cls(miles_args)  # RolloutManager.__init__
        output = None

        def recycle(prompt_group: list[Any]) -> None:  # FullyAsyncRolloutFn._recycle
            for sample in prompt_group:
                sample.reset_for_retry()
            data_source.add_samples([prompt_group])

        async def submit(status: Any = MilesSample.Status.COMPLETED, version: str = "5") -> str:
            assert output is not None
            [prompt_group] = data_source.get_samples(1)  # _submit_one_group
            # _worker_loop: `await self._output.put(task.result())`
            await output.put(DataBufferInput(prompt_group=prompt_group,
                                             group=generated(prompt_group, status, version)))
            return str(prompt_group[0].metadata[ATTEMPT_KEY])

        async def drain() -> list[list[Any]]:  # _drain, one rollout step
            assert output is not None
            data: list[list[Any]] = []
            while len(data) < miles_args.rollout_batch_size:
                entry = await output.get(current_version=5)  # _next_group(input.weight_version)
                assert len(entry.group) == miles_args.n_samples_per_prompt
                data.append(entry.group)
            data.sort(key=lambda group: first_sample(group).index)
            output.get_metrics()  # `RolloutFnTrainOutput(samples=data, metrics=self._output.get_metrics())`
            return data

        def state(key: str) -> PromptState | None:
            row = int(key.split("/")[1])
            return data_source.source.gate.follower.read(
                lambda f: getattr(f.prompt("sums", 0, row), "state", None) if isinstance(f, PromptLog)
                else None)

        async def run() -> tuple[list[str], list[list[Any]]]:
            sent = [await submit(), await submit(MilesSample.Status.ABORTED)]
            sent.append(await submit())  # the aborted group's prompt, handed out first again
            sent += [await submit(version="2"), await submit()]  # stale at 5: 5 - 2 > 1
            steps = await drain()
            sent.append(await submit())  # the fifth prompt
            steps += await drain()
            for _ in range(2):  # the steps after: the two steps' groups are trained, so committed
                output.get_metrics()
            # the stale group was skipped in a committed batch: the log hands its prompt out again
            await asyncio.to_thread(wait_until, lambda: state(sent[3]) is PromptState.WAITING, 20,
                                    "the stale group's prompt re-issued")
            sent.append(await submit())
            steps += [(await output.get(current_version=5)).group]
            for _ in range(3):
                output.get_metrics()
            return sent, steps

        try:
            # FullyAsyncRolloutFn.__call__: `self._output = buffer_cls(DataBufferConstructorInput(
            # args=self.args, unused_handler_fn=self._handle_unused))`
            output = buffer_cls(DataBufferConstructorInput(args=miles_args, unused_handler_fn=recycle))
            sent, trained = asyncio.run(run())
            wait_until(lambda: [s.trained for s in data_source.source.status()] == [len(ROWS)], 30,
                       "every prompt trained")
            with pytest.raises(SourceFinished):
                data_source.get_samples(1)
        finally:
            if output is not None:
                output.close()
            data_source.close()

    rows = [int(k.split("/")[1]) for k in sent]
    assert sent[2] == f"sums@0.2/{rows[1]}" and sent[6] == f"sums@0.2/{rows[3]}"  # aborted, stale: again
    assert sorted(set(rows)) == list(range(len(ROWS)))
    keys = [f"{g[0].metadata[ATTEMPT_KEY]}" for g in trained]
    assert sorted(keys) == sorted(sent[i] for i in (0, 2, 4, 5, 6))  # each prompt once, no stale group
    for group in trained:
        # miles' reward step groups by group_index: each group has its own, its admission's
        assert {s.group_index for s in group} == {group[0].metadata[GROUP_INDEX_KEY]}
        assert [s.metadata["rollout_stream_reward"] for s in group] == pytest.approx([-1.0, 0.0, 1.0])
    assert len({g[0].group_index for g in trained}) == len(trained)
