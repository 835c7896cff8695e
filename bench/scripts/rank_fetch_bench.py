"""Reader ranks against the broker: bytes each data-parallel world fetches, and MB/s per rank, measured by the
broker's own per-topic byte counters (JMX), outside the reader processes.

Run: .venv/bin/python bench/scripts/rank_fetch_bench.py --bootstrap-servers HOST:PORT \
    --jmx HOST:JMXPORT [--samples 128] [--tokens 32768] [--layers 8] [--topk 8] [--worlds 1,4,8] [--json]

The broker must expose JMX (start it with JAVA_TOOL_OPTIONS="-Dcom.sun.management.jmxremote.port=P
-Dcom.sun.management.jmxremote.rmi.port=P -Dcom.sun.management.jmxremote.authenticate=false
-Dcom.sun.management.jmxremote.ssl=false -Djava.rmi.server.hostname=127.0.0.1"); the counters are read with
the JDK alone (`java JmxBytes.java`, a 20-line client written next to the run).

Data: --samples train samples of --tokens int32 tokens (the second half the response, uint8 loss mask,
float32 rollout log-probs) with MoE routing replay `rollout_routed_experts` of shape (tokens - 1, layers,
topk) in uint8, groups of 8 keyed like the worker's output, 3 partitions, one record per sample.

Paths, each at every world size W (W rank processes started together, each timed from its start to its
last batch; the broker's BytesOutPerSec count of the topic read before and after gives the bytes the W
ranks fetched together):

* `all partitions`: `TrainDataReader(rank=r, world_size=W)` as it is: every rank reads every record.
* `own share by offset`: each rank fetches only the records of its share (rollout i of each batch of 4
  groups to rank i mod W, the reader's default shard) by offset (assign, seek, one record batch per fetch
  request), from the offsets the producer's delivery reports gave, as a per-group head would carry them.
  Fetch and decode only: what rank-local fetch costs on the wire, not a reader.
* `own` (rank-local fetch): `TrainDataReader(rank=r, world_size=W, fetch="own")`, the reader as a trainer
  runs it: groups from the heads topic (written here next to the data, as the stage's `--write-heads`
  writes them, from the producer's delivery reports), each rank's rows fetched by offset. Bytes counted are
  train-data's alone (the heads topic's are reported apart: `heads_bytes`).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np

from rollout_stream.codec import Sample, ShapedArray, TrainSample, decode_train_sample, encode_train_sample
from rollout_stream.codec.group_heads import GroupHead, HeadSample, encode_group_head
from rollout_stream.names import heads_topic

GROUP = 8
GROUPS_PER_BATCH = 4

_JMX_CLIENT = """
import javax.management.*;
import javax.management.remote.*;
public class JmxBytes {
    public static void main(String[] a) throws Exception {
        JMXConnector c = JMXConnectorFactory.connect(
            new JMXServiceURL("service:jmx:rmi:///jndi/rmi://" + a[0] + "/jmxrmi"));
        MBeanServerConnection s = c.getMBeanServerConnection();
        for (String name : new String[] {"BytesInPerSec", "BytesOutPerSec"}) {
            long n = 0;
            try {
                n = (Long) s.getAttribute(new ObjectName(
                    "kafka.server:type=BrokerTopicMetrics,name=" + name + ",topic=" + a[1]), "Count");
            } catch (InstanceNotFoundException e) {}
            System.out.print(n + " ");
        }
        c.close();
    }
}
"""


def broker_bytes(jmx: str, topic: str, workdir: Path) -> tuple[int, int]:
    """(bytes in, bytes out) of `topic` as the broker counts them."""
    source = workdir / "JmxBytes.java"
    if not source.exists():
        source.write_text(_JMX_CLIENT)
    from rollout_stream.broker.java import find_java

    out = subprocess.run([str(find_java().executable), str(source), jmx, topic], capture_output=True,
                         text=True, check=True)
    values = [int(v) for v in out.stdout.split()]
    return values[0], values[1]


def make_train(i: int, tokens: int, layers: int, topk: int, rng: np.random.Generator) -> TrainSample:
    g, member = divmod(i, GROUP)
    response = tokens // 2
    sample = Sample(
        group_index=g, index=i, rollout_id=i, run_id="bench", group_size=GROUP,
        tokens=rng.integers(0, 151_936, size=tokens, dtype=np.int32),  # type: ignore[arg-type]
        response_length=response,
        loss_mask=(rng.random(response) > 0.1).astype(np.uint8),  # type: ignore[arg-type]
        rollout_log_probs=np.log(rng.random(response, dtype=np.float32) + np.float32(1e-6)),
        rollout_routed_experts=ShapedArray.of(rng.integers(0, 128, size=(tokens - 1, layers, topk),
                                                           dtype=np.uint8)),
        reward=float(member % 2), weight_versions=["1"],
    )
    train = TrainSample(
        sample=sample, raw_reward=float(member % 2), reward=float(member % 2) - 0.5, group_key=f"bench/{g}",
        group_rollout_count=GROUP, group_sample_count=GROUP, group_mean=0.5, group_std=0.5,
        zero_variance=False, advantage_estimator="grpo", rewards_normalization=True,
        grpo_std_normalization=True, reward_key=None, source_topic="rollouts", source_partition=0,
        source_offset=i)
    return train


def head_of(group: list[tuple[TrainSample, int, int, int]]) -> GroupHead:
    """The head the stage writes for a group of (sample, partition, offset, value bytes)."""
    first = group[0][0]
    return GroupHead(
        topic="", partition=group[0][1], group_key=first.group_key, rollout_count=first.group_rollout_count,
        mean=first.group_mean, std=first.group_std, zero_variance=first.zero_variance,
        samples=[HeadSample(offsets=[o], nbytes=n, source_topic=t.source_topic,
                            source_partition=t.source_partition, source_offset=t.source_offset,
                            rollout_id=t.sample.rollout_id, index=t.sample.index,
                            tokens=len(t.sample.tokens or ()), response_length=t.sample.response_length,
                            loss_tokens=int((t.sample.loss_mask.numpy() != 0).sum())
                            if t.sample.loss_mask is not None else t.sample.response_length,
                            weight_versions=list(t.sample.weight_versions), raw_reward=t.raw_reward,
                            reward=t.reward) for t, _, o, n in group])


def produce(bootstrap: str, topic: str, samples: int, tokens: int, layers: int, topk: int
            ) -> tuple[int, list[tuple[int, int, int]]]:
    """Create the topic and write the samples; (value bytes, (group, partition, offset) per sample)."""
    from kafka import KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(name, 3, 1, topic_configs={"max.message.bytes": str(64 << 20)})
                         for name in (topic, heads_topic(topic))])
    admin.close()
    # every record its own record batch, as the stage writes train data when it writes heads: a fetch by
    # offset returns a whole batch, so shared batches would hand a rank the other ranks' records
    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=64 << 20, linger_ms=5,
                             acks="all", batch_size=1)
    rng = np.random.default_rng(0)
    futures, total = [], 0
    for i in range(samples):
        train = make_train(i, tokens, layers, topk, rng)
        value = encode_train_sample(train)
        total += len(value)
        futures.append((train, len(value), producer.send(topic, key=train.group_key.encode(), value=value)))
    producer.flush()
    placed = [(i // GROUP, f.get().partition, f.get().offset) for i, (_, _, f) in enumerate(futures)]
    for start in range(0, len(futures), GROUP):  # the heads, as the stage's --write-heads writes them
        group = [(t, f.get().partition, f.get().offset, n) for t, n, f in futures[start:start + GROUP]]
        head = msgspec.structs.replace(head_of(group), topic=topic)
        producer.send(heads_topic(topic), key=head.group_key.encode(), value=encode_group_head(head),
                      partition=head.partition)
    producer.flush()
    producer.close()
    return total, placed


# ---- the rank processes ------------------------------------------------------------------------
def child_reader(args: argparse.Namespace) -> dict[str, Any]:
    import torch  # noqa: F401  (a trainer has it loaded: its import, seconds, is not the reader's start-up)

    from rollout_stream.reader import TrainDataReader

    fetch: Literal["all", "own"] = "own" if args.child == "own" else "all"
    groups = args.samples // GROUP
    started, cpu = time.perf_counter(), time.process_time()
    samples = batches = 0
    times: list[float] = []
    with TrainDataReader(args.bootstrap_servers, args.topic, f"bench-{uuid.uuid4().hex[:8]}",
                         start="earliest", groups_per_batch=GROUPS_PER_BATCH, rank=args.rank,
                         world_size=args.world, partition_idle_ms=0, publish_progress=False,
                         client=args.client, fetch=fetch) as reader:
        while batches * GROUPS_PER_BATCH < groups:
            batch = reader.next_batch(timeout=300)
            if batch is None:
                raise RuntimeError(f"only {batches} batches arrived")
            times.append(time.perf_counter())
            batches += 1
            samples += len(batch.samples)
            time.sleep(args.step_ms / 1000)  # the training step the next batch's fetch may overlap
    # batches/s from the reader's start to its last batch (a whole-topic reader reads ahead of its first
    # batch, so a rate from the first batch on would leave out what it fetched meanwhile)
    rate = len(times) / (times[-1] - started) if times else 0.0
    # and from the first batch on: the steady rate of a long backlog (its read-ahead, a few batches, small)
    steady = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0
    return {"seconds": time.perf_counter() - started, "samples": samples, "batches_per_s": rate,
            "steady_batches_per_s": steady, "first_batch_s": times[0] - started if times else None,
            "cpu_s": time.process_time() - cpu}


def share_of(placed: list[tuple[int, int, int]], rank: int, world: int) -> list[tuple[int, int]]:
    """(partition, offset) of this rank's samples: per batch of GROUPS_PER_BATCH groups, rollout i → rank
    i mod W."""
    mine = []
    groups = sorted({g for g, _, _ in placed})
    for start in range(0, len(groups), GROUPS_PER_BATCH):
        batch = set(groups[start:start + GROUPS_PER_BATCH])
        rows = [(p, o) for g, p, o in placed if g in batch]
        mine += [row for i, row in enumerate(rows) if i % world == rank]
    return mine


def child_share(args: argparse.Namespace) -> dict[str, Any]:
    placed = [(g, p, o) for g, p, o in json.loads(Path(args.plan).read_text())]
    want = share_of(placed, args.rank, args.world)
    by_partition: dict[int, list[int]] = {}
    for p, o in want:
        by_partition.setdefault(p, []).append(o)
    started = time.perf_counter()
    fetch = _share_kafka_python if args.client == "kafka-python" else _share_confluent
    samples = fetch(args, by_partition)
    return {"seconds": time.perf_counter() - started, "samples": samples}


def _share_kafka_python(args: argparse.Namespace, by_partition: dict[int, list[int]]) -> int:
    from kafka import KafkaConsumer, TopicPartition

    # The smallest fetch sizes: the broker still answers with one whole record batch per partition.
    consumer = KafkaConsumer(bootstrap_servers=args.bootstrap_servers, enable_auto_commit=False,
                             isolation_level="read_committed", max_partition_fetch_bytes=1, fetch_max_bytes=1,
                             fetch_max_wait_ms=100)
    samples = 0
    for p, offsets in sorted(by_partition.items()):
        offsets.sort()
        tp = TopicPartition(args.topic, p)
        consumer.assign([tp])
        consumer.seek(tp, offsets[0])
        i = 0
        while i < len(offsets):
            for records in consumer.poll(timeout_ms=1000, max_records=1).values():
                for m in records:
                    if i < len(offsets) and m.offset == offsets[i]:
                        decode_train_sample(m.value)
                        samples += 1
                        i += 1
                        if i < len(offsets) and offsets[i] != m.offset + 1:
                            consumer.seek(tp, offsets[i])
    consumer.close()
    return samples


def _share_confluent(args: argparse.Namespace, by_partition: dict[int, list[int]]) -> int:
    import confluent_kafka as ck

    # One record batch per fetch request and one message in the local queue: the fetcher never runs ahead
    # of the offsets asked for by more than one batch.
    consumer = ck.Consumer({
        "bootstrap.servers": args.bootstrap_servers, "group.id": f"bench-{uuid.uuid4().hex[:8]}",
        "isolation.level": "read_committed", "enable.auto.commit": False, "max.partition.fetch.bytes": 1,
        "fetch.max.bytes": 1000, "message.max.bytes": 1000, "receive.message.max.bytes": 80 << 20,
        "queued.min.messages": 1, "fetch.queue.backoff.ms": 20, "fetch.wait.max.ms": 100})
    samples = 0
    for p, offsets in sorted(by_partition.items()):
        offsets.sort()
        consumer.assign([ck.TopicPartition(args.topic, p, offsets[0])])
        i = 0
        while i < len(offsets):
            m = consumer.poll(1.0)
            if m is None or m.error() or m.offset() != offsets[i] or (value := m.value()) is None:
                continue
            decode_train_sample(value)
            samples += 1
            i += 1
            if i < len(offsets) and offsets[i] != offsets[i - 1] + 1:
                consumer.seek(ck.TopicPartition(args.topic, p, offsets[i]))
        consumer.unassign()
    consumer.close()
    return samples


def run_world(args: argparse.Namespace, path: str, world: int, plan: Path, workdir: Path,
              topic_bytes: int) -> dict[str, Any]:
    before = broker_bytes(args.jmx, args.topic, workdir)[1]
    heads_before = broker_bytes(args.jmx, heads_topic(args.topic), workdir)[1]
    # the rank processes run as this one does (`python -S` with PYTHONPATH: another checkout's code)
    procs = [subprocess.Popen(
        [sys.executable, *(["-S"] if sys.flags.no_site else []), __file__, "--child", path, "--rank", str(r),
         "--world", str(world), "--topic",
         args.topic, "--bootstrap-servers", args.bootstrap_servers, "--samples", str(args.samples),
         "--plan", str(plan), "--client", args.client, "--step-ms", str(args.step_ms)],
        stdout=subprocess.PIPE, text=True) for r in range(world)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=900)
        if proc.returncode:
            raise RuntimeError(f"rank process failed ({proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    time.sleep(1.0)  # the counter is updated as responses are sent
    fetched = broker_bytes(args.jmx, args.topic, workdir)[1] - before
    heads = broker_bytes(args.jmx, heads_topic(args.topic), workdir)[1] - heads_before
    seconds = [r["seconds"] for r in results]
    return {
        "path": path, "world": world, "fetched_bytes": fetched, "fetched_over_topic": fetched / topic_bytes,
        "heads_bytes": heads,
        "samples": sum(r["samples"] for r in results),
        "rank_seconds_max": max(seconds),
        "rank0_batches_per_s": results[0].get("batches_per_s"),
        "rank0_steady_batches_per_s": results[0].get("steady_batches_per_s"),
        "rank0_first_batch_s": results[0].get("first_batch_s"),
        "rank_cpu_s": [r.get("cpu_s") for r in results],
        # per rank: the topic's bytes it made available to its trainer (its share, or all it read) per second
        "rank_MBps_share": topic_bytes / world / 1e6 / max(seconds),
        "rank_MBps_fetched": fetched / world / 1e6 / max(seconds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--jmx", default="127.0.0.1:19547")
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--topk", type=int, default=8)
    parser.add_argument("--worlds", default="1,4,8")
    parser.add_argument("--paths", default="all,share,own")
    parser.add_argument("--client", default="confluent")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--step-ms", type=float, default=0.0,
                        help="each reader rank sleeps this long after a batch, as a training step would")
    parser.add_argument("--child", choices=["all", "share", "own"])
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--topic", default="")
    parser.add_argument("--plan", default="")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child_share(args) if args.child == "share" else child_reader(args)))
        return 0
    args.topic = f"rank-fetch-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        topic_bytes, placed = produce(args.bootstrap_servers, args.topic, args.samples, args.tokens,
                                      args.layers, args.topk)
        plan = workdir / "plan.json"
        plan.write_text(json.dumps(placed))
        rows = [run_world(args, path, int(w), plan, workdir, topic_bytes)
                for w in args.worlds.split(",") for path in args.paths.split(",")]
    report = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
              "client": args.client, "samples": args.samples, "topic_bytes": topic_bytes,
              "record_bytes": topic_bytes // args.samples, "rows": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{args.samples} samples, {topic_bytes / 1e6:.1f} MB ({topic_bytes // args.samples:,} B each), "
          f"client {args.client}")
    print(f"{'path':<22}{'W':>3}{'fetched MB':>12}{'× topic':>9}{'s (slowest)':>13}{'MB/s/rank':>11}"
          f"{'batches/s r0':>14}{'1st batch s':>13}")
    for r in rows:
        rate, first = r["rank0_batches_per_s"], r.get("rank0_first_batch_s")
        print(f"{r['path']:<22}{r['world']:>3}{r['fetched_bytes'] / 1e6:>12.1f}"
              f"{r['fetched_over_topic']:>9.2f}{r['rank_seconds_max']:>13.2f}{r['rank_MBps_share']:>11.1f}"
              f"{'' if rate is None else f'{rate:.2f}':>14}"
              f"{'' if first is None else f'{first:.2f}':>13}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
