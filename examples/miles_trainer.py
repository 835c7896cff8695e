"""A miles/slime trainer's side: two data-parallel ranks, each handed the `rollout_data` shard miles builds.

    .venv/bin/python examples/miles_trainer.py                    # $KAFKA_BOOTSTRAP_SERVERS or 127.0.0.1:9092
    .venv/bin/python examples/miles_trainer.py --bootstrap-servers localhost:9092 --batches 3

One command runs the whole path on fresh topics: miles-like samples published with `send_many`
(examples/miles_publish.py) → the stage (GRPO) → train-data → two `TrainDataReader(layout="miles")` ranks.
Every rank reads every group and coordinates with nobody; each batch's `rollout_data` is what
`split_train_data_by_dp` + `process_rollout_data_shard` give that rank in-process, so a miles trainer's
`train(rollout_id, rollout_data)` takes it unchanged. The example checks that the two shards of each
batch hold every sample of the batch once.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import threading

from local_stage import LocalStage
from miles_publish import publish_groups, synthetic_group

from rollout_stream import RolloutProducer, TrainDataReader


def rank_loop(reader: TrainDataReader, batches: int, out: list, step: threading.Barrier) -> None:
    for _ in range(batches):
        batch = reader.next_batch(timeout=60)
        if batch is None:
            step.abort()  # the other rank stops waiting too
            break
        out.append(batch)
        # The training step's all-reduce: no rank commits batch k before every rank has it. Without it, a
        # rank whose reader starts after another rank's first commit resumes from that commit and skips
        # batch 0 (a rank with no commit yet does not hold the others back: docs/reader.md).
        try:
            step.wait(timeout=60)
        except threading.BrokenBarrierError:
            break
        reader.commit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap-servers", default=None,
                        help="Kafka address (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)")
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--groups-per-batch", type=int, default=4)
    parser.add_argument("--balance-data", action="store_true", help="miles' --balance-data (Karmarkar–Karp)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    local = LocalStage.start(args.bootstrap_servers, "miles", commit_interval_s=0.2, announce=False)
    bootstrap, topics, tag = local.bootstrap, local.topics, local.tag
    status = 0
    try:
        rng = random.Random(args.seed)
        groups, index = [], 0
        for g in range(args.batches * args.groups_per_batch):
            # --balance-data needs a batch size divisible by the 2 ranks: then one sample per rollout
            group = synthetic_group(g, 2, rng, first_index=index, max_siblings=1 if args.balance_data else 2)
            groups.append(group)
            index += len(group)
        with RolloutProducer(bootstrap, topic=topics.input) as producer:
            sent = publish_groups(producer, groups)
        print(f"published {len(groups)} prompt groups ({sent} samples) with send_many", flush=True)

        results: list[list] = [[], []]
        readers = [TrainDataReader(bootstrap, topics.output, f"miles-{tag}-trainer",
                                   groups_per_batch=args.groups_per_batch, rank=r, world_size=2,
                                   layout="miles", balance_data=args.balance_data) for r in range(2)]
        step = threading.Barrier(2)
        threads = [threading.Thread(target=rank_loop, args=(readers[r], args.batches, results[r], step))
                   for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        for reader in readers:
            reader.close()
        for b in range(args.batches):
            if b >= len(results[0]) or b >= len(results[1]):
                print(f"batch {b}: not read within 60 s", file=sys.stderr)
                return 1
            shards = [results[r][b] for r in range(2)]
            ids = [s.sample.index for shard in shards for s in shard.samples]
            whole = shards[0].global_samples
            ok = shards[0].index == shards[1].index == b and len(ids) == len(set(ids)) == whole
            status |= 0 if ok else 1
            for r, shard in enumerate(shards):
                data = shard.rollout_data
                print(f"batch {shard.index} rank {r}: {len(data['tokens'])} of {whole} samples, "
                      f"{len(data)} keys, rows {list(data['sample_indices'])}; rewards "
                      f"{' '.join(f'{x:+.3f}' for x in data['rewards'])}", flush=True)
            print(f"batch {b}: the two shards hold every sample once: {'yes' if ok else 'NO'}", flush=True)
    finally:
        local.stop()
    return status


if __name__ == "__main__":
    sys.exit(main())
