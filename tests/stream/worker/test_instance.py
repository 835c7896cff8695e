"""Instance ids: several workers on one host by default, each keeps its id across a restart, and a second live
worker with an id already in use is refused at start with one line (it used to fence the first one, which
died ~50 s later with a bare ProducerFencedError)."""

from __future__ import annotations

import os
import re
import socket
import time

import pytest

from rollout_stream.ops.synth import FaultRates, SynthPlan, plan_groups
from rollout_stream.producer import RolloutProducer
from rollout_stream.worker.instance import InstanceInUse, claim_instance
from tests.stream.helpers import new_topics, read_topic, spawn_worker

# any client: instance ids are host locks; the clients only carry them
pytestmark = pytest.mark.any_client

HOST = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())


@pytest.fixture(autouse=True)
def own_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("ROLLOUT_STREAM_LOCK_DIR", str(tmp_path / "locks"))


def test_default_ids_are_the_lowest_free_slots_and_come_back_after_a_release():
    a = claim_instance("b:9092", "g", None)
    b = claim_instance("b:9092", "g", None)
    assert (a.instance_id, b.instance_id) == (f"{HOST}-0", f"{HOST}-1")
    a.release()  # the first worker restarts: it gets its own slot back, not a third one
    again = claim_instance("b:9092", "g", None)
    assert again.instance_id == f"{HOST}-0"
    other_group = claim_instance("b:9092", "other", None)
    other_cluster = claim_instance("c:9092,b:9092", "g", None)
    assert other_group.instance_id == other_cluster.instance_id == f"{HOST}-0"
    for claim in (b, again, other_group, other_cluster):
        claim.release()


def test_an_explicit_id_in_use_is_refused_naming_it_and_the_holder():
    held = claim_instance("b:9092", "g", "w1")
    with pytest.raises(InstanceInUse) as refused:
        claim_instance("b:9092", "g", "w1")
    message = str(refused.value)
    assert "'w1'" in message and f"pid {os.getpid()}" in message and "--instance-id" in message
    assert "\n" not in message
    held.release()
    claim_instance("b:9092", "g", "w1").release()


@pytest.mark.kafka(timeout=150)
def test_two_default_workers_on_one_host_both_keep_running_and_a_duplicate_id_is_refused(
        kafka_bootstrap, tmp_path):
    topics = new_topics(kafka_bootstrap, partitions=4, prefix="inst")
    group = f"inst-{topics.input}"
    common = ("--session-timeout", "6", "--progress-interval", "1", "--commit-interval", "0.2")
    logs = [tmp_path / "w0.log", tmp_path / "w1.log"]
    workers = [spawn_worker(kafka_bootstrap, topics, group, *common, log_path=log) for log in logs]
    try:
        started = []
        for log in logs:
            deadline = time.monotonic() + 60
            while not (m := re.search(r"event=worker.started .*?instance_id=(\S+)", log.read_text())):
                assert time.monotonic() < deadline, log.read_text()[-2000:]
                time.sleep(0.2)
            started.append(m.group(1))
        assert sorted(started) == [f"{HOST}-0", f"{HOST}-1"]

        duplicate = spawn_worker(kafka_bootstrap, topics, group, "--instance-id", started[0],
                                 log_path=tmp_path / "dup.log")
        assert duplicate.wait(timeout=60) == 2
        lines = [ln for ln in (tmp_path / "dup.log").read_text().splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and repr(started[0]) in lines[0] and "--instance-id" in lines[0], lines

        plan = SynthPlan(group_size=3, max_siblings=1, tokens=4, faults=FaultRates(), seed=3, run_id="inst")
        with RolloutProducer(kafka_bootstrap, topic=topics.input) as producer:
            for records, _ in plan_groups(plan, 80):
                for r in records:
                    producer.send_raw(r.key, r.value)
        published = read_topic(kafka_bootstrap, topics.output, min_count=240, timeout=90)
        assert len(published) == 240
        # several commits of both: with one shared id the first one is fenced at its next commit
        time.sleep(3)
        assert [w.poll() for w in workers] == [None, None], [log.read_text()[-2000:] for log in logs]
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            w.wait(timeout=60)
