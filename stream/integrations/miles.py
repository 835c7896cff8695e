"""miles (radixark/miles at 31f1ca9, not on PyPI): the stage as the data buffer of miles' fully-async
rollout (`--custom-async-data-buffer-path`).

`stage_data_buffer(...)` makes the class to point that flag at (a module-level name in one's own file).
miles builds it with `DataBufferConstructorInput(args, unused_handler_fn)` and calls, from
`FullyAsyncRolloutFn`:

* `put(DataBufferInput(prompt_group, group))` for every finished group: an aborted one goes to
  `unused_handler_fn(prompt_group)` (drop or retry, `--async-unused-samples-handler`), as in miles'
  `DefaultDataBuffer`; any other is published to the stage (`RolloutProducer.send_many`, siblings of a
  multi-sample trajectory numbered) and `put` returns once the broker has it;
* `get(current_version=v)`: the next whole group from the train-data topic (validated, deduplicated,
  shared rewards enforced by the stage), in the shape `put` received it (a rollout miles gave as a list
  stays a list, even of one sample: miles flattens a step by the type of its first element; docs/miles.md),
  as miles `Sample`s carrying their **raw** rewards: miles' own reward step then computes the stage's
  processed rewards bit for bit (the stage is that computation), which each sample also carries as
  `metadata["rollout_stream_reward"]`. A group older than `args.max_weight_staleness`
  versions goes to `unused_handler_fn` with its prompts, and the next one is taken;
* `get_metrics()` once per rollout step.

miles generates step k + 1 while it trains step k, so the groups handed out in a step are committed at the
`get_metrics` two steps later: a restart repeats at most two steps' groups, never skips one.

With `prompts=` (a class from `rollout_stream.integrations.miles_prompts.stage_data_source`, also miles'
`--data-source-path`) the prompts come from the stage's prompt source and every group is settled through its
admission log: `put` publishes a group keyed by its attempt; an aborted group's attempt is given back
whichever unused handler miles chose (drop too: the prompt is not lost); the reader judges staleness
against `current_version` and fences attempts, so a stale group is skipped in the log (its prompt handed out
again once the skip is committed) rather than handed to the unused handler; a group's miles `group_index`
is its admission's, unique in the run.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from rollout_stream.clients import Connection, default_client
from rollout_stream.codec import Sample, TrainSample
from rollout_stream.errors import ConfigurationError
from rollout_stream.integrations.miles_prompts import (
    GROUP_INDEX_KEY,
    TRAJECTORY_KEY,
    StageDataSource,
    wire_rollouts,
)
from rollout_stream.producer import RolloutProducer
from rollout_stream.prompts import prompt_fence
from rollout_stream.reader import BatchPosition, TrainDataReader

__all__ = ["BufferEntry", "StageDataBuffer", "miles_group", "stage_data_buffer"]


@dataclass
class BufferEntry:
    """The shape of miles' `DataBufferInput`: the prompts (for recycling) and the finished group."""

    prompt_group: list[Any]
    group: list[Any]  # a rollout is a Sample, or a list of them (a multi-sample trajectory)


def _miles_sample_type() -> Any:
    from miles.utils.types import (  # type: ignore[import-not-found]  # where miles runs this
        Sample as MilesSample,
    )

    return MilesSample


def miles_group(group: Sequence[TrainSample], sample_type: Any) -> tuple[list[Any], list[Any]]:
    """miles' (prompt group, group) of a train-data group: one entry per rollout in rollout order, a
    `Sample`, or a list of them where the rollout has several samples or miles put it as a list
    (`TRAJECTORY_KEY`); the prompt group has one pending prompt per rollout."""
    rollouts: dict[Any, list[TrainSample]] = {}
    for train in group:
        s = train.sample
        rollouts.setdefault(s.rollout_id if s.rollout_id is not None else s.index, []).append(train)
    out: list[Any] = []
    prompts: list[Any] = []
    for members in rollouts.values():
        members.sort(key=lambda t: t.sample.sibling_index)
        samples = [_miles_sample(t, sample_type) for t in members]
        listed = len(samples) > 1 or any(t.sample.metadata.get(TRAJECTORY_KEY) for t in members)
        out.append(samples if listed else samples[0])
        first = members[0].sample
        prompts.append(sample_type(group_index=_group_index(first), index=first.index, prompt=first.prompt,
                                   label=first.label, metadata=_metadata(first)))
    return prompts, out


