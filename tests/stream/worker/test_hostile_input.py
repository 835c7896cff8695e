"""Hostile input never stops the worker, and every record is accounted for.

One worker (in a thread) serves the whole module; hypothesis sends it batches of random bytes, truncated
records, wrongly typed maps, headers declaring 2^32-1 items, NaN/inf rewards, absurd sizes, None keys,
empty values and tombstones, mixed with valid groups. After each batch: the worker is alive and still
publishes, `records_in == published + dead-lettered + duplicates + held in open windows`, open windows drain
after the group timeout, and every dead-letter carries its original bytes, one of the six reason codes and a
message.
"""

from __future__ import annotations

import logging
import math
import threading
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field

import msgspec
import pytest
from hypothesis import HealthCheck, Phase, example, given, note, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, TopicPartition
from kafka.partitioner.default import murmur2

from rollout_stream.codec import DeadLetterReason, Sample, decode_train_sample, encode_sample, group_key
from rollout_stream.config import WorkerConfig
from rollout_stream.producer import RolloutProducer
from tests.stream.helpers import new_topics, running_worker, wait_until

# any client: decoding and routing bytes; both clients hand over the same bytes
pytestmark = pytest.mark.any_client

REASONS = {r.value for r in DeadLetterReason}
GROUP_TIMEOUT_S = 2.0
PARTITIONS = 3


