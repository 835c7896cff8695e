"""Chaos with chunked samples: the worker is SIGKILLed three times while values of ~1 MB arrive as chunk
records of 64 KiB and leave the same way; afterwards every train sample and every dead-lettered value is
there exactly once, byte for byte, on each client."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter

import numpy as np
import pytest

from rollout_stream.codec import Sample, ShapedArray, encode_sample, group_key
from rollout_stream.codec import headers as H
from rollout_stream.codec.chunks import CHUNK_HEADER, split
from rollout_stream.producer import RolloutProducer
from tests.stream.helpers import joined, new_topics, read_topic, spawn_worker, train_samples

pytestmark = pytest.mark.kafka(timeout=240)

GROUPS = 24
CHUNK = 64 * 1024


def rollout(gi: int, rid: int, reward: float, *, si: int = 0, sc: int = 1) -> Sample:
    """~1 MB: 700 tokens of MoE routing replay (48 layers, top-8)."""
    experts = np.random.default_rng(gi * 10 + rid * 3 + si).integers(0, 64, (699, 48, 8), dtype="<i4")
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=reward, group_size=2, run_id="chaos",
                  sibling_index=si, sibling_count=sc, tokens=list(range(8)), response_length=4,
                  loss_mask=[1] * 4, rollout_log_probs=[-0.5] * 4,
                  rollout_routed_experts=ShapedArray.of(experts))


def chunks(*samples: Sample) -> int:
    """How many chunk records these samples' values take at least (a train record is a little larger)."""
    return sum(len(split(encode_sample(s), CHUNK)) for s in samples)


def test_kills_in_the_middle_of_chunked_values_lose_and_duplicate_nothing(kafka_bootstrap, tmp_path):
    rng = random.Random(20261205)
    topics = new_topics(kafka_bootstrap, partitions=2, prefix="chunk-chaos")
    group_id = f"chunk-chaos-{topics.input}"
    good = [[rollout(gi, 0, 1.0), rollout(gi, 1, float(gi % 3))] for gi in range(GROUPS)]
    # Siblings of rollout 0 disagree on its reward: the group's three values go to the dead-letter topic.
    violating = [rollout(GROUPS, 0, 1.0, si=0, sc=2), rollout(GROUPS, 0, 0.0, si=1, sc=2),
                 rollout(GROUPS, 1, 0.5)]
    # One value never gets its chunk 2: it and its group are dead-lettered when the group times out.
    missing = [rollout(GROUPS + 1, 0, 1.0), rollout(GROUPS + 1, 1, 0.0)]
    missing_chunks = split(encode_sample(missing[0]), CHUNK)
    logs: list = []

    def start():
        logs.append(tmp_path / f"w-{len(logs)}.log")
        return spawn_worker(kafka_bootstrap, topics, group_id, "--group-timeout", "20", "--commit-interval",
                            "0.2", "--session-timeout", "6", "--chunk-kib", str(CHUNK // 1024),
                            "--instance-id", "w1", log_path=logs[-1]), logs[-1]

    def trouble() -> str | None:
        if worker.poll() is not None:
            return f"worker exited with {worker.returncode}: {log.read_text()[-2000:]}"
        return None

    def wait_working(timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if log.exists() and "event=partition.restored" in log.read_text():
                return
            assert (problem := trouble()) is None, problem
            time.sleep(0.1)
        raise AssertionError(f"worker never got to work: {log.read_text()[-2000:]}")

    # The input goes in four parts, one for each life of the worker, sent once it works: however slow a start,
    # every kill falls within the input. A part's last group waits for its rollout 1 until the next part, so
    # each kill finds a window open and it is restored by re-reading (the group timeout outlasts a restart).
    parts = [good[k * GROUPS // 4:(k + 1) * GROUPS // 4] for k in range(4)]
    worker, log = start()
    try:
        with RolloutProducer(kafka_bootstrap, topic=topics.input, chunk_bytes=CHUNK) as p:
            held: list[Sample] = []
            for k, part in enumerate(parts):
                wait_working()
                for s in held:
                    p.send(s)
                last = k == len(parts) - 1
                held = [] if last else [part[-1][1]]
                for s in [s for group in part for s in group][:None if last else -1]:
                    p.send(s)
                if k == 1:
                    for s in violating:
                        p.send(s)
                    for j, (header, part_bytes) in enumerate(missing_chunks):
                        if j != 2:
                            p.send_raw(group_key(missing[0]), part_bytes, headers=[(CHUNK_HEADER, header)])
                    p.send(missing[1])
                p.flush()
                if last:
                    break
                time.sleep(rng.uniform(0.5, 2.0))
                assert (problem := trouble()) is None, problem
                worker.send_signal(signal.SIGKILL)
                worker.wait(10)
                worker, log = start()
        out = read_topic(kafka_bootstrap, topics.output, min_count=chunks(*(s for g in good for s in g)),
                         timeout=90, settle=2, abort=trouble)
        dead = read_topic(kafka_bootstrap, topics.dead_letter,
                          min_count=chunks(*violating, missing[1]) + len(missing_chunks) - 1, timeout=60,
                          settle=2, abort=trouble)
    finally:
        worker.send_signal(signal.SIGTERM)
        rc = worker.wait(40)
    assert rc == 0
    # Every good rollout once, its bytes as sent.
    train = train_samples(joined(out))
    assert Counter((t.group_key, t.sample.rollout_id) for t in train) == Counter(
        (f"chaos/{gi}", rid) for gi in range(GROUPS) for rid in (0, 1))
    sent = {(f"chaos/{s.group_index}", s.rollout_id): encode_sample(s) for g in good for s in g}
    assert all(encode_sample(t.sample) == sent[(t.group_key, t.sample.rollout_id)] for t in train)
    # Dead letters: whole values once each (re-split), and the chunks of the broken value once each.
    values = joined(dead)
    whole = Counter(r.headers[H.REASON] for r in values if CHUNK_HEADER not in r.headers)
    assert whole == {"shared_reward_violation": 3, "incomplete_group": 1}, whole
    assert sorted(v.value for v in values if v.headers[H.REASON] == "incomplete_group") == [
        encode_sample(missing[1])]
    pieces = [r for r in dead if r.headers[H.REASON] == "incomplete_chunks"]
    assert len(pieces) == len(missing_chunks) - 1
    assert len({r.headers[H.ORIGINAL_OFFSET] for r in pieces}) == len(pieces)
    rereads = [int(x.split()[0]) for f in logs for x in f.read_text().split("reread=")[1:]]
    assert max(rereads) > 0  # a kill hit a worker holding open windows or chunks: restored by re-reading