def _group_index(s: Sample) -> int | None:
    # a prompt source's group is keyed by its row on the wire; miles' reward step groups a batch by
    # group_index, so it gets back the admission's (unique in the run, where rows repeat every epoch)
    given = s.metadata.get(GROUP_INDEX_KEY)
    return given if isinstance(given, int) else s.group_index


def _metadata(s: Sample) -> dict[str, Any]:
    return {k: v for k, v in s.metadata.items() if k != TRAJECTORY_KEY}  # the shape is back in the group


def _miles_sample(train: TrainSample, sample_type: Any) -> Any:
    s: Sample = train.sample

    def floats(values: Any) -> list[float] | None:
        return None if values is None else [float(v) for v in values]

    return sample_type(
        group_index=_group_index(s), index=s.index, rollout_id=s.rollout_id, prompt=s.prompt,
        tokens=[] if s.tokens is None else [int(t) for t in s.tokens], response=s.response,
        response_length=s.response_length, label=s.label, reward=s.reward,
        loss_mask=None if s.loss_mask is None else [int(v) for v in s.loss_mask],
        weight_versions=list(s.weight_versions), rollout_log_probs=floats(s.rollout_log_probs),
        remove_sample=s.remove_sample, teacher_log_probs=floats(s.teacher_log_probs),
        opd_reverse_kl=floats(s.opd_reverse_kl), status=sample_type.Status(s.status),
        metadata={**_metadata(s), "rollout_stream_reward": train.reward}, train_metadata=s.train_metadata)


def _samples_of(group: list[Any]) -> list[Any]:
    return [s for item in group for s in (item if isinstance(item, list) else [item])]


def _oldest(group: Sequence[TrainSample]) -> int | None:
    versions = [int(v) for t in group for v in t.sample.weight_versions if str(v).isdigit()]
    return min(versions) if versions else None  # miles' Sample.oldest_weight_version, over the group


