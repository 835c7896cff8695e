"""The stage's own work per sample, without Kafka: what `python -m bench run` cannot separate.

Feeds benchmark-workload records (as the consumer hands them over: polls of POLL_RECORDS, per partition)
through the real `Worker` record path —
decode, validation, windowing, shared-reward check, normalization, train-record encoding and the offset
ledger — with a stub delivery that drops the outputs, and prints µs per sample (best of 3, or --passes).
`--profile` adds a cProfile listing of one more pass.

It also prints µs per sample of each step (best of as many), each timed in isolation over the same records:

* decode: what the window store runs first on every record value: `rollout_stream.codec.head.decode_head`, and
  `decode_sample` where that declines (before decode_head existed: `decode_sample` alone);
* validation: what it runs next on every decoded head: `rollout_stream.core.validate.plainly_valid`, and
* `validate_sample`
  of the whole sample where that declines (before plainly_valid existed: `validate_sample` alone);
* decode + validation (C), in place of both where `rollout_stream.core._plain_scan` is in use
* (codec/compiled.py): its one
  pass over each record's bytes, and the two steps above where it declines;
* normalization: `rollout_stream.core.rewards.normalize_group` of every published group's held samples;
* encode: `rollout_stream.worker.outputs.train_records` of every published group;
* ledger: `OffsetLedger.hold` of every record (its `resolve` is delivery's, after an ack: not in the pass);
* windows: `WindowStore.take` of every InputRecord, minus decode, validation and normalization (which it
  runs inside);
* worker glue (by subtraction): the whole `Worker` pass minus the steps above — building the
  `InputRecord`, routing, counters (and the noise of a busy machine: best-of minima do not add up exactly).

On a busy machine (another process on the 2 cores) `--cpu --passes 7` times the thread's CPU time instead.

    .venv/bin/python bench/scripts/stage_work_bench.py                 # 256 tokens, groups of 8
    .venv/bin/python bench/scripts/stage_work_bench.py --tokens 32768 --groups 80
    ROLLOUT_STREAM_COMPILED=0 .venv/bin/python bench/scripts/stage_work_bench.py   # the \
        Python path, no C
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import time
from collections import namedtuple
from typing import Any

import numpy as np

from bench.workloads import Workload, group_records
from rollout_stream.clients import Connection
from rollout_stream.codec import compiled, decode_sample
from rollout_stream.codec.head import decode_head, ext_all_finite, item_count
from rollout_stream.config import TopicNames, WorkerConfig
from rollout_stream.core.offsets import OffsetLedger
from rollout_stream.core.records import InputRecord, Published
from rollout_stream.core.rewards import normalize_group
from rollout_stream.core.validate import plainly_valid, validate_sample
from rollout_stream.core.windows import WindowStore
from rollout_stream.worker import Worker
from rollout_stream.worker.allocator import reuse_freed_buffers
from rollout_stream.worker.cadence import POLL_RECORDS
from rollout_stream.worker.outputs import train_records

ConsumerRecord = namedtuple("ConsumerRecord", "topic partition offset timestamp key value headers")


class _Producer:
    def partition_for(self, topic: str, key: bytes) -> int:
        return hash(key) % 3


class _Delivery:
    """Where the worker's outputs go: nowhere (the Kafka side is what the real bench measures)."""

    producer = _Producer()

    def send(self, outs: Any) -> None:
        pass


def records(w: Workload) -> list[ConsumerRecord]:
    rng = np.random.default_rng(0)
    now = int(time.time() * 1000)
    out, offset = [], 0
    for gi in range(w.groups):
        for key, value in group_records(w, "run", gi, rng):
            out.append(ConsumerRecord("rollouts", gi % 3, offset, now, key, value, []))
            offset += 1
    return out


def polls(recs: list[ConsumerRecord], size: int = POLL_RECORDS) -> list[list[ConsumerRecord]]:
    """The records as the loop gets them: polls of `size` records, each handed over per partition."""
    out: list[list[ConsumerRecord]] = []
    for start in range(0, len(recs), size):
        by_partition: dict[int, list[ConsumerRecord]] = {}
        for rec in recs[start:start + size]:
            by_partition.setdefault(rec.partition, []).append(rec)
        out += by_partition.values()
    return out


def one_pass(recs: list[ConsumerRecord]) -> float:
    return worker_pass(polls(recs), len(recs))


def worker_pass(batches: list[list[ConsumerRecord]], count: int) -> float:
    config = WorkerConfig(bootstrap_servers="unused:9092", topics=TopicNames(), group_id="work-bench")
    worker = Worker(config, Connection("unused:9092"))
    processor = worker.processor
    processor.delivery = _Delivery()  # type: ignore[assignment]  # a stand-in delivery that sends nowhere
    now = int(time.time() * 1000)
    started = CLOCK()
    for batch in batches:
        processor._take(batch, now)
    worker.store.drain_changes()
    seconds = CLOCK() - started
    assert processor.outcomes.samples_published == count, processor.outcomes  # routed; nothing commits here
    return seconds


