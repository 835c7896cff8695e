"""Dead-letter tooling: scan, aggregate, inspect and replay the dead-letter topic (`rollout-stream dlq …`)."""

from rollout_stream.ops.dlq.record import DeadLetterRecord, parse_record
from rollout_stream.ops.dlq.replay import ReplayOptions, ReplayReport, run_replay
from rollout_stream.ops.dlq.scan import DeadLetterScanner, ScanPlan
from rollout_stream.ops.dlq.selection import Selection

__all__ = [
    "DeadLetterRecord",
    "DeadLetterScanner",
    "ReplayOptions",
    "ReplayReport",
    "ScanPlan",
    "Selection",
    "parse_record",
    "run_replay",
]