class StageDataBuffer:
    """miles' `DataBuffer` on the stage (see the module docstring); `stage_data_buffer` binds its settings."""

    connection: Connection | str
    input_topic: str
    output_topic: str
    group_id: str
    run_id: str | None = None
    reader_options: dict[str, Any] = {}
    sample_type: Any = None  # miles' Sample class (imported from miles when None)
    prompts: type[StageDataSource] | None = None  # the data source whose attempts this buffer settles

    def __init__(self, input: Any) -> None:
        self._args = input.args
        self._unused: Callable[[list[Any]], None] = input.unused_handler_fn
        self._type = self.sample_type if self.sample_type is not None else _miles_sample_type()
        self._source: StageDataSource | None = None
        self._limit: int | None = getattr(self._args, "max_weight_staleness", None)
        if self.prompts is not None:
            self._source = self.prompts.live
            if self._source is None:
                raise ConfigurationError("the stage's data source was not built in this process: point "
                                         "--data-source-path at the class given as prompts=")
        self._producer = RolloutProducer(self.connection, self.input_topic) if self._source is None else None
        self._reader_: TrainDataReader | None = None  # at the first get: put needs none
        self._skipped = 0
        self._handed: list[BatchPosition] = []  # this step's
        self._steps: deque[list[BatchPosition]] = deque()
        self._aborted = self._stale = self._published = self._consumed = 0

    async def put(self, input: Any) -> None:
        samples = _samples_of(input.group)
        if any(getattr(s.status, "value", s.status) == "aborted" for s in samples):
            self._aborted += 1
            self._unused(input.prompt_group)
            if self._source is not None:  # retry gave it back already; drop must not lose the prompt
                self._source.give_back(input.prompt_group)
            return
        if self._source is not None:
            await asyncio.to_thread(self._source.publish, input.group)
        else:
            await asyncio.to_thread(self._publish, input.group)
        self._published += 1

    def _publish(self, group: list[Any]) -> None:
        assert self._producer is not None
        records = [msgspec.structs.replace(
            s, group_size=len(group), sibling_count=len(members), sibling_index=i,
            run_id=self.run_id if self.run_id is not None else s.run_id)
            for members in wire_rollouts(group) for i, s in enumerate(members)]
        for future in self._producer.send_group(records):
            future.get(60)

    @property
    def _reader(self) -> TrainDataReader:
        if self._reader_ is None:
            options = dict(self.reader_options)
            if self._source is not None:
                # the reader judges staleness (against get's current_version) and fences attempts, so a
                # skipped group is named in the log and its prompt handed out again: nothing lost, none twice
                options.setdefault("max_weight_staleness", self._limit)
                options.setdefault("fence", prompt_fence(_connection(self.connection), self.output_topic))
            # one group per batch: miles takes groups one at a time; without a prompt source staleness is
            # judged here, against the version miles passes to get(), so that stale groups reach the
            # unused handler (miles' own data source recycles them)
            self._reader_ = TrainDataReader(self.connection, self.output_topic, self.group_id,
                                            groups_per_batch=1, **options)
        return self._reader_

    async def get(self, current_version: int | None = None, **_: Any) -> BufferEntry:
        limit = self._limit
        if self._source is not None and current_version is not None:
            self._source.weight_version = current_version
            self._reader.set_weight_version(current_version)
        while True:
            batch = await asyncio.to_thread(self._reader.next_batch, None)
            assert batch is not None  # no timeout: it waits for a group
            self._skipped += batch.skipped_stale
            if (position := self._reader.position) is not None:
                self._handed.append(position)
            prompts, group = miles_group(batch.samples, self._type)
            oldest = _oldest(batch.samples)
            if self._source is None and limit is not None and current_version is not None \
                    and oldest is not None and current_version - oldest > limit:
                self._stale += 1
                self._unused(prompts)
                continue
            self._consumed += 1
            return BufferEntry(prompt_group=prompts, group=group)

    def get_metrics(self) -> dict[str, float]:
        self._steps.append(self._handed)
        self._handed = []
        if len(self._steps) > 2:  # the step before last is trained: miles trains k while generating k + 1
            done = self._steps.popleft()
            if done and self._reader_ is not None:
                self._reader_.commit(done[-1])
        prefix = "rollout/fully_async/"
        metrics = {f"{prefix}aborted_groups_filtered": float(self._aborted),
                   f"{prefix}stale_groups_filtered": float(self._stale + self._skipped),
                   f"{prefix}stage_groups_published": float(self._published),
                   f"{prefix}stage_groups_consumed": float(self._consumed)}
        self._aborted = self._stale = self._published = self._consumed = self._skipped = 0
        return metrics

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
        if self._reader_ is not None:
            self._reader_.close()


def _connection(connection: Connection | str) -> Connection:
    return (connection if isinstance(connection, Connection)
            else Connection(connection, client=default_client()))


def stage_data_buffer(connection: Connection | str, *, input_topic: str, output_topic: str, group_id: str,
                      run_id: str | None = None, sample_type: Any = None,
                      prompts: type[StageDataSource] | None = None, **reader_options: Any
                      ) -> type[StageDataBuffer]:
    """The `StageDataBuffer` class for `--custom-async-data-buffer-path`, bound to a cluster, the stage's
    topics and the trainer's consumer group (`reader_options`: more `TrainDataReader` settings).
    `prompts`: the `stage_data_source` class given as `--data-source-path`, whose attempts it publishes and
    settles (its topics and trainer group must be these; the attempt names the run, so no `run_id`)."""
    if prompts is not None:
        bound = prompts.source_options
        theirs = (bound["topic"], bound["train_data_topic"], bound["trainer_group_id"])
        if theirs != (input_topic, output_topic, group_id) or run_id is not None:
            raise ConfigurationError(f"the data buffer must use the data source's topics and trainer group "
                                     f"(topic, train_data_topic, trainer_group_id = {theirs}) and no run_id "
                                     f"(its attempts name the run)")
    return type("BoundStageDataBuffer", (StageDataBuffer,), {
        "connection": connection, "input_topic": input_topic, "output_topic": output_topic,
        "group_id": group_id, "run_id": run_id, "sample_type": sample_type, "prompts": prompts,
        "reader_options": reader_options})
