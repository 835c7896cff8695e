"""verl's message queue on the stage: `StageMessageQueue`, the methods of the `MessageQueue` actor verl's
fully-async trainer and rollouter talk to (through `MessageQueueClient` over a Ray actor handle).

verl only ever reaches its queue as a Ray actor, and an actor's constructor arguments are pickled: a
`TrainDataReader` or `RolloutProducer` (threads, locks, sockets) cannot be. So the actor is given a
`StageQueueConfig`, a plain value, and builds its reader and producer itself, in its own process; Ray keeps
the value and builds them again when it restarts the actor:

    ray.remote(StageMessageQueue).options(max_restarts=-1, max_task_retries=-1).remote(config, ...)

The queue never drops (where verl's drops the oldest sample when full, this one holds the reader back), and
its commits trail verl's training steps, so a restarted actor resumes after the last committed batch and
hands the trainer again at most the groups of its last two steps (docs/integrations.md, "verl").
"""

from __future__ import annotations

import asyncio
import pickle
import queue
import re
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from rollout_stream.clients import Connection, default_client
from rollout_stream.codec import Sample, TrainSample
from rollout_stream.errors import RuntimeFailure
from rollout_stream.integrations.verl import Rewards, rollout_sample, samples_of
from rollout_stream.producer import RolloutProducer
from rollout_stream.reader import BatchPosition, TrainDataReader
from rollout_stream.reader.sources import Fetch
from rollout_stream.reader.train_data import PARTITION_IDLE_MS, Start

__all__ = ["StageMessageQueue", "StageQueueConfig", "StageQueueError"]

# verl's rollouter names each prompt `sample_<epoch>_<n>`, n counting prompts across epochs and resumed from
# the trainer's checkpoint (fully_async_rollouter.py, `_feed_samples`)
_VERL_SAMPLE_ID = re.compile(r"sample_\d+_(\d+)")


class StageQueueError(RuntimeFailure, RuntimeError):
    """The stage's message queue cannot feed the trainer (its reader failed); the cause is chained."""


@dataclass(frozen=True, slots=True)
class StageQueueConfig:
    """What a `StageMessageQueue` builds its Kafka clients from, a value Ray can pickle into the actor.

    `connection`: the cluster, an address or a `Connection` (address, TLS/SASL settings, client library; an
    address takes the client library of this process, `$ROLLOUT_STREAM_CLIENT`). Its secrets travel with
    the value: Ray keeps an actor's constructor arguments to restart it. `train_data_topic`, `group_id`:
    the trainer side's topic and trainer group (None: a queue that only publishes). `groups_per_batch`:
    verl's `required_samples`, the prompt groups of one training step. `rank`, `world_size`,
    `max_weight_staleness`, `prefetch`, `start`, `partition_idle_ms`, `fetch`: the `TrainDataReader`'s;
    `start` applies on every restart too, so keep "committed" for an actor Ray restarts. `input_topic`:
    where `put_sample` publishes verl's rows (None: a queue that only feeds the trainer).
    """

    connection: Connection | str
    train_data_topic: str | None = None
    group_id: str | None = None
    groups_per_batch: int = 1
    rank: int = 0
    world_size: int = 1
    max_weight_staleness: int | None = None
    prefetch: int = 4
    start: Start = "committed"
    partition_idle_ms: int | None = PARTITION_IDLE_MS
    fetch: Fetch = "all"
    input_topic: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.connection, str):  # the client library is chosen here, not in the actor
            object.__setattr__(self, "connection", Connection(self.connection, client=default_client()))
        if self.train_data_topic is None and self.input_topic is None:
            raise ValueError("a queue needs a train_data_topic (to feed a trainer) or an input_topic (to "
                             "publish), or both")
        if self.train_data_topic is not None and not self.group_id:
            raise ValueError("a queue that feeds a trainer needs its group_id")
        if self.groups_per_batch < 1:
            raise ValueError(f"groups_per_batch must be >= 1, got {self.groups_per_batch}")

    def reader(self) -> TrainDataReader | None:
        """The trainer side's reader (None without a `train_data_topic`)."""
        if self.train_data_topic is None:
            return None
        assert self.group_id is not None
        return TrainDataReader(
            self.connection, self.train_data_topic, self.group_id, groups_per_batch=self.groups_per_batch,
            rank=self.rank, world_size=self.world_size, max_weight_staleness=self.max_weight_staleness,
            prefetch=self.prefetch, start=self.start, partition_idle_ms=self.partition_idle_ms,
            fetch=self.fetch)

    def producer(self) -> RolloutProducer | None:
        """The rollouter side's producer (None without an `input_topic`)."""
        return None if self.input_topic is None else RolloutProducer(self.connection, self.input_topic)


