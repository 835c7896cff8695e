"""miles (radixark/miles at 31f1ca9): the stage's prompt source as miles' data source (`--data-source-path`).

`stage_data_source(...)` makes the class to point that flag at; `stage_data_buffer(..., prompts=that class)`
(rollout_stream.integrations.miles) makes the fully-async data buffer that publishes its groups. miles'
`RolloutManager` builds it with `data_source_cls(args)` and, in the fully-async rollout
(`FullyAsyncRolloutFn`), calls:

* `get_samples(1)` for each group it starts: one `PromptSource.take`, the attempt this process now holds,
  as a miles prompt group of `args.n_samples_per_prompt` samples (prompt, label and metadata read from the
  row as miles' `Dataset` reads them; see `miles_prompt_sample`). A row it cannot make a prompt of (a key
  missing, a value of the wrong kind: `RowError`) is a failed attempt, with the error in the log, and the
  next prompt is taken: after `max_attempts` such failures the row is exhausted and dead-lettered;
* `add_samples([prompt_group])` for a group it will not train (`_recycle`, `--async-unused-samples-handler
  retry`): the attempt was never sent, so its lease is given back and the log hands the prompt out again
  first (no attempt counted). Nothing is kept here: every prompt comes back through the log, so no prompt
  is taken twice and a restarted process finds the same state;
* `save(rollout_id)` / `load(rollout_id)`: nothing to do, the admission log is the checkpoint.

The buffer publishes a finished group through `publish`, keyed by its attempt, so the stage, the reader's
fence and the prompt fold settle it (trained, dead-lettered, filtered, re-issued: docs/loop.md).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from rollout_stream.clients import Connection
from rollout_stream.codec import Sample
from rollout_stream.errors import ConfigurationError
from rollout_stream.kafka import Client
from rollout_stream.logs import log_event
from rollout_stream.prompts import PromptLease, PromptSource
from rollout_stream.prompts.dataset import DatasetError, Row, load_rows

__all__ = ["ATTEMPT_KEY", "GROUP_INDEX_KEY", "TRAJECTORY_KEY", "RowError", "StageDataSource",
           "miles_prompt_sample", "stage_data_source", "wire_rollouts"]

log = logging.getLogger("rollout_stream.integrations.miles")

ATTEMPT_KEY = "rollout_stream_attempt"  # metadata: the attempt a prompt group belongs to
GROUP_INDEX_KEY = "rollout_stream_group_index"  # metadata: miles' group index (the wire's is the row)
TRAJECTORY_KEY = "rollout_stream_trajectory"  # metadata: miles gave the sample's rollout as a list


def wire_rollouts(group: Sequence[Any]) -> list[list[Sample]]:
    """The stage's samples of a finished miles group, one list per rollout. miles' group holds a `Sample` per
    rollout, or a list of them (a multi-sample trajectory, one sample or more): the samples of a list share
    one rollout id (its first sample's, else its index), and carry `TRAJECTORY_KEY`, so that the data buffer
    gives the group back in the shape miles put it (miles flattens a batch by the type of its first
    element)."""
    rollouts = []
    for item in group:
        listed = isinstance(item, list)
        members = [Sample.from_miles(s) for s in (item if listed else [item])]
        if listed:
            rollout = members[0].rollout_id if members[0].rollout_id is not None else members[0].index
            marked = {TRAJECTORY_KEY: True}
            members = [msgspec.structs.replace(s, rollout_id=rollout, metadata={**s.metadata, **marked})
                       for s in members]
        rollouts.append(members)
    return rollouts


class RowError(DatasetError):
    """A dataset row the data source cannot make a miles prompt of: a key it reads is missing, or its value
    is of the wrong kind (the message names the row, the key and the argument that names the key)."""


def miles_prompt_sample(row: Row, args: Any, sample_type: Any,
                        template: Callable[[Any, Any], str] | None = None, *, where: str = "row") -> Any:
    """The prompt sample miles' `Dataset` (miles/utils/data.py) makes of a row: `prompt` the row's
    `args.input_key` (as one user message when `args.apply_chat_template`, rendered by `template(messages,
    tools)`), `label` the row's `args.label_key` (None without one), `metadata` a copy of the row's
    `args.metadata_key` plus its `args.tool_key` list as `tools`. RowError (naming `where`) for a row
    without the input or the label, or with a value of the wrong kind."""
    if getattr(args, "multimodal_keys", None):
        raise ConfigurationError("the stage's data source carries no multimodal inputs (--multimodal-keys)")
    row = copy.deepcopy(row)  # miles deep-copies each sample of a group from the dataset's
    input_key = getattr(args, "input_key", "input")
    prompt = row.get(input_key)
    if prompt is None:  # miles would hand its rollout `prompt=None`
        raise RowError(f"{where}: no {input_key!r} (--input-key)" if input_key not in row
                       else f"{where}: {input_key!r} (--input-key) is null")
    if not isinstance(prompt, str | list):
        raise RowError(f"{where}: {input_key!r} (--input-key) is a {type(prompt).__name__}, not a string or "
                       f"a list of messages")
    chat = bool(getattr(args, "apply_chat_template", False))
    if isinstance(prompt, str) and chat:
        prompt = [{"role": "user", "content": prompt}]
    metadata_key = getattr(args, "metadata_key", "metadata")
    metadata = row.get(metadata_key) or {}
    if not isinstance(metadata, dict):
        raise RowError(f"{where}: {metadata_key!r} (--metadata-key) is a {type(metadata).__name__}, not an "
                       f"object")
    metadata = dict(metadata)
    tools = None
    if (tool_key := getattr(args, "tool_key", None)) is not None and tool_key in row:
        tools = row[tool_key]
        if isinstance(tools, str):
            try:
                tools = msgspec.json.decode(tools)
            except msgspec.DecodeError as exc:
                raise RowError(f"{where}: {tool_key!r} (--tool-key) is a string but not JSON: {exc}") from exc
        if not isinstance(tools, list):
            raise RowError(f"{where}: {tool_key!r} (--tool-key) must be a list, got {type(tools).__name__}")
        metadata["tools"] = tools
    if chat:
        if template is None:
            raise ConfigurationError("--apply-chat-template needs the data source's template (miles' "
                                     "tokenizer): see stage_data_source(template=...)")
        prompt = template(prompt, tools)
    label_key = getattr(args, "label_key", None)
    if label_key is not None and label_key not in row:
        raise RowError(f"{where}: no {label_key!r} (--label-key; without the flag no label is read)")
    return sample_type(prompt=prompt, label=row[label_key] if label_key is not None else None,
                       metadata=metadata)


def _miles_sample_type() -> Any:
    from miles.utils.types import (  # type: ignore[import-not-found]  # where miles runs this
        Sample as MilesSample,
    )

    return MilesSample


def _miles_template(args: Any) -> Callable[[Any, Any], str]:
    """miles' own chat template step (miles/utils/data.py `Dataset`), with its tokenizer."""
    from miles.utils import chat_template_utils  # type: ignore[import-not-found]
    from miles.utils.processing_utils import load_tokenizer  # type: ignore[import-not-found]

    tokenizer = load_tokenizer(args.hf_checkpoint, chat_template_path=args.chat_template_path,
                               trust_remote_code=True)

    def render(messages: Any, tools: Any) -> str:
        return str(chat_template_utils.apply_chat_template(
            messages, tokenizer=tokenizer, tools=tools, tokenize=False, add_generation_prompt=True,
            **(args.apply_chat_template_kwargs or {})))
    return render


class StageDataSource:
    """miles' `DataSource` on a `PromptSource` (see the module docstring); `stage_data_source` binds it."""

    connection: ClassVar[Connection | str]
    dataset: ClassVar[str | Path | Sequence[Row]]
    source_options: ClassVar[dict[str, Any]] = {}
    sample_type: ClassVar[Any] = None  # miles' Sample class (imported from miles when None)
    # in a tuple: a function stored on a class would be bound as a method
    template: ClassVar[tuple[Callable[[Any, Any], str]] | None] = None
    kafka_client: ClassVar[Client | None] = None  # the seam's client (tests: the in-memory cluster)
    # the one built in this process (miles builds one), for the data buffer bound to this class
    live: ClassVar[StageDataSource | None] = None

    def __init__(self, args: Any) -> None:
        self.args = args
        self.n_samples_per_prompt = int(args.n_samples_per_prompt)
        self._type = self.sample_type if self.sample_type is not None else _miles_sample_type()
        self._template = self.template[0] if self.template is not None else None
        if self._template is None and getattr(args, "apply_chat_template", False):
            self._template = _miles_template(args)
        rows = load_rows(self.dataset) if isinstance(self.dataset, str | Path) else list(self.dataset)
        if rows:  # (none: the source refuses it, naming the dataset)
            _check_keys(rows, args)  # before the source declares anything in the log
        self.source = PromptSource(self.connection, rows if rows else self.dataset,
                                   kafka_client=self.kafka_client, **self.source_options)
        self.weight_version = 0  # the rollout's, as the buffer last saw it: what a take is paced at
        self._lock = threading.Lock()
        self._held: dict[str, PromptLease] = {}  # taken, neither published nor given back
        type(self).live = self

    @property
    def trainer_group_id(self) -> str:
        return str(self.source_options["trainer_group_id"])

    def get_samples(self, num_samples: int) -> list[list[Any]]:
        """`num_samples` prompt groups, each one attempt taken from the source (waits as `PromptSource.take`
        does; raises `SourceFinished` once every prompt of every epoch is settled). A row that cannot be made
        a prompt group fails its attempt (`PromptSource.fail`, the error in the log) and another is taken;
        a `RowError` is the row's, anything else is raised after its attempt is failed."""
        groups: list[list[Any]] = []
        while len(groups) < num_samples:
            lease = self.source.take(weight_version=self.weight_version)
            try:
                group = self._group(lease)
            except RowError as exc:
                self.source.fail(lease, exc)
                continue
            except Exception as exc:
                self.source.fail(lease, exc)
                raise
            with self._lock:
                self._held[str(lease.key)] = lease
            groups.append(group)
        return groups

    def _group(self, lease: PromptLease) -> list[Any]:
        # miles numbers groups and samples with counters it saves with its checkpoint; the admission's
        # offset in the log is unique in the whole run, across processes and restarts, with no checkpoint
        n = self.n_samples_per_prompt
        where = f"row {lease.key.prompt} of prompt source {lease.key.source!r}"
        group = []
        for i in range(n):
            sample = miles_prompt_sample(lease.row, self.args, self._type, self._template, where=where)
            sample.group_index = lease.request
            sample.index = lease.request * n + i
            sample.metadata[ATTEMPT_KEY] = str(lease.key)
            sample.metadata[GROUP_INDEX_KEY] = lease.request
            group.append(sample)
        return group

    def add_samples(self, samples: list[list[Any]]) -> None:
        """Groups miles will not train (`_recycle`): each unsent attempt's lease goes back, and the log hands
        its prompt out again before any fresh one. A group already sent is the log's: the stage and the
        reader settle it."""
        for group in samples:
            self.give_back(group)

    def give_back(self, group: Sequence[Any]) -> bool:
        """Give back the attempt of `group` (a prompt group or a finished one) if this process still holds
        it unsent; False if it does not (published or given back already)."""
        key = _attempt_of(group)
        with self._lock:
            lease = self._held.pop(key, None)
        if lease is None:
            log_event(log, "miles.give_back_not_held", logging.DEBUG, attempt=key)
            return False
        self.source.give_back(lease)
        return True

    def publish(self, group: Sequence[Any]) -> None:
        """Send a finished group (miles rollouts: a `Sample`, or a list of them for a multi-sample
        trajectory) as its attempt's group, and return once the broker has it."""
        key = _attempt_of(group)
        with self._lock:
            lease = self._held.pop(key, None)
        if lease is None:
            raise ConfigurationError(f"attempt {key} is not held by this data source (published or given "
                                     f"back already, or taken by another process)")
        records = [s for rollout in wire_rollouts(group) for s in rollout]
        for future in self.source.publish(lease, records):
            future.get(60)

    def held(self) -> int:
        """Attempts taken and neither published nor given back."""
        with self._lock:
            return len(self._held)

    def save(self, rollout_id: int) -> None:
        """Nothing to save: the admission log is the checkpoint (every take, send, commit and verdict is a
        record in it, and a restarted process folds it and goes on where the run is)."""

    def load(self, rollout_id: int | None = None) -> None:
        """Nothing to load: the constructor folded the admission log (see `save`)."""

    def get_buffer_length(self) -> int | None:
        return None  # no local buffer: groups miles gives back return through the log

    def close(self) -> None:
        """Called by miles' `RolloutManager.dispose`: attempts still held unsent are given back."""
        self.source.close()
        if type(self).live is self:
            type(self).live = None


def _check_keys(rows: Sequence[Row], args: Any) -> None:
    """A key no row has is a wrong argument, not bad rows: refused before a take spends the dataset's
    attempts on it."""
    for flag, key in (("--input-key", getattr(args, "input_key", "input")),
                      ("--label-key", getattr(args, "label_key", None))):
        if key is not None and not any(key in row for row in rows):
            raise ConfigurationError(f"{flag} {key!r}: no row of the dataset has it (the first row's keys: "
                                     f"{', '.join(sorted(rows[0])[:10])})")


def _attempt_of(group: Sequence[Any]) -> str:
    first = group[0][0] if isinstance(group[0], list) else group[0]
    key = (first.metadata or {}).get(ATTEMPT_KEY)
    if not isinstance(key, str):
        raise ConfigurationError("a group without its attempt in metadata: it was not taken from the stage's "
                                 "data source")
    return key


def stage_data_source(connection: Connection | str, dataset: str | Path | Sequence[Row], *, name: str,
                      trainer_group_id: str, topic: str = "rollouts", train_data_topic: str = "train-data",
                      seed: int = 0, epochs: int | None = None, max_attempts: int = 3,
                      sample_type: Any = None, template: Callable[[Any, Any], str] | None = None,
                      kafka_client: Client | None = None, **source_options: Any) -> type[StageDataSource]:
    """The `StageDataSource` class for `--data-source-path`, bound to a cluster, a dataset and the source's
    settings (`PromptSource`: `name`, `seed`, `epochs`, `max_attempts`, the topics and the trainer's consumer
    group, which its data buffer reads with). `template(messages, tools)`: the chat template step for
    `--apply-chat-template` (default: miles' own, with the tokenizer of `--hf-checkpoint`)."""
    for pacing in ("max_policy_lag", "max_unconsumed_groups"):
        if source_options.get(pacing) is not None:
            # miles takes prompts on its rollout event loop: a take waiting for the trainer would hold
            # the very loop the trainer's step needs; miles' own in-flight budget bounds the run-ahead
            raise ConfigurationError(f"{pacing}: a miles data source is not paced (miles bounds the groups "
                                     f"in flight itself)")
    options = {"name": name, "trainer_group_id": trainer_group_id, "topic": topic,
               "train_data_topic": train_data_topic, "seed": seed, "epochs": epochs,
               "max_attempts": max_attempts, **source_options}
    return type("BoundStageDataSource", (StageDataSource,), {
        "connection": connection, "dataset": dataset, "source_options": options, "sample_type": sample_type,
        "template": None if template is None else (template,), "kafka_client": kafka_client, "live": None})