# ---- the module's worker -------------------------------------------------------------------------
class _Recent(logging.Handler):
    """The worker's last log lines (event and fields), shown when a batch is not accounted for."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: deque[str] = deque(maxlen=400)

    def emit(self, record: logging.LogRecord) -> None:
        fields = getattr(record, "fields", {})
        if getattr(record, "event", record.getMessage()) not in (
            "dead_letter", "dead_letter.straggler", "duplicate.dropped"
        ):
            self.lines.append(f"{getattr(record, 'event', record.getMessage())} {fields}")


@dataclass
class Stage:
    bootstrap: str
    worker: object
    thread: threading.Thread
    topics: object
    train: KafkaConsumer
    dlq: KafkaConsumer
    log: _Recent
    outputs: list = field(default_factory=list, repr=False)  # (kind, input (partition, offset), record)

    def read(self) -> None:
        """Poll both output topics; remember every record with the input it came from."""
        for r in (r for recs in self.train.poll(timeout_ms=200).values() for r in recs):
            t = decode_train_sample(r.value)
            self.outputs.append(("train", (t.source_partition, t.source_offset), r))
        for r in (r for recs in self.dlq.poll(timeout_ms=200).values() for r in recs):
            h = {k: v.decode() for k, v in r.headers}
            self.outputs.append(("dlq", (int(h["x-original-partition"]), int(h["x-original-offset"])), r))


def _tail(bootstrap: str, topic: str) -> KafkaConsumer:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                             enable_auto_commit=False, max_partition_fetch_bytes=64 << 20)
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    return consumer


@pytest.fixture(scope="module")
def stage(kafka_bootstrap):
    topics = new_topics(kafka_bootstrap, partitions=PARTITIONS, prefix="hostile")
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"g-{topics.input}",
                          group_timeout_s=GROUP_TIMEOUT_S, commit_interval_s=0.2)
    logger, recent = logging.getLogger("rollout_stream"), _Recent()
    level = logger.level
    logger.addHandler(recent)
    logger.setLevel(min(level or logging.INFO, logging.INFO))
    before = set(threading.enumerate())
    try:
        with running_worker(config) as worker:
            thread = next(t for t in set(threading.enumerate()) - before
                          if "running_worker" in getattr(getattr(t, "_target", None), "__qualname__", ""))
            train, dlq = _tail(kafka_bootstrap, topics.output), _tail(kafka_bootstrap, topics.dead_letter)
            try:
                yield Stage(kafka_bootstrap, worker, thread, topics, train, dlq, recent)
            finally:
                train.close()
                dlq.close()
    finally:
        logger.removeHandler(recent)
        logger.setLevel(level)


# ---- hostile records -----------------------------------------------------------------------------
# A record is described without its namespace (run_id), which each example sets fresh:
#   ("raw", key, value)               bytes as they are
#   ("sample", key_mode, fields, cut) a Sample, optionally truncated to `cut` of its bytes
#   ("map", key_mode, mapping)        a msgpack map of Sample's fields with wrong types mixed in
# key_mode: "group" (the right key), None, or explicit bytes.
U64 = 2**64 - 1
INT = st.integers(-(2**63), U64)
ABSURD_SIZES = [0, -1, -(2**63), 10**9, 2**31, 2**63 - 1, U64, 4097]
HUGE = [  # msgpack headers that declare 2^32-1 items or bytes and deliver (almost) none
    b"\xdf\xff\xff\xff\xff",  # map32
    b"\xdd\xff\xff\xff\xff",  # array32
    b"\xdb\xff\xff\xff\xff",  # str32
    b"\xc6\xff\xff\xff\xff",  # bin32
    b"\xc9\xff\xff\xff\xff\x0b",  # ext32 of packed int32 tokens
    # a real record's beginning, then one field with a huge declared size
    b"\x83\xa4type\xaerollout_sample\xaegroup_index\x01\xa6tokens\xc9\xff\xff\xff\xff\x0b",
    b"\x83\xa4type\xaerollout_sample\xaegroup_index\x01\xa8metadata\xdf\xff\xff\xff\xff",
    b"\x83\xa4type\xaerollout_sample\xaegroup_index\x01\xafweight_versions\xdd\xff\xff\xff\xff",
    b"\x83\xa4type\xaerollout_sample\xaegroup_index\x01\xa6prompt\xdb\xff\xff\xff\xff",
]
KEYS = st.one_of(st.just("group"), st.just("group"), st.none(), st.just(b""), st.binary(max_size=12))
ANY = st.recursive(
    st.one_of(st.none(), st.booleans(), INT, st.floats(), st.text(max_size=8), st.binary(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8,
)
FIELDS = ["type", "schema_version", "group_index", "index", "rollout_id", "tokens", "response_length",
          "reward", "loss_mask", "rollout_log_probs", "status", "remove_sample", "weight_versions",
          "metadata", "group_size", "sibling_count", "sibling_index", "run_id", "unknown_field"]


@st.composite
def sample_fields(draw, *, hostile: bool) -> dict:
    """A sample's fields, consistent within a group (size and sibling counts follow the indices); `hostile`
    breaks one thing."""
    n = draw(st.integers(0, 4))
    gi, rid = draw(st.integers(0, 3 if hostile else 30)), draw(st.integers(0, 3))
    count = 1 + (gi + rid) % 2
    fields = {
        "group_index": gi,
        "rollout_id": rid,
        "index": rid,
        "reward": draw(st.sampled_from([0.0, 0.5, 1.0, -2.0])),
        "group_size": 1 + gi % 3,
        "sibling_count": count,
        "sibling_index": draw(st.integers(0, count - 1)),
        "tokens": draw(st.lists(st.integers(0, 50000), max_size=8)),
        "response_length": n,
        "loss_mask": [1] * n,
    }
    if hostile:
        what = draw(st.sampled_from(["reward", "group_size", "siblings", "group_index", "loss_mask"]))
        if what == "reward":
            fields["reward"] = draw(st.sampled_from([math.nan, math.inf, -math.inf, None, {"a": math.nan},
                                                     {"a": 1.0}]))
        elif what == "group_size":
            fields["group_size"] = draw(st.sampled_from(ABSURD_SIZES))
        elif what == "siblings":
            fields["sibling_count"] = draw(st.sampled_from(ABSURD_SIZES + [1, 1025]))
            fields["sibling_index"] = draw(st.sampled_from([0, -1, 1, 10**9, 2**63 - 1]))
        elif what == "group_index":
            fields["group_index"] = draw(st.sampled_from([None, -1, 2**63 - 1, U64]))
        else:
            fields["loss_mask"] = [1] * (n + 1)
    return fields


hostile_record = st.one_of(
    st.tuples(st.just("raw"), st.one_of(st.none(), st.binary(max_size=12)), st.binary(max_size=300)),
    st.tuples(st.just("raw"), st.one_of(st.none(), st.binary(max_size=12)), st.sampled_from([None, b""])),
    st.tuples(st.just("raw"), st.one_of(st.none(), st.binary(max_size=12)),
              st.builds(lambda head, tail: head + tail, st.sampled_from(HUGE), st.binary(max_size=16))),
    st.tuples(st.just("sample"), KEYS, sample_fields(hostile=False), st.floats(0.0, 0.999)),  # truncated
    st.tuples(st.just("sample"), KEYS, sample_fields(hostile=True), st.none()),
    st.tuples(st.just("sample"), KEYS, sample_fields(hostile=False), st.none()),  # valid (mostly)
    st.tuples(st.just("sample"), st.just("group"), sample_fields(hostile=False), st.none()),
    st.tuples(st.just("sample"), st.just("group"), sample_fields(hostile=False), st.none()),
    st.tuples(st.just("map"), KEYS, st.dictionaries(st.sampled_from(FIELDS), ANY, min_size=1, max_size=3)),
)


def materialize(item: tuple, ns: str) -> tuple[bytes | None, bytes | None]:
    kind = item[0]
    if kind == "raw":
        # kafka-python refuses a record with neither key nor value; an empty key is the closest it sends.
        return (b"" if item[1] is None and item[2] is None else item[1]), item[2]
    if kind == "sample":
        _, key_mode, fields, cut = item
        s = Sample(**fields, run_id=ns)
        value = encode_sample(s)
        if cut is not None:
            value = value[: int(len(value) * cut)]
    else:
        _, key_mode, overrides = item
        fields = {"type": "rollout_sample", "group_index": 1, "rollout_id": 0, "reward": 1.0, "group_size": 2,
                  "run_id": ns, "tokens": [1, 2, 3], "response_length": 1, "loss_mask": [1]}
        fields.update(overrides)
        value = msgspec.msgpack.encode(fields)
        gi = fields.get("group_index")
        s = Sample(group_index=gi if type(gi) is int else None, run_id=ns)
    if key_mode == "group":
        return (group_key(s) if s.group_index is not None else None), value
    return key_mode, value


EVERY_KIND = [  # one of each, so that every kind is sent whatever hypothesis draws
    ("raw", None, b"\x00\x01garbage"), ("raw", None, None), ("raw", b"k", None), ("raw", None, b""),
    *[("raw", b"r/1", h) for h in HUGE],
    ("sample", "group", {"group_index": 0, "rollout_id": 0, "reward": 1.0, "group_size": 2}, 0.5),
    *[("sample", "group", {"group_index": 1, "rollout_id": i, "reward": r, "group_size": 2}, None)
      for i, r in enumerate([math.nan, math.inf, -math.inf])],
    *[("sample", "group", {"group_index": 2 + i, "reward": 1.0, "group_size": g}, None)
      for i, g in enumerate(ABSURD_SIZES)],
    *[("sample", "group", {"group_index": 20 + i, "reward": 1.0, "group_size": 2, "sibling_count": c}, None)
      for i, c in enumerate(ABSURD_SIZES)],
    ("sample", "group", {"group_index": 30, "reward": 1.0, "group_size": 1, "sibling_count": 2,
                         "sibling_index": 2}, None),
    ("sample", None, {"group_index": 31, "reward": 1.0, "group_size": 1}, None),
    ("map", "group", {"group_index": "seven", "reward": [1.0], "tokens": {"a": 1}}),
    ("map", "group", {"schema_version": 99}),
    ("map", "group", {"type": "train_sample"}),
    ("map", "group", {"metadata": [[[[[]]]]] * 3, "weight_versions": [1, 2]}),
    ("sample", "group", {"group_index": 40, "rollout_id": 0, "reward": 1.0, "group_size": 2}, None),
    ("sample", "group", {"group_index": 40, "rollout_id": 1, "reward": 0.0, "group_size": 2}, None),  # valid
]


# ---- the property --------------------------------------------------------------------------------
def _produce(bootstrap: str, topic: str,
             records: list[tuple[bytes | None, bytes | None]]) -> list[tuple[int, int]]:
    with RolloutProducer(bootstrap, topic=topic) as p:
        futures = [p.send_raw(k, v) for k, v in records]
        p.flush()
        return [(f.get(10).partition, f.get(10).offset) for f in futures]


def _open_records(worker) -> int:
    """Records held in open windows (read from the test thread while the worker thread may change them)."""
    for _ in range(100):
        try:
            return sum(len(w.records()) for w in list(worker.store.open.values()))
        except RuntimeError:  # a window changed size during iteration: look again
            continue
    raise AssertionError("could not count the open windows' records")


def _resolved(worker) -> int:
    st_ = worker.stats
    return (st_.samples_published + st_.zero_variance_dropped + sum(st_.dead_lettered.values())
            + st_.duplicates)


def _state(stage: Stage) -> str:
    worker = stage.worker
    return (f"stats {worker.stats}; open windows {worker.store.open_count()} holding {_open_records(worker)} "
            f"records; the worker's last events:\n" + "\n".join(list(stage.log.lines)[-40:]))


def _wait(stage: Stage, predicate, timeout: float, what: str) -> None:
    """wait_until, with the worker's counters and last events in the failure message."""
    try:
        wait_until(predicate, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {_state(stage)}") from None


def _canaries(ns: str) -> list[tuple[bytes, bytes]]:
    """A valid one-rollout group in every partition, sent last: proof that each partition still flows."""
    out, seen = [], set()
    for gi in range(10_000, 10_100):
        key = f"{ns}/{gi}".encode()
        p = (murmur2(key) & 0x7FFFFFFF) % PARTITIONS
        if p not in seen:
            seen.add(p)
            s = Sample(group_index=gi, rollout_id=0, reward=1.0, group_size=1, run_id=ns)
            out.append((group_key(s), encode_sample(s)))
    assert len(seen) == PARTITIONS
    return out


@pytest.mark.kafka(timeout=240)
@settings(max_examples=6, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(batch=st.lists(hostile_record, min_size=200, max_size=200),
       copies=st.lists(st.integers(0, 199), max_size=12))
@example(batch=EVERY_KIND, copies=[0, 1, 2, len(EVERY_KIND) - 1, len(EVERY_KIND) - 1])
def test_hostile_input_never_stops_the_worker_and_every_record_is_accounted_for(stage, batch, copies):
    worker = stage.worker
    ns = f"h{uuid.uuid4().hex[:8]}"
    records = [materialize(item, ns) for item in batch]
    records += [records[i % len(records)] for i in copies]  # byte-identical copies, sent again later
    records += _canaries(ns)
    note(f"kinds: {Counter(item[0] for item in batch)}; {len(copies)} copies; namespace {ns}")
    # Start from a quiet worker (an earlier batch that failed may have left windows open): everything it
    # ever consumed is resolved.
    _wait(stage, lambda: worker.store.open_count() == 0 and worker.stats.records_in == _resolved(worker),
          GROUP_TIMEOUT_S + 30, "a quiet worker")
    in_before, resolved_before = worker.stats.records_in, _resolved(worker)
    published_before, dead_before = worker.stats.samples_published, sum(worker.stats.dead_lettered.values())
    dup_before = worker.stats.duplicates

    coords = _produce(stage.bootstrap, stage.topics.input, records)
    inputs = dict(zip(coords, records, strict=True))
    _wait(stage, lambda: worker.stats.records_in - in_before >= len(records), 60, "every record consumed")
    assert worker.stats.records_in - in_before == len(records), _state(stage)
    # Every record consumed is resolved or held in an open window.
    _wait(stage, lambda: _resolved(worker) - resolved_before + _open_records(worker) == len(records), 20,
          "records_in == published + dead-lettered + duplicates + open")
    # Open windows time out (incomplete_group), whatever they hold. (A window leaves the store before its
    # dead-letters are counted: wait for both.)
    _wait(stage,
          lambda: worker.store.open_count() == 0 and _resolved(worker) - resolved_before == len(records),
          GROUP_TIMEOUT_S + 30, "open windows expired and every record resolved")
    assert stage.thread.is_alive() and not worker.stopping

    # What reached the topics: each output traces back to an input of this batch, with its bytes.
    published = worker.stats.samples_published - published_before
    dead = sum(worker.stats.dead_lettered.values()) - dead_before
    duplicates = worker.stats.duplicates - dup_before

    def mine() -> list:
        stage.read()
        return [o for o in stage.outputs if o[1] in inputs]  # outputs of an earlier batch are not counted

    _wait(stage, lambda: len(mine()) >= published + dead, 60,
          f"{published} train samples and {dead} dead-letters")
    outputs = mine()
    covered = {src for _, src, _ in outputs}
    unaccounted = [(src, inputs[src]) for src in coords if src not in covered]
    assert len(unaccounted) == duplicates, (
        f"{len(unaccounted)} inputs have no output but {duplicates} were counted as duplicates: "
        f"{[(src, key, value[:60] if value else value) for src, (key, value) in unaccounted[:12]]}; "
        f"{_state(stage)}")
    twice = [src for src, n in Counter(src for _, src, _ in outputs).items() if n > 1]
    assert not twice, f"inputs with more than one output: {twice[:10]}"
    train = [r for kind, _, r in outputs if kind == "train"]
    dlq = [(src, r) for kind, src, r in outputs if kind == "dlq"]
    assert (len(train), len(dlq)) == (published, dead)
    for src, r in dlq:
        h = {k: v.decode() for k, v in r.headers}
        assert h["x-dlq-reason"] in REASONS, h
        assert h["x-dlq-message"].strip(), h
        assert (r.key, r.value) == inputs[src], (src, h)
    for r in train:
        t = decode_train_sample(r.value)
        assert math.isfinite(t.reward) and math.isfinite(t.raw_reward)
    published_sources = {src for kind, src, _ in outputs if kind == "train"}
    assert set(coords[-PARTITIONS:]) <= published_sources  # the canaries: every partition still publishes