PASSES = 3
CLOCK = time.perf_counter  # --cpu: time.thread_time, the main thread's CPU time (steadier on a busy machine)


def _best(fn: Any) -> float:
    return min(_timed(fn) for _ in range(PASSES))


def _timed(fn: Any) -> float:
    started = CLOCK()
    fn()
    return CLOCK() - started


def steps(recs: list[ConsumerRecord]) -> dict[str, float]:
    """Seconds (best of PASSES) of each step over all of `recs`, each in isolation (see the docstring)."""
    config = WorkerConfig(bootstrap_servers="unused:9092", topics=TopicNames(), group_id="work-bench")
    wcfg = config.windows
    now = int(time.time() * 1000)
    values = [r.value for r in recs]
    samples = [decode_sample(v) for v in values]
    heads = [decode_head(v) for v in values]
    inputs = [InputRecord(r.topic, r.partition, r.offset, r.timestamp, r.key, r.value, ())
              for r in recs]
    published: list[Published] = []
    store = WindowStore(wcfg)
    for record in inputs:
        published += [o for o in store.take(record, now) if isinstance(o, Published)]
    held = [[m.sample for m in g.members] for g in published]
    reward = wcfg.reward

    def decode() -> None:
        for v in values:
            if decode_head(v) is None:
                decode_sample(v)

    def validation() -> None:
        for r, h, s in zip(recs, heads, samples, strict=True):
            if h is None or plainly_valid(h, r.key, reward.reward_key, wcfg.limits, item_count,
                                          ext_all_finite) is None:
                validate_sample(s, key=r.key, reward_key=reward.reward_key, limits=wcfg.limits)

    def windows() -> None:
        store = WindowStore(wcfg)
        for record in inputs:
            store.take(record, now)

    def normalization() -> None:
        for h in held:
            normalize_group(h, reward)

    def encode() -> None:
        for g in published:
            train_records(g, reward, "train-data", 0)

    def ledger() -> None:
        led = OffsetLedger()
        for r in recs:
            led.hold(r.partition, r.offset)

    limits = wcfg.limits
    scan = WindowStore(wcfg)._scan

    def decode_and_validation() -> None:  # what the store runs where the C scan is in use
        assert scan is not None
        for r, h, s in zip(recs, heads, samples, strict=True):
            if scan(r.value, r.key, limits.default_group_size, limits.max_group_size,
                    limits.max_sibling_count) is None:
                if h is None:
                    decode_sample(r.value)
                validate_sample(s, key=r.key, reward_key=reward.reward_key, limits=limits)

    first = [("decode", decode), ("validation", validation)] if scan is None \
        else [("decode + validation (C)", decode_and_validation)]
    out = {name: _best(fn) for name, fn in [*first, ("windows", windows), ("normalization", normalization),
                                            ("encode", encode), ("ledger", ledger)]}
    out["windows"] -= sum(out[name] for name, _ in first) + out["normalization"]
    return out


def main() -> None:
    global PASSES, CLOCK
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--siblings", type=int, default=1)
    ap.add_argument("--groups", type=int, default=3000)
    ap.add_argument("--passes", type=int, default=3, help="best of this many (more on a busy machine)")
    ap.add_argument("--cpu", action="store_true", help="time the thread's CPU time, not the wall clock")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    PASSES = args.passes
    if args.cpu:
        CLOCK = time.thread_time
    reuse_freed_buffers()  # as `rollout-stream run` does
    w = Workload("x", args.tokens, args.group_size, args.siblings, args.groups)
    recs = records(w)
    one_pass(recs[: max(1, len(recs) // 10)])  # warm-up: imports, caches
    # As `Worker.open` does: what is alive now (torch above all) is left out of the collector's passes, each
    # of which would otherwise scan ~200k objects the real loop never scans.
    gc.collect()
    gc.freeze()
    batches = polls(recs)
    best = min(worker_pass(batches, len(recs)) for _ in range(PASSES))
    print(f"{w.label()[2:]}: {best / len(recs) * 1e6:.1f} µs per sample of the stage's own work "
          f"({len(recs)} samples, best of {PASSES}; hot path {compiled.status().describe()})")
    parts = steps(recs)
    parts["worker glue"] = best - sum(parts.values())
    for name, seconds in parts.items():
        print(f"  {name:<14} {seconds / len(recs) * 1e6:6.2f} µs")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        one_pass(recs)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
