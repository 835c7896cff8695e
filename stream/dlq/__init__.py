"""Dead-letter tooling: scan, aggregate, inspect and replay the dead-letter topic (`rollout-stream dlq …`)."""

from stream.dlq.record import DeadLetterRecord, parse_record
from stream.dlq.replay import ReplayOptions, ReplayReport, run_replay
from stream.dlq.scan import DeadLetterScanner, ScanPlan
from stream.dlq.selection import Selection

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
