"""One process under test: the stage (`Worker`) or the passthrough, measured from inside.

Run as `python -m stream.bench.runner` with a `RunSpec` as JSON on stdin's first line. It prints JSON
lines on stdout: `status` every `status_interval_s` (records in, committed, open windows, RSS) and one
`result` at the end. It stops by itself once every partition is committed up to `end_offsets`, or when
stdin says `stop` (paced runs, whose end the driver decides). The loop under test runs on the main
thread, so `profile` (a cProfile output path) sees its work; kafka-python's IO thread is not in it.
"""

from __future__ import annotations

import cProfile
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from stream.bench.passthrough import Passthrough
from stream.bench.procstat import cpu_seconds, peak_rss_bytes, reset_peak_rss, rss_bytes
from stream.clients import Connection
from stream.config import TopicNames, WorkerConfig

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
    commit_interval_s: float = 1.0
    commit_max_records: int = 5000
    group_timeout_s: float = 600.0
    end_offsets: dict[int, int] | None = None  # drain to these, then stop; None: run until `stop`
    profile: str | None = None
    timeout_s: float = 300.0
    status_interval_s: float = 0.25
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        raw = json.loads(text)
        if raw.get("end_offsets") is not None:
            raw["end_offsets"] = {int(k): v for k, v in raw["end_offsets"].items()}
        return cls(**raw)


class _Target:
    """The stage or the passthrough, behind the few counters the runner reads."""

    def __init__(self, spec: RunSpec) -> None:
        conn = Connection(spec.bootstrap, client_id=f"bench-{spec.mode}")
        self.stage = spec.mode == "stage"
        if self.stage:
            from stream.worker import Worker

            config = WorkerConfig(
                bootstrap_servers=spec.bootstrap,
                topics=TopicNames(spec.input_topic, spec.output_topic, spec.dead_letter_topic),
                group_id=spec.group_id, group_timeout_s=spec.group_timeout_s, delivery=spec.delivery,  # type: ignore[arg-type]
                commit_interval_s=spec.commit_interval_s, commit_max_records=spec.commit_max_records,
                instance_id=spec.group_id, progress_interval_s=3600.0,
            )
            self.obj: Any = Worker(config, conn)
        else:
            self.obj = Passthrough(conn, group_id=spec.group_id, input_topic=spec.input_topic,
                                   output_topic=spec.output_topic, delivery=spec.delivery,  # type: ignore[arg-type]
                                   commit_interval_s=spec.commit_interval_s,
                                   commit_max_records=spec.commit_max_records, max_record_bytes=64 << 20)

    def records_in(self) -> int:
        return self.obj.stats.records_in if self.stage else self.obj.records_in

    def committed(self) -> dict[int, int]:
        return dict(self.obj.ledger.committed if self.stage else self.obj.committed)

    def commits(self) -> int:
        return self.obj.stats.commits if self.stage else self.obj.commits

    def open_windows(self) -> tuple[int, int]:
        if not self.stage:
            return 0, 0
        return self.obj.store.open_count(), self.obj.store.open_bytes

    def extra(self) -> dict[str, Any]:
        return self.obj.stats.summary() if self.stage else {}


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> None:
    spec = RunSpec.from_json(sys.stdin.readline())
    target = _Target(spec)
    total = sum(spec.end_offsets.values()) if spec.end_offsets is not None else None
    marks: dict[str, float] = {}
    peaks = {"open_bytes": 0, "open_windows": 0}
    stop_reason = ["timeout"]
    reset_peak_rss()
    started = time.monotonic()

    def listen() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop_reason[0] = stop_reason[0] if "done" in marks else "stop"
        target.obj.request_stop()

    def watch() -> None:
        last_status = 0.0
        while True:
            now = time.monotonic()
            n = target.records_in()
            count, nbytes = target.open_windows()
            peaks["open_bytes"] = max(peaks["open_bytes"], nbytes)
            peaks["open_windows"] = max(peaks["open_windows"], count)
            if n and "first" not in marks:
                marks["first"] = now
            if total is not None and n >= total and "drained" not in marks:
                marks["drained"] = now
                target.obj.commit_soon()  # the final commit now, not at the cadence's next tick
            if spec.end_offsets is not None and "done" not in marks:
                committed = target.committed()
                if all(committed.get(p, -1) >= end for p, end in spec.end_offsets.items()):
                    marks["done"] = now
                    stop_reason[0] = "done"
                    target.obj.request_stop()
                    return
            if now - started > spec.timeout_s:
                target.obj.request_stop()
                return
            if now - last_status >= spec.status_interval_s:
                last_status = now
                _emit({"event": "status", "t": now - started, "records_in": n, "open_windows": count,
                       "open_bytes": nbytes, "rss": rss_bytes(), "peak_rss": peak_rss_bytes(),
                       "commits": target.commits()})
            if stop_reason[0] == "stop":
                return
            time.sleep(0.02)

    threading.Thread(target=listen, daemon=True).start()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    cpu0 = cpu_seconds()
    profiler = cProfile.Profile() if spec.profile else None
    if profiler:
        profiler.enable()
    try:
        target.obj.run()
    finally:
        if profiler:
            profiler.disable()
            profiler.dump_stats(spec.profile)
    watcher.join(timeout=5)
    first, done = marks.get("first"), marks.get("done")
    _emit({
        "event": "result", "mode": spec.mode, "delivery": spec.delivery, "stop": stop_reason[0],
        "records": target.records_in(), "seconds": (done - first) if first and done else None,
        "drain_to_commit_s": (done - marks["drained"]) if done and "drained" in marks else None,
        "cpu_s": cpu_seconds() - cpu0, "rss": rss_bytes(), "peak_rss": peak_rss_bytes(),
        "peak_open_bytes": peaks["open_bytes"], "peak_open_windows": peaks["open_windows"],
        "commits": target.commits(), "stats": target.extra(),
    })


if __name__ == "__main__":
    main()
