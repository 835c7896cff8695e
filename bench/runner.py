"""One process under test: the stage (`Worker`) or the passthrough, measured from inside.

Run as `python -m bench.runner` with a `RunSpec` as JSON on stdin's first line. It prints JSON
lines on stdout: `status` every `status_interval_s` (records in, open windows, RSS), `drained` once every
partition is committed up to `end_offsets` (the throughput phase), and `result` when it ends: right after
`drained`, or, with `serve_after`, when stdin says `stop` (the driver then offers paced load or open windows).

The loop under test runs on the main thread, so `profile` (a cProfile output path) sees its work;
kafka-python's IO and sender threads are accounted for by per-thread CPU time instead.
"""

from __future__ import annotations

import cProfile
import itertools
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from bench.passthrough import Passthrough
from bench.procstat import (
    cpu_seconds,
    peak_rss_bytes,
    reset_peak_rss,
    rss_bytes,
    thread_cpu_seconds,
)
from rollout_stream.clients import MAX_RECORD_BYTES, Connection, default_client
from rollout_stream.worker.allocator import reuse_freed_buffers

if TYPE_CHECKING:  # imported when a stage runs: the passthrough process needs neither the worker nor torch
    from rollout_stream.worker import Worker

__all__ = ["RunSpec", "main"]


@dataclass
class RunSpec:
    mode: str  # "stage" or "passthrough"
    bootstrap: str
    input_topic: str
    output_topic: str
    dead_letter_topic: str
    group_id: str
    delivery: str = "exactly-once"
    commit_interval_s: float = 0.1  # the worker's default (WorkerConfig.commit_interval_s)
    commit_max_records: int = 5000
    group_timeout_s: float = 900.0
    end_offsets: dict[int, int] | None = None  # the throughput phase drains to these
    serve_after: bool = False  # keep running after the throughput phase until `stop`
    profile: str | None = None
    timeout_s: float = 300.0
    status_interval_s: float = 0.25
    security: dict[str, Any] | None = None  # SecuritySettings.to_values(); travels on the stdin pipe only
    # passthrough only: CPU work added per record (bench/scripts/headroom_bench.py)
    extra_work_us: float = 0.0
    client: str = ""  # the Kafka client library ("": the default, $ROLLOUT_STREAM_CLIENT or confluent)
    write_heads: bool = False  # stage only: also write group heads (`run --write-heads`)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        raw = json.loads(text)
        if raw.get("end_offsets") is not None:
            raw["end_offsets"] = {int(k): v for k, v in raw["end_offsets"].items()}
        return cls(**raw)


MONITOR_S = 0.02  # how often the monitor thread looks at the stage or passthrough


