"""One reader rank as its own process, for tests/stream/test_reader_own_broker.py: reads `--batches` batches
with `TrainDataReader(fetch="own")`, commits after each once every rank has received it (a file barrier in
`--barrier`, as a data-parallel step's all-reduce would be: docs/reader.md, "Commit and resume"), and prints
one JSON line per batch (its index and each sample's group, rollout id and digest of its bytes), then one
with the bytes it fetched."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from rollout_stream.codec import encode_sample
from rollout_stream.reader import TrainDataReader


def barrier(directory: Path, rank: int, world: int, index: int, timeout_s: float = 240.0) -> None:
    """Wait until every rank has received batch `index`."""
    (directory / f"{index}-{rank}").touch()
    deadline = time.monotonic() + timeout_s
    while not all((directory / f"{index}-{r}").exists() for r in range(world)):
        if time.monotonic() > deadline:
            sys.exit(f"batch {index}: not every rank received it within {timeout_s:g}s")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--topic", "--group", "--client", "--barrier"):
        parser.add_argument(name, required=True)
    for name in ("--rank", "--world", "--batches", "--groups-per-batch"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args()
    with TrainDataReader(args.bootstrap, args.topic, args.group, groups_per_batch=args.groups_per_batch,
                         rank=args.rank, world_size=args.world, fetch="own", client=args.client,
                         partition_idle_ms=0, publish_progress=False) as reader:
        for _ in range(args.batches):
            batch = reader.next_batch(timeout=120)
            if batch is None:
                sys.exit("a batch did not arrive within 120 s")
            rows = [[s.group_key, s.sample.rollout_id, hashlib.sha256(encode_sample(s.sample)).hexdigest(),
                     s.reward] for s in batch.samples]
            print(json.dumps({"batch": batch.index, "rows": rows}), flush=True)
            barrier(Path(args.barrier), args.rank, args.world, batch.index)
            reader.commit()
        print(json.dumps({"payload_bytes": reader.stats.payload_bytes}), flush=True)


if __name__ == "__main__":
    main()
