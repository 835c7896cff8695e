"""Compression of big train samples on a real broker: none, gzip, snappy, lz4, zstd with kafka-python.

Run: .venv/bin/python bench/scripts/compression_bench.py [--records 20] [--mib 8] [--repeats \
    2] [--json]

snappy, lz4 and zstd need Python packages the project does not depend on (python-snappy or cramjam, lz4,
zstandard). Without them kafka-python refuses the codec and the row says "unavailable". To measure them
without touching the project's environment, install them apart and put them on PYTHONPATH:

    .venv/bin/python -m pip install --target /tmp/bench-codecs python-snappy lz4 zstandard
    PYTHONPATH=/tmp/bench-codecs .venv/bin/python bench/scripts/compression_bench.py

Method. The script starts its own single-node broker (LocalBroker, Maven jars) in a temporary data dir.
A realistic big sample: `--mib` MiB of rollout, half tokens (int32 ids drawn Zipf-like from a 32K vocabulary,
with a repeated prompt prefix and repeated spans, as in multi-turn rollouts), the rest the response's
float32 log-probs (mostly near 0, a long negative tail) and its uint8 loss mask, encoded with codec/.
Every record differs (own seed). For each codec, per repeat, a fresh one-partition topic:
  produce  `--records` records with the worker's producer settings
  (rollout_stream.kafka.kafka_python.raw_producer,
           acks=all, idempotent) plus compression_type; timed from the first send to flush() returning;
  consume  the same records with the worker's consumer settings (read_committed, 64 MiB fetches), from a
           new consumer's first poll to the last record (decompression included);
  disk     the size of the topic's log segments (*.log under the broker's log dir) after the produce.
The table shows the median over repeats; MB/s is uncompressed record bytes (10^6) per second.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import kafka
import kafka.codec as kcodec
import numpy as np
from kafka import TopicPartition
from kafka.admin import NewTopic

from rollout_stream.broker.local import LocalBroker
from rollout_stream.broker.process import free_port
from rollout_stream.clients import Connection
from rollout_stream.codec import Sample, encode_sample
from rollout_stream.kafka.kafka_python import raw_admin, raw_consumer, raw_producer

CODECS: dict[str, Any] = {
    "none": lambda: True,
    "gzip": kcodec.has_gzip,
    "snappy": kcodec.has_snappy,
    "lz4": kcodec.has_lz4,
    "zstd": kcodec.has_zstd,
}
VOCAB = 32_000


def realistic_sample(nbytes: int, seed: int) -> Sample:
    """About `nbytes` of rollout: tokens (int32) with repetition, float32 log-probs, uint8 loss mask."""
    rng = np.random.default_rng(seed)
    n = int(nbytes / 6.5)  # 4 bytes a token; the response (n/2 tokens) adds 4 + 1 bytes a token
    ranks = np.minimum(rng.zipf(1.2, n), VOCAB) - 1  # natural-text-like token frequencies
    tokens = rng.permutation(VOCAB)[ranks].astype("<i4")
    prompt = n // 8
    tokens[prompt: 2 * prompt] = tokens[:prompt]  # the prompt again (a second turn quoting the first)
    for _ in range(64):  # repeated spans: tool output, retried reasoning
        length = int(rng.integers(64, 4096))
        src, dst = rng.integers(0, n - length, 2)
        tokens[dst: dst + length] = tokens[src: src + length]
    resp = n // 2
    logp = (-rng.gamma(0.35, 0.6, resp)).astype("<f4")  # mostly near 0, a long tail
    mask = np.ones(resp, dtype="u1")
    mask[rng.integers(0, resp, resp // 20)] = 0  # tool-output spans are masked
    return Sample(group_index=seed, index=0, rollout_id=0, tokens=tokens, response_length=resp, reward=1.0,
                  loss_mask=mask, rollout_log_probs=logp, group_size=1, run_id="bench", prompt="p" * 2000)  # type: ignore[arg-type]  # numpy arrays encode as the packed arrays they stand for


def disk_bytes(log_dir: Path, topic: str) -> int:
    return sum(f.stat().st_size for f in log_dir.glob(f"{topic}-*/*.log"))


def run_once(conn: Connection, log_dir: Path, codec: str, values: list[bytes]) -> dict[str, float]:
    topic = f"compress-{codec}-{uuid.uuid4().hex[:8]}"
    admin = raw_admin(conn)
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": str(64 << 20)})])
    finally:
        admin.close()
    producer = raw_producer(conn, compression_type=None if codec == "none" else codec)
    try:
        producer.send(topic, value=b"warm-up").get(30)  # metadata and connection outside the timing
        start = time.perf_counter()
        for v in values:
            producer.send(topic, value=v)
        producer.flush(300)
        produce_s = time.perf_counter() - start
    finally:
        producer.close()
    time.sleep(0.5)  # segment sizes are flushed to the page cache on append; give the broker a moment
    on_disk = disk_bytes(log_dir, topic)
    consumer = raw_consumer(conn, group_id=None)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 1)  # past the warm-up record
        got, start = 0, time.perf_counter()
        deadline = start + 300
        while got < len(values) and time.perf_counter() < deadline:
            for recs in consumer.poll(timeout_ms=500).values():
                got += len(recs)
        consume_s = time.perf_counter() - start
    finally:
        consumer.close()
    if got != len(values):
        raise RuntimeError(f"{codec}: consumed {got} of {len(values)} records")
    return {"produce_s": produce_s, "consume_s": consume_s, "disk_bytes": float(on_disk)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--records", type=int, default=20)
    ap.add_argument("--mib", type=float, default=8.0, help="size of one record in MiB")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    size = int(args.mib * (1 << 20))
    values = [encode_sample(realistic_sample(size, seed)) for seed in range(args.records)]
    raw = sum(len(v) for v in values)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="compression-bench-") as tmp:
        broker = LocalBroker(port=free_port(), data_dir=Path(tmp) / "kafka")
        conn = Connection(broker.start(timeout=120))
        try:
            for codec in args.codecs.split(","):
                if not CODECS[codec]():
                    rows.append({"codec": codec, "available": False})
                    print(f"{codec:7s} unavailable (kafka-python finds no library for it)", file=sys.stderr)
                    continue
                runs = [run_once(conn, Path(tmp) / "kafka" / "kafka-logs", codec, values)
                        for _ in range(args.repeats)]
                row = {"codec": codec, "available": True,
                       **{k: statistics.median(r[k] for r in runs) for k in runs[0]}}
                row["ratio"] = raw / row["disk_bytes"]
                row["produce_mb_s"] = raw / 1e6 / row["produce_s"]
                row["consume_mb_s"] = raw / 1e6 / row["consume_s"]
                rows.append(row)
                print(f"{codec:7s} produce {row['produce_mb_s']:7.1f} MB/s  "
                      f"consume {row['consume_mb_s']:7.1f} MB/s  disk {row['disk_bytes'] / 2**20:8.1f} MiB  "
                      f"ratio {row['ratio']:.2f}", file=sys.stderr)
        finally:
            broker.stop(timeout=30)
    meta = {"records": args.records, "record_bytes": raw // args.records, "raw_bytes": raw,
            "repeats": args.repeats, "python": platform.python_version(), "kafka_python": kafka.__version__,
            "machine": platform.machine()}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
    else:
        print(f"{args.records} records of {raw / args.records / 2**20:.2f} MiB ({raw / 2**20:.0f} MiB), "
              f"median of {args.repeats}")
        print("| codec | produce MB/s | consume MB/s | on disk MiB | ratio |")
        print("|---|---:|---:|---:|---:|")
        for r in rows:
            if not r["available"]:
                print(f"| {r['codec']} | unavailable | | | |")
            else:
                print(f"| {r['codec']} | {r['produce_mb_s']:.1f} | {r['consume_mb_s']:.1f} | "
                      f"{r['disk_bytes'] / 2**20:.1f} | {r['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
