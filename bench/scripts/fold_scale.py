"""The admission and prompt fold at scale (docs/loop.md, "Bounding the fold"): a record's cost against the
backlog, and a checkpoint of a 10,000,000-prompt dataset.

    .venv/bin/python bench/scripts/fold_scale.py                       # both parts
    .venv/bin/python bench/scripts/fold_scale.py --part backlog --reference
    .venv/bin/python bench/scripts/fold_scale.py --part dataset --bootstrap 127.0.0.1:29092 --json

**backlog**: `--backlog` groups (10, 1,000, 10,000, 100,000) admitted, sent and delivered and not consumed,
then the steady state timed: each 10 ms of log time a producer takes a prompt (a paced `Request` naming the
source, `Sent`, `Delivered`) and the trainer consumes the oldest group (`TrainerMark`, a batch of 64 committed
as it fills, one version a batch); every second 8 producers renew. Records are encoded first; what is timed is
decoding and folding them (`PromptLog`, no Kafka), `--repeats` times from the same state, the median shown
(garbage collection on, as in production: a larger heap costs its full collections). `--reference` also
times the scanning fold the indexes replaced (tests/core/admission_reference.py) on the same records, loaded
from the same state.

**dataset**: a `--prompts` dataset whose first epoch is handed out up to `--handed-out`: each second of log
time 8 producers renew, 64 takes are sent and delivered, and the trainer commits them as a batch. One fold
folds the log as it is generated; `--tail` records before the end it writes a checkpoint (split into
records of at most 900 KB, `rollout_stream.pacing.checkpoints.take_checkpoint`), then folds the tail. Timed:
a newcomer decoding the checkpoint's records, loading them and folding the tail to the log's end; it must
reach the same state. With `--bootstrap`, the checkpoint's records also go through a real broker: written to
a fresh admission topic and found and loaded by `newest_fold`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import uuid
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests/ for --reference

from rollout_stream.codec.admission import (
    AdmissionRecord,
    Checkpoint,
    Dataset,
    Delivered,
    Hello,
    Renew,
    Request,
    Sent,
    TrainerMark,
    decode_admission,
    encode_admission,
)
from rollout_stream.core.checkpoint import FOLD_VERSION, dump_fold, load_fold
from rollout_stream.core.prompt_keys import AttemptKey
from rollout_stream.core.prompts import PromptLog, epoch_permutation
from rollout_stream.pacing.checkpoints import take_checkpoint

SOURCE = "scale"
PRODUCERS = 8
GROUPS_PER_BATCH = 64


class Log:
    """The records of a run, encoded, with what the next one refers to (offsets, keys, versions)."""

    def __init__(self, prompts: int, lag: int | None) -> None:
        self.records: list[tuple[int, bytes]] = []
        self.order = epoch_permutation(prompts, 1, 0)
        self.lag, self.ms, self.taken, self.batch, self.in_batch, self.marked = lag, 0, 0, 0, 0, False
        self.put(Dataset(source=SOURCE, prompts=prompts, fingerprint="synthetic", seed=1, epochs=1))
        for p in range(PRODUCERS):
            self.put(Hello(producer=f"p{p}", session=f"p{p}-0"))
        self.renews = [encode_admission(Renew(producer=f"p{p}", session=f"p{p}-0")) for p in range(PRODUCERS)]
        self.mark()

    def put(self, record: AdmissionRecord) -> int:
        self.records.append((self.ms, encode_admission(record)))
        return len(self.records) - 1

    def offset(self) -> int:
        return len(self.records)

    def renew(self) -> None:
        self.records.extend((self.ms, r) for r in self.renews)

    def take(self) -> str:
        """A take, sent and delivered: its group's key."""
        p = self.taken % PRODUCERS
        producer, session = f"p{p}", f"p{p}-0"
        request = self.put(Request(producer=producer, session=session, trainer="trainer",
                                   weight_version=self.batch, max_policy_lag=self.lag,
                                   max_unconsumed_groups=None, source=SOURCE))
        key = str(AttemptKey(SOURCE, 0, 1, int(self.order[self.taken])))
        self.taken += 1
        self.put(Sent(producer=producer, session=session, request=request, key=key))
        self.put(Delivered(producer=producer, session=session, request=request))
        return key

    def mark(self, consumed: list[str] = ()) -> None:  # type: ignore[assignment]
        """The trainer takes `consumed` into its open batch; a full batch is committed."""
        batch = self.batch
        self.in_batch += len(consumed)
        if self.in_batch >= GROUPS_PER_BATCH:
            self.batch, self.in_batch = self.batch + 1, 0
        self.put(TrainerMark(trainer="trainer", session="t0", weight_version=self.batch,
                             batch_version=self.batch, batches=self.batch, groups_per_batch=GROUPS_PER_BATCH,
                             max_weight_staleness=self.lag,
                             consumed={batch: list(consumed)} if consumed else {},
                             committed_batch=self.batch - 1 if self.batch else None,
                             resumed_from=None if self.marked else 0))
        self.marked = True


