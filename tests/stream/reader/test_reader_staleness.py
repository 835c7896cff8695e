"""The reader's staleness grain (`TrainDataReader(staleness=...)`): by group a slow rollout costs its whole
group, by rollout only itself, by token only the tokens generated past the bound. On the in-memory seam with
the stage writing heads (ranks reading the whole topic and ranks fetching their own rows decide alike), then
on the real broker."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import rollout_stream.reader.train_data as reader_module
from rollout_stream.codec import Sample, TrainSample, decode_train_sample, encode_sample, group_key
from rollout_stream.config import WorkerConfig
from rollout_stream.kafka.memory import MemoryCluster
from rollout_stream.names import heads_topic
from rollout_stream.producer import RolloutProducer
from rollout_stream.reader import Batch, TrainDataReader
from rollout_stream.reader.batching import StaleParts
from tests.stream.helpers import joined, new_topics, read_topic, running_worker, train_samples
from tests.stream.reader.test_reader_own import _Client, batches, same
from tests.stream.worker.test_chunked_worker import TOPICS, produce, worker
from tests.stream.worker.test_worker_memory import commit, steps

GROUPS, SIZE, WORLD = 6, 4, 2
VERSION, BOUND = 6, 2  # versions below 4 are past the bound


def partial(gi: int, rid: int, *, run: str = "st") -> Sample:
    """Rollout 0 of group g was generated at version g for its first two response tokens, then at g + 3
    (a weight update interrupted it); the others at g + 3. Group 0 is all past the bound, groups 1-3 have a
    slow rollout 0, groups 4-5 are fresh."""
    rng = np.random.default_rng(gi * 10 + rid)
    resp = 6
    spans: dict[str, Any] = ({"weight_versions": [str(gi), str(gi + 3)], "weight_version_offsets": [0, 2]}
                             if rid == 0 else {"weight_versions": [str(gi + 3)]})
    return Sample(group_index=gi, index=rid, rollout_id=rid, reward=float(rng.integers(0, 4)),
                  group_size=SIZE, run_id=run, tokens=rng.integers(0, 1000, 10).astype(np.int32),
                  response_length=resp, loss_mask=np.array([1, 1, 0, 1, 1, 1], dtype=np.uint8), **spans)


def expected_rows(mode: str) -> set[tuple[str, int]]:
    fresh_groups = {g for g in range(GROUPS) if g >= 4}
    if mode == "group":
        return {(f"st/{g}", r) for g in fresh_groups for r in range(SIZE)}
    return {(f"st/{g}", r) for g in range(1, GROUPS) for r in range(SIZE) if mode == "token" or r or g >= 4}


@pytest.fixture
def cluster(monkeypatch) -> MemoryCluster:
    c = MemoryCluster(clock_ms=1_000_000)
    for name in (TOPICS.input, TOPICS.output, TOPICS.dead_letter, heads_topic(TOPICS.output)):
        c.create_topic(name, 2)
    monkeypatch.setattr(reader_module, "client_for", lambda conn: _Client(c))
    produce(c, [partial(g, r) for g in range(GROUPS) for r in range(SIZE)])
    w = worker(c, write_heads=True, group_size=SIZE)
    steps(w, n=10)
    commit(w)
    return c


def reader(mode: str, fetch: str, rank: int, **kw: Any) -> TrainDataReader:
    kw.setdefault("publish_progress", False)
    r = TrainDataReader("memory:9092", TOPICS.output, f"trainer-{mode}-{fetch}",
                        partition_idle_ms=50, rank=rank, world_size=WORLD, fetch=fetch,  # type: ignore[arg-type]
                        groups_per_batch=1, max_weight_staleness=BOUND, staleness=mode, **kw)  # type: ignore[arg-type]
    r.set_weight_version(VERSION)
    return r


def stage_rewards(cluster: MemoryCluster) -> dict[tuple[str, int], float]:
    """The rewards the stage published, normalized over each whole group."""
    return {(t.group_key, t.sample.rollout_id): t.reward  # type: ignore[misc]
            for t in map(decode_train_sample, (r.value for r in cluster.records(TOPICS.output)))}


def check(mode: str, per_rank: list[list[Batch]], rewards: dict[tuple[str, int], float]) -> None:
    """Every rank saw the same batches; together they train exactly what `mode` keeps, with the stage's
    whole-group rewards, no token past the bound in the loss, and totals that count only that."""
    trained: dict[tuple[str, int], TrainSample] = {}
    for bs in zip(*per_rank, strict=True):
        assert len({(b.index, tuple(b.groups), b.global_loss_tokens, b.stale_rollouts, b.stale_tokens)
                    for b in bs}) == 1
        assert bs[0].global_loss_tokens == sum(int(b.loss_mask.sum()) for b in bs)
        assert bs[0].global_samples == sum(len(b) for b in bs)
        for b in bs:
            versions = b.token_weight_versions
            assert versions.shape == b.loss_mask.shape
            assert not bool(((versions < VERSION - BOUND) & (b.loss_mask != 0)).any())  # nothing stale trains
            trained.update({(s.group_key, s.sample.rollout_id): s for s in b.samples})  # type: ignore[misc]
    assert set(trained) == expected_rows(mode)
    assert all(t.reward == rewards[key] for key, t in trained.items())  # nothing renormalized
    if mode == "token":  # the slow rollouts keep their fresh tokens
        for g in (1, 2, 3):
            assert trained[(f"st/{g}", 0)].sample.loss_mask == [0, 0, 0, 1, 1, 1]
    batches_of_0 = per_rank[0]
    # groups past the bound after the last batch's group are in no batch yet
    assert sum(b.skipped_stale for b in batches_of_0) <= (4 if mode == "group" else 1)
    stale_rollouts = sum(b.stale_rollouts for b in batches_of_0)
    stale_tokens = sum(b.stale_tokens for b in batches_of_0)
    assert (stale_rollouts, stale_tokens) == {"group": (0, 0), "rollout": (3, 15), "token": (0, 6)}[mode]


@pytest.mark.parametrize("mode", ["group", "rollout", "token"])
def test_each_grain_trains_what_is_fresh_and_ranks_fetching_their_own_rows_agree(cluster, mode):
    n = len({key for key, _ in expected_rows(mode)})
    per_fetch: dict[str, list[list[Batch]]] = {}
    for fetch in ("all", "own"):
        per_fetch[fetch] = []
        for rank in range(WORLD):
            with reader(mode, fetch, rank) as r:
                per_fetch[fetch].append(batches(r, n))
                assert r.next_batch(0.5) is None
                assert (r.stats.stale_rollouts, r.stats.stale_tokens) == (
                    sum(b.stale_rollouts for b in per_fetch[fetch][-1]),
                    sum(b.stale_tokens for b in per_fetch[fetch][-1]))
        check(mode, per_fetch[fetch], stage_rewards(cluster))
    for a_rank, b_rank in zip(per_fetch["all"], per_fetch["own"], strict=True):
        for a, b in zip(a_rank, b_rank, strict=True):
            same(a, b)
            assert bool((a.token_weight_versions == b.token_weight_versions).all())


@pytest.mark.parametrize("mode", ["rollout", "token"])
def test_what_staleness_left_out_reaches_the_log_and_the_progress_record(cluster, mode):
    """Rank 0's marks say, per committed batch and group, what the bound left out of a group that trained;
    the progress record (`lag`, the metrics) counts it all told."""
    from rollout_stream.codec.admission import TrainerMark, decode_admission
    from rollout_stream.codec.progress import TrainerProgress, decode_progress
    from rollout_stream.names import admission_topic, progress_topic

    n = len({key for key, _ in expected_rows(mode)})
    with reader(mode, "all", 0, publish_progress=True) as r:
        got = batches(r, n)
        r.commit()
    rollouts, tokens = sum(b.stale_rollouts for b in got), sum(b.stale_tokens for b in got)
    assert rollouts + tokens > 0
    marks = [m for m in (decode_admission(x.value) for x in cluster.records(admission_topic(TOPICS.output))
                         if x.value) if isinstance(m, TrainerMark)]
    excluded = {}  # the newest mark's word on each batch
    for m in marks:
        for batch, groups in m.excluded.items():
            excluded[batch] = groups
    assert sum(parts[0] for groups in excluded.values() for parts in groups.values()) == rollouts
    assert sum(parts[1] for groups in excluded.values() for parts in groups.values()) == tokens
    for b in got:  # a group the bound left something of out is one that trained in that batch
        assert set(excluded.get(b.index, {})) <= {g.key for g in b.groups}
    records = [decode_progress(x.value) for x in cluster.records(progress_topic(TOPICS.output)) if x.value]
    last = [p for p in records if isinstance(p, TrainerProgress)][-1]
    assert (last.stale_rollouts, last.stale_tokens) == (rollouts, tokens)


def test_the_miles_layout_gets_the_loss_masks_staleness_left(cluster):
    with reader("token", "own", 0, layout="miles") as own, reader("token", "all", 0, layout="miles") as whole:
        for a, b in zip(batches(own, 5), batches(whole, 5), strict=True):
            assert a.rollout_data is not None and b.rollout_data is not None
            masks = [list(m) for m in a.rollout_data["loss_masks"]]
            assert masks == [list(m) for m in b.rollout_data["loss_masks"]]
            assert a.rollout_data["rollout_mask_sums"] == b.rollout_data["rollout_mask_sums"]
            for s, mask in zip(a.samples, a.rollout_data["loss_masks"], strict=True):
                assert list(mask) == s.sample.loss_mask.tolist()


def test_an_unknown_grain_is_refused():
    with pytest.raises(ValueError, match="staleness must be one of group, rollout, token"):
        TrainDataReader("memory:9092", "t", "g", groups_per_batch=1, staleness="sample",  # type: ignore[arg-type]
                        kafka_client=MemoryCluster().client())


# ---- the real broker ----------------------------------------------------------------------------
@pytest.mark.kafka(timeout=240)
@pytest.mark.any_client  # the decisions are the core's, over one merged sequence
def test_on_the_broker_the_stage_and_two_ranks_train_what_is_fresh(kafka_bootstrap):
    from kafka.admin import KafkaAdminClient, NewTopic

    topics = new_topics(kafka_bootstrap, partitions=2, prefix="stale")
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(heads_topic(topics.output), 2, 1)])
    finally:
        admin.close()
    with RolloutProducer(kafka_bootstrap, topic=topics.input) as p:
        for s in (partial(g, r) for g in range(GROUPS) for r in range(SIZE)):
            p.send_raw(group_key(s), encode_sample(s))
        p.flush()
    config = WorkerConfig(bootstrap_servers=kafka_bootstrap, topics=topics, group_id=f"w-{topics.input}",
                          write_heads=True, commit_interval_s=0.1)
    with running_worker(config):
        read_topic(kafka_bootstrap, heads_topic(topics.output), min_count=GROUPS, timeout=60)
    train = train_samples(joined(read_topic(kafka_bootstrap, topics.output, min_count=GROUPS * SIZE)))
    rewards = {(t.group_key, t.sample.rollout_id): t.reward for t in train}

    for mode, fetch in (("token", "own"), ("rollout", "all")):
        check(mode, ranks_reading(kafka_bootstrap, topics.output, mode, fetch), rewards)


def ranks_reading(bootstrap: str, topic: str, mode: str, fetch: str) -> list[list[Batch]]:
    """The batches of WORLD ranks reading `topic` at once, in threads, until what `mode` keeps is read."""
    n = len({key for key, _ in expected_rows(mode)})
    results: list[list[Batch]] = [[] for _ in range(WORLD)]
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            with TrainDataReader(bootstrap, topic, f"t-{mode}-{topic}", groups_per_batch=1, rank=rank,
                                 world_size=WORLD, fetch=fetch, max_weight_staleness=BOUND,  # type: ignore[arg-type]
                                 staleness=mode, partition_idle_ms=300,  # type: ignore[arg-type]
                                 publish_progress=False) as r:
                r.set_weight_version(VERSION)
                for _ in range(n):
                    b = r.next_batch(30.0)
                    assert b is not None
                    results[rank].append(b)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(WORLD)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


# ---- batching, pure ------------------------------------------------------------------------------
def _group(gi: int, versions: list[list[str]], key: str | None = None) -> Any:
    from rollout_stream.core.assembly import assembled_group

    samples = [TrainSample(sample=Sample(group_index=gi, rollout_id=r, tokens=[1] * 4, response_length=2,
                                         loss_mask=[1, 1], weight_versions=v, run_id="st"),
                           raw_reward=float(r), reward=float(r) - 0.5, group_key=key or f"st/{gi}",
                           group_rollout_count=len(versions), group_sample_count=len(versions),
                           group_mean=0.5, group_std=0.5, zero_variance=False, advantage_estimator="grpo",
                           rewards_normalization=True, grpo_std_normalization=True, reward_key=None,
                           source_topic="in", source_partition=0, source_offset=gi * 10 + r)
               for r, v in enumerate(versions)]
    offsets = [gi * 10 + r for r in range(len(versions))]
    return assembled_group(key or f"st/{gi}", 0, samples, offsets, gi, 100)


def test_held_groups_train_the_fresh_part_and_plan_over_it() -> None:
    from rollout_stream.reader.batching import HeldGroups
    from rollout_stream.reader.sources import Fetched

    held = HeldGroups(groups_per_batch=2, rank=0, world_size=1, balance_tokens=False,
                      max_weight_staleness=BOUND, fence=None, staleness="rollout")
    held.items = [Fetched(_group(0, [["1"], ["1"]]), {}), Fetched(_group(1, [["1"], ["5"], ["6"]]), {}),
                  Fetched(_group(2, [["5"], ["5"]]), {}),
                  Fetched(_group(3, [["1"], ["5"]]), {})]
    verdicts = [held.verdict(f.group, VERSION) for f in held.items]
    assert verdicts == ["stale", None, None, None]
    plan, items, superseded, parts = held.take(verdicts, VERSION)
    assert (plan.taken, len(items), superseded, parts) == (3, 3, 0, StaleParts({"st/1": (1, 2)}))
    assert [len(g.samples) for g in plan.groups] == [2, 2] and plan.global_samples == 4
    assert plan.global_loss_tokens == 8 and [s.reward for s in plan.groups[0].samples] == [0.5, 1.5]

    by_token = HeldGroups(groups_per_batch=1, rank=0, world_size=1, balance_tokens=False,
                          max_weight_staleness=BOUND, fence=None, staleness="token")
    group = _group(3, [["1", "99999999999999999999"], ["5"]])
    assert held.verdict(group, VERSION) is None  # by rollout: rollout 0 leaves
    assert by_token.verdict(group, VERSION) == "invalid"  # by token its versions do not fit int64