class StageMessageQueue:
    """verl's `MessageQueue` methods on the stage (see the module docstring).

    `stage`: a `StageQueueConfig` (in a Ray actor: the queue builds its reader and producer from it), or,
    in-process, the trainer side's `TrainDataReader` itself. The queue owns the reader (a thread of its own
    reads whole batches) and what it built, and closes them on `shutdown`. The reader's `groups_per_batch`
    is verl's `required_samples`: a batch is committed when the first group of the batch after the next one
    is asked for, by which time the step that took it is trained (verl's trainer takes a step's samples,
    trains, then asks again; the rule holds however a restart shifted the steps against the batches).
    `producer`: in-process, the rollouter side, where `put_sample` publishes a verl `RolloutSample`'s rows.
    `prompt_length`, `response_length`: verl's `data.max_prompt_length` and `data.max_response_length`
    (see `data_proto`); without them only groups of equal widths can be batched together.
    """

    def __init__(self, stage: StageQueueConfig | TrainDataReader | None = None,
                 producer: RolloutProducer | None = None, *, max_queue_size: int = 64,
                 rewards: Rewards = "stage", pad_token_id: int = 0, run_id: str | None = None,
                 poll_s: float = 0.5, prompt_length: int | None = None,
                 response_length: int | None = None) -> None:
        if isinstance(stage, StageQueueConfig):
            if producer is not None:
                raise ValueError("give the producer's topic in the StageQueueConfig (input_topic), not a "
                                 "producer")
            reader, producer = stage.reader(), stage.producer()
        else:
            reader = stage
        self._owns_producer = isinstance(stage, StageQueueConfig)
        self.reader, self.producer = reader, producer
        self.prompt_length, self.response_length = prompt_length, response_length
        self.max_queue_size = max_queue_size
        self.rewards, self.pad_token_id, self.run_id, self.poll_s = rewards, pad_token_id, run_id, poll_s
        self._queue: queue.Queue[bytes] = queue.Queue(maxsize=max_queue_size)
        self._val: deque[Any] = deque()
        self.total_produced = 0
        self.total_consumed = 0
        self._published_groups = 0
        self._positions: deque[tuple[int, BatchPosition]] = deque()  # (groups put through it, position)
        self._commit_through = 0  # groups handed out before the step that is now running
        self._lock = threading.Lock()
        self._running = True
        self._failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        if reader is not None:
            self._thread = threading.Thread(target=self._run, name="rollout-stream-verl-feeder", daemon=True)
            self._thread.start()

    # ---- verl's MessageQueue ------------------------------------------------------------------------
    async def put_sample(self, sample: Any) -> bool:
        """Publish a (pickled) verl `RolloutSample`: its rows as one prompt group of the stage, numbered by
        verl's `sample_<epoch>_<n>` id where it has one, so that a put Ray retries after a restart is the
        same group again (the stage drops the copy), else by a count of this queue's puts."""
        if self.producer is None:
            raise StageQueueError("this queue has no producer: it only feeds a trainer")
        if sample is None:  # verl's rollouter says it is done; the stage's stream has no end
            return True
        rollout = pickle.loads(sample) if isinstance(sample, bytes) else sample
        steps = rollout.full_batch.non_tensor_batch.get("max_global_steps")
        version = int(max(steps)) if steps is not None and len(steps) else None
        named = _VERL_SAMPLE_ID.fullmatch(str(getattr(rollout, "sample_id", "")))
        group = samples_of(rollout.full_batch, group_index=int(named[1]) if named else self._published_groups,
                           run_id=self.run_id, weight_version=version)
        self._published_groups += 1
        await asyncio.to_thread(self._publish, self.producer, group)
        self.total_produced += 1
        return True

    @staticmethod
    def _publish(producer: RolloutProducer, group: list[Sample]) -> None:
        for future in producer.send_group(group):
            future.get(60)

    async def get_sample(self) -> tuple[bytes, int] | None:
        """The next prompt group as a pickled verl `RolloutSample` and the queue length after it; None once
        shut down."""
        while True:
            if self._failure is not None:
                raise StageQueueError(f"the stage's reader failed: {type(self._failure).__name__}: "
                                      f"{self._failure}") from self._failure
            if not self._running and self._queue.empty():
                return None
            try:
                item = await asyncio.to_thread(self._queue.get, True, self.poll_s)
            except queue.Empty:
                continue
            with self._lock:
                self.total_consumed += 1
                groups = self.reader.groups_per_batch if self.reader is not None else 1
                # a step's groups are trained once the trainer asks for a group a whole step later
                if (self.total_consumed - 1) % groups == 0:
                    self._commit_through = self.total_consumed - 1 - groups
            return item, self._queue.qsize()

    async def get_queue_size(self) -> int:
        return self._queue.qsize()

    async def get_statistics(self) -> dict[str, Any]:
        return {"queue_size": self._queue.qsize(), "total_produced": self.total_produced,
                "total_consumed": self.total_consumed, "dropped_samples": 0,
                "max_queue_size": self.max_queue_size}

    async def clear_queue(self) -> None:
        """Empty the local queue (its groups are read again after a restart: they were not committed)."""
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    async def shutdown(self) -> None:
        self._running = False
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)
        if self.reader is not None:
            self.reader.close()
        if self.producer is not None and self._owns_producer:
            self.producer.close()

    async def get_memory_usage(self) -> dict[str, Any]:
        return {"queue_samples": self._queue.qsize(), "estimated_memory_bytes": 0, "estimated_memory_mb": 0.0}

    async def put_validate(self, data: Any) -> None:
        self._val.append(data)

    async def get_validate(self) -> Any | None:
        return self._val.popleft() if self._val else None

    # ---- the feeding thread -------------------------------------------------------------------------
    def _run(self) -> None:
        assert self.reader is not None
        put = 0
        try:
            while self._running:
                self._commit()
                batch = self.reader.next_batch(timeout=self.poll_s)
                if batch is None:
                    continue
                by_key: dict[str, list[TrainSample]] = {}
                for train in batch.samples:
                    by_key.setdefault(train.group_key, []).append(train)
                for info in batch.groups:
                    if info.key not in by_key:  # another rank's share
                        continue
                    item = pickle.dumps(rollout_sample(
                        by_key[info.key], rewards=self.rewards, pad_token_id=self.pad_token_id,
                        prompt_length=self.prompt_length, response_length=self.response_length))
                    while self._running:  # back-pressure, never a drop
                        try:
                            self._queue.put(item, timeout=self.poll_s)
                            put += 1
                            break
                        except queue.Full:
                            self._commit()
                if (position := self.reader.position) is not None:
                    self._positions.append((put, position))
        except BaseException as exc:  # surfaced to the trainer by get_sample
            self._failure = exc

    def _commit(self) -> None:
        with self._lock:
            through = self._commit_through
        done = None
        while self._positions and self._positions[0][0] <= through:
            done = self._positions.popleft()[1]
        if done is not None and self.reader is not None:
            self.reader.commit(done)