def fold(records: list[tuple[int, bytes]], into: PromptLog, start: int = 0,
         end: int | None = None) -> PromptLog:
    for offset in range(start, len(records) if end is None else end):
        ms, value = records[offset]
        into.apply(offset, ms, decode_admission(value))
    return into


# ---- backlog -------------------------------------------------------------------------------------------
def backlog_run(backlog: int, records: int, reference: bool, repeats: int) -> dict[str, object]:
    lag = 2 * (backlog // GROUPS_PER_BATCH) + 8  # loose enough to admit the whole backlog
    log = Log(backlog + records, lag)
    line: deque[str] = deque()
    for i in range(backlog):
        line.append(log.take())
        if i % 1000 == 999:
            log.ms += 1
            log.renew()
    built = log.offset()
    fold(log.records, head := PromptLog())
    assert sum(head.snapshot().outstanding.values()) == backlog, head.snapshot().outstanding
    while log.offset() - built < records:
        log.ms += 10
        if log.ms % 1000 == 0:
            log.renew()
        line.append(log.take())
        log.mark([line.popleft()])
    state = dump_fold(head)

    def timed(new: PromptLog, end: int) -> float:
        started = time.perf_counter()
        fold(log.records, new, built, end)
        return (time.perf_counter() - started) / (end - built) * 1e6

    out: dict[str, object] = {"backlog": backlog, "records": log.offset() - built}
    runs = []
    for _ in range(repeats):  # each from the same state; the median (the machine is shared)
        fast = load_fold(state, FOLD_VERSION)
        runs.append(timed(fast, log.offset()))
        assert sum(fast.snapshot().outstanding.values()) == backlog  # it stayed at the backlog
    out["us_per_record"] = round(sorted(runs)[len(runs) // 2], 1)
    out["runs"] = [round(r, 1) for r in runs]
    if reference:
        from tests.core.admission_reference import ScanPromptLog

        scanning = load_fold(state, FOLD_VERSION)
        scanning.__class__ = ScanPromptLog  # the same state, folded by the scanning rule
        n = max(200, min(records, 2_000_000 // max(backlog, 1)))
        out["scanning_us_per_record"] = round(timed(scanning, built + n), 1)
        out["scanning_records"] = n
    return out


# ---- dataset -------------------------------------------------------------------------------------------
def dataset_run(prompts: int, handed_out: int, tail: int, bootstrap: str | None) -> dict[str, object]:
    log = Log(prompts, None)
    whole = PromptLog()
    per_second = PRODUCERS + 3 * GROUPS_PER_BATCH + 1
    cut: list[Checkpoint] = []
    started = time.perf_counter()
    while log.taken < handed_out:
        if not cut:  # fold what the last second wrote, then forget its bytes
            folded = whole.next_offset
            fold(log.records, whole, folded)
            log.records[folded:whole.next_offset] = [FOLDED] * (whole.next_offset - folded)
            if (handed_out - log.taken) // GROUPS_PER_BATCH * per_second <= tail:
                cut = take_checkpoint(whole)
        log.ms += 1000
        log.renew()
        log.mark([log.take() for _ in range(min(GROUPS_PER_BATCH, handed_out - log.taken))])
    head_s = time.perf_counter() - started
    through = cut[0].through
    checkpoint_records = [encode_admission(c) for c in cut]
    fold(log.records, whole, through + 1)

    started = time.perf_counter()
    parts = [decode_admission(value) for value in checkpoint_records]
    state = b"".join(p.state for p in parts if isinstance(p, Checkpoint))
    newcomer = load_fold(state, cut[0].fold_version)
    loaded_s = time.perf_counter() - started
    fold(log.records, newcomer, through + 1)
    newcomer_s = time.perf_counter() - started
    assert dump_fold(newcomer) == dump_fold(whole), "the newcomer did not reach the same state"
    status = newcomer.status(SOURCE)[0]
    size = sum(len(r) for r in checkpoint_records)
    out: dict[str, object] = {
        "prompts": prompts, "handed_out": status.prompts - status.waiting, "trained": status.trained,
        "log_records": log.offset(), "head_fold_s": round(head_s, 1),
        "checkpoint_records": len(checkpoint_records), "checkpoint_bytes": size,
        "checkpoint_bytes_per_prompt": round(size / prompts, 4),
        "records_after_checkpoint": log.offset() - through - 1,
        "newcomer_load_s": round(loaded_s, 2), "newcomer_to_end_s": round(newcomer_s, 2),
    }
    if bootstrap:
        out.update(through_broker(bootstrap, cut, state))
    return out


FOLDED = (0, b"")


def through_broker(bootstrap: str, parts: list[Checkpoint], state: bytes) -> dict[str, object]:
    from rollout_stream.clients import Connection
    from rollout_stream.kafka import client_for
    from rollout_stream.pacing import AdmissionWriter, ensure_admission_topic
    from rollout_stream.pacing.checkpoints import newest_fold

    conn = Connection(bootstrap)
    topic = f"fold-scale-{uuid.uuid4().hex[:8]}.admission"
    ensure_admission_topic(conn, topic)
    writer = AdmissionWriter(conn, topic)
    try:
        started = time.perf_counter()
        for part in parts:
            writer.append(part)
        written_s = time.perf_counter() - started
        for _ in range(1_000):  # other parties' records after it
            writer.send(Renew(producer="p0", session="p0-0"))
        writer.close()
        started = time.perf_counter()
        found = newest_fold(client_for(conn), topic)
        found_s = time.perf_counter() - started
    finally:
        admin = client_for(conn).admin(client_id="fold-scale")
        try:
            admin.delete_topics([topic])
        finally:
            admin.close()
    assert dump_fold(found) == state, "the broker's checkpoint is not the one written"
    return {"broker_write_s": round(written_s, 2), "broker_newest_fold_s": round(found_s, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["backlog", "dataset", "both"], default="both")
    ap.add_argument("--backlog", type=int, nargs="+", default=[10, 1_000, 10_000, 100_000])
    ap.add_argument("--records", type=int, default=30_000, help="records timed per backlog (default 30000)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per backlog, the median shown")
    ap.add_argument("--reference", action="store_true", help="also time the scanning fold")
    ap.add_argument("--prompts", type=int, default=10_000_000)
    ap.add_argument("--handed-out", type=int, default=5_000_000)
    ap.add_argument("--tail", type=int, default=100_000, help="records after the checkpoint (default 100000)")
    ap.add_argument("--bootstrap", help="also write and find the checkpoint on this broker")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result: dict[str, object] = {"cpu": _cpu(), "python": platform.python_version()}
    if args.part in ("backlog", "both"):
        result["backlog"] = [backlog_run(b, args.records, args.reference, args.repeats) for b in args.backlog]
    if args.part in ("dataset", "both"):
        result["dataset"] = dataset_run(args.prompts, args.handed_out, args.tail, args.bootstrap)
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        if isinstance(value, list):
            for row in value:
                print(f"{key:>12}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
        elif isinstance(value, dict):
            for k, v in value.items():
                print(f"{k:>30}: {v}")
        else:
            print(f"{key:>12}: {value}")


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    main()
