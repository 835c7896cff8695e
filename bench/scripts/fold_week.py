"""How long a newcomer folds the admission log before it can take a prompt: a synthetic week, from the start
and from the newest checkpoint (docs/loop.md, "Bounding the fold").

    .venv/bin/python bench/scripts/fold_week.py                  # 7 days, 8 producers
    .venv/bin/python bench/scripts/fold_week.py --days 1 --json

The log, one second of log time at a time: every producer renews its lease (`Renew`), one of them takes a
prompt and sends and delivers its group (`Request` naming the source, `Sent`, `Delivered`), and the trainer
marks (`TrainerMark`): the groups of each full batch as consumed, committed by the next mark. 8 producers
make 12 records a second, 7.26 M in a week; the dataset has `--prompts` rows, so a week is hundreds of
epochs. Every record is encoded to bytes first; what is timed is decoding and folding them, in one
process, with no Kafka (the pure fold: reading the topic adds the consumer's throughput on top).

Before: a fresh fold over every record. After: the newest checkpoint (one is due every `--checkpoint-every`
records, so at most that many records follow it) is decoded into a fold
(`rollout_stream.core.checkpoint.load_fold`) and the records after it are folded. The script checks that both
end in the same state.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

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
from rollout_stream.core.prompts import PromptLog, epoch_order

SOURCE = "week"


def week(days: float, producers: int, prompts: int, groups_per_batch: int) -> list[tuple[int, bytes]]:
    """(log time, record bytes) of the synthetic log."""
    out: list[tuple[int, bytes]] = []

    def put(ms: int, record: AdmissionRecord) -> int:
        out.append((ms, encode_admission(record)))
        return len(out) - 1

    put(0, Dataset(source=SOURCE, prompts=prompts, fingerprint="synthetic", seed=1))
    for p in range(producers):
        put(0, Hello(producer=f"p{p}", session=f"p{p}-0"))
    group = batch = 0
    keys: list[str] = []
    orders: dict[int, list[int]] = {}
    renews = [encode_admission(Renew(producer=f"p{p}", session=f"p{p}-0")) for p in range(producers)]
    for second in range(int(days * 86_400)):
        ms = second * 1000
        out.extend((ms, renew) for renew in renews)  # the same bytes every second
        p = second % producers
        producer, session = f"p{p}", f"p{p}-0"
        request = put(ms + 1, Request(producer=producer, session=session, trainer="trainer", weight_version=0,
                                      max_policy_lag=None, max_unconsumed_groups=None, source=SOURCE))
        epoch, row = divmod(group, prompts)
        if epoch not in orders:
            orders.clear()
            orders[epoch] = epoch_order(prompts, 1, epoch)
        order = orders[epoch]
        key = str(AttemptKey(SOURCE, epoch, 1, order[row]))
        group += 1
        put(ms + 2, Sent(producer=producer, session=session, request=request, key=key))
        put(ms + 3, Delivered(producer=producer, session=session, request=request))
        keys.append(key)
        consumed: dict[int, list[str]] = {}
        if len(keys) == groups_per_batch:
            consumed, keys = {batch: keys}, []
            batch += 1
        put(ms + 4, TrainerMark(trainer="trainer", session="t0", weight_version=batch, batch_version=batch,
                                batches=batch, groups_per_batch=groups_per_batch, max_weight_staleness=None,
                                consumed=consumed, committed_batch=batch - 1 if batch else None,
                                resumed_from=0 if second == 0 else None))
    return out


def fold(records: list[tuple[int, bytes]], into: PromptLog, start: int = 0) -> PromptLog:
    for offset in range(start, len(records)):
        ms, value = records[offset]
        into.apply(offset, ms, decode_admission(value))
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=2000)
    ap.add_argument("--groups-per-batch", type=int, default=8)
    ap.add_argument("--checkpoint-every", type=int, default=100_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    t0 = time.perf_counter()
    records = week(args.days, args.producers, args.prompts, args.groups_per_batch)
    generated_s = time.perf_counter() - t0

    # the newest checkpoint: written after the last record of the last full `checkpoint_every`
    through = (len(records) // args.checkpoint_every) * args.checkpoint_every - 1
    t0 = time.perf_counter()
    whole = fold(records[: through + 1], PromptLog())
    head_s = time.perf_counter() - t0
    state = dump_fold(whole)
    record = encode_admission(Checkpoint(through=through, fold_version=FOLD_VERSION, state=state))
    t0 = time.perf_counter()
    fold(records, whole, through + 1)
    before_s = head_s + time.perf_counter() - t0

    t0 = time.perf_counter()
    found = decode_admission(record)
    assert isinstance(found, Checkpoint)
    newcomer = fold(records, load_fold(found.state, found.fold_version), found.through + 1)
    after_s = time.perf_counter() - t0
    assert dump_fold(newcomer) == dump_fold(whole), "the checkpoint did not reach the same state"

    result = {
        "records": len(records), "days": args.days, "producers": args.producers, "prompts": args.prompts,
        "epochs": len(whole.sources[SOURCE].epochs), "generated_s": round(generated_s, 1),
        "fold_from_start_s": round(before_s, 2),
        "fold_from_checkpoint_s": round(after_s, 3), "records_after_checkpoint": len(records) - through - 1,
        "checkpoint_bytes": len(record), "us_per_record": round(before_s / len(records) * 1e6, 2),
        "cpu": _cpu(), "python": platform.python_version(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:>26}: {v}")


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