class _Target:
    """The stage or the passthrough, behind the few counters the runner reads."""

    def __init__(self, spec: RunSpec) -> None:
        from rollout_stream.security import SecuritySettings

        security = SecuritySettings.from_values(spec.security) if spec.security else SecuritySettings()
        conn = Connection(spec.bootstrap, client_id=f"bench-{spec.mode}", security=security,
                          client=spec.client or default_client())
        self.stage = spec.mode == "stage"
        if self.stage:  # imported here: the passthrough process needs neither the worker nor torch
            from rollout_stream.config import TopicNames, WorkerConfig
            from rollout_stream.worker import Worker

            config = WorkerConfig(
                bootstrap_servers=spec.bootstrap,
                topics=TopicNames(spec.input_topic, spec.output_topic, spec.dead_letter_topic),
                group_id=spec.group_id,
                group_timeout_s=spec.group_timeout_s,
                delivery=spec.delivery,  # type: ignore[arg-type]  # a str from the spec: WorkerConfig checks it
                commit_interval_s=spec.commit_interval_s,
                commit_max_records=spec.commit_max_records,
                instance_id=spec.group_id,
                progress_interval_s=3600.0,
                write_heads=spec.write_heads,
            )
            self.obj: Worker | Passthrough = Worker(config, conn)
        else:
            self.obj = Passthrough(
                conn,
                group_id=spec.group_id,
                input_topic=spec.input_topic,
                output_topic=spec.output_topic,
                delivery=spec.delivery,  # type: ignore[arg-type]  # a str from the spec the suite wrote
                commit_interval_s=spec.commit_interval_s,
                commit_max_records=spec.commit_max_records,
                max_record_bytes=MAX_RECORD_BYTES,
                extra_work_us=spec.extra_work_us,
            )

    def records_in(self) -> int:
        return self.obj.records_in if isinstance(self.obj, Passthrough) else self.obj.stats.records_in

    def committed(self) -> dict[int, int]:
        return dict(self.obj.committed if isinstance(self.obj, Passthrough) else self.obj.ledger.committed)

    def commits(self) -> int:
        return self.obj.commits if isinstance(self.obj, Passthrough) else self.obj.stats.commits

    def read_to(self) -> dict[int, int]:
        """Per partition, the offset after the last record taken (the stage's; {} for the passthrough)."""
        if isinstance(self.obj, Passthrough):
            return {}
        ledger = self.obj.ledger
        return {p: n for p in list(ledger.partitions) if (n := ledger.next_offset(p)) is not None}

    def open_groups(self, limit: int = 5) -> list[str]:
        """The first few open windows as `key@partition: complete/size rollouts` (the stage's; [] otherwise).
        Read from the monitor thread: counters only, no walk over a window the loop may be changing."""
        if isinstance(self.obj, Passthrough):
            return []
        windows = list(itertools.islice(self.obj.store.open.values(), limit))
        return [f"{w.key}@{w.partition}: {w.complete_rollouts}/{w.group_size}" for w in windows]

    def open_windows(self) -> tuple[int, int]:
        if isinstance(self.obj, Passthrough):
            return 0, 0
        return self.obj.store.open_count(), self.obj.store.open_bytes

    def summary(self) -> dict[str, Any]:
        if isinstance(self.obj, Passthrough):
            return {"records_in": self.obj.records_in}
        return self.obj.stats.summary()


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class _Watch(threading.Thread):
    """Samples the target every 20 ms: marks the throughput phase, tracks peaks, prints status lines."""

    def __init__(self, spec: RunSpec, target: _Target) -> None:
        super().__init__(name="bench-watch", daemon=True)
        self.spec, self.target = spec, target
        self.total = sum(spec.end_offsets.values()) if spec.end_offsets is not None else None
        self.started = time.monotonic()
        self.first: float | None = None
        self.drained_at: float | None = None
        self.cpu0 = 0.0
        self.threads0: dict[str, float] = {}
        self.peak_open = [0, 0]  # windows, bytes (since the last phase change)
        self.stopped = threading.Event()
        self.stop_reason = "stop"

    def stop(self, reason: str) -> None:
        if not self.stopped.is_set():
            self.stop_reason = reason
            self.stopped.set()
            self.target.obj.request_stop()

    def run(self) -> None:
        spec, target = self.spec, self.target
        last_status = 0.0
        while not self.stopped.is_set():
            now = time.monotonic()
            n = target.records_in()
            count, nbytes = target.open_windows()
            self.peak_open = [max(self.peak_open[0], count), max(self.peak_open[1], nbytes)]
            if n and self.first is None:
                self.first = now
                self.cpu0, self.threads0 = cpu_seconds(), thread_cpu_seconds()
            if self.total is not None and n >= self.total and self.drained_at is None:
                self.drained_at = now
                target.obj.commit_soon()  # the final commit now, not at the cadence's next tick
            if spec.end_offsets is not None and self.first is not None:
                committed = target.committed()
                if all(committed.get(p, -1) >= end for p, end in spec.end_offsets.items()):
                    self._phase_done(now, n)
                    if not spec.serve_after:
                        self.stop("done")
                        return
            if now - self.started > spec.timeout_s:
                self.stop("timeout")
                return
            if now - last_status >= spec.status_interval_s:
                last_status = now
                _emit(
                    {
                        "event": "status",
                        "t": round(now - self.started, 3),
                        "records_in": n,
                        "open_windows": count,
                        "open_bytes": nbytes,
                        "rss": rss_bytes(),
                        "peak_rss": peak_rss_bytes(),
                        "commits": target.commits(),
                        # Where each partition stands, for a drain that stops short of end_offsets: read up
                        # to, committed up to, and the groups still open (a member missing or not yet read).
                        "read_to": target.read_to(),
                        "committed": target.committed(),
                        "open": target.open_groups(),
                    }
                )
            time.sleep(MONITOR_S)

    def _phase_done(self, now: float, n: int) -> None:
        assert self.first is not None
        threads = thread_cpu_seconds()
        _emit(
            {
                "event": "drained",
                "mode": self.spec.mode,
                "delivery": self.spec.delivery,
                "records": n,
                # The monitor looks every MONITOR_S: a drain seen whole at one look (a --quick drain on
                # librdkafka) took up to that long, not zero (its rate paced the latency phase: 1/0).
                "seconds": max(now - self.first, MONITOR_S),
                "final_commit_s": (now - self.drained_at) if self.drained_at is not None else None,
                "cpu_s": cpu_seconds() - self.cpu0,
                # CPU seconds of each thread during the phase: the loop vs kafka-python's IO/sender threads.
                "thread_cpu_s": {k: round(v - self.threads0.get(k, 0.0), 3) for k, v in threads.items()},
                "commits": self.target.commits(),
                "rss": rss_bytes(),
                "peak_rss": peak_rss_bytes(),
                "peak_open_windows": self.peak_open[0],
                "peak_open_bytes": self.peak_open[1],
            }
        )
        self.spec.end_offsets = None
        reset_peak_rss()
        self.peak_open = [0, 0]


def main() -> None:
    spec = RunSpec.from_json(sys.stdin.readline())
    reuse_freed_buffers()  # the stage's and the passthrough's process alike (as `rollout-stream run` does)
    target = _Target(spec)
    watch = _Watch(spec, target)

    def listen() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        watch.stop("stop")

    threading.Thread(target=listen, name="bench-listen", daemon=True).start()
    watch.start()
    profiler = cProfile.Profile() if spec.profile else None
    if profiler:
        profiler.enable()
    try:
        target.obj.run()
    finally:
        if profiler and spec.profile:
            profiler.disable()
            profiler.dump_stats(spec.profile)
    watch.stopped.set()
    watch.join(timeout=5)
    _emit(
        {
            "event": "result",
            "mode": spec.mode,
            "stop": watch.stop_reason,
            "records": target.records_in(),
            "rss": rss_bytes(),
            "peak_rss": peak_rss_bytes(),
            "peak_open_windows": watch.peak_open[0],
            "peak_open_bytes": watch.peak_open[1],
            "stats": target.summary(),
        }
    )


if __name__ == "__main__":
    main()
