"""Dead-letter tooling: scan, aggregate, inspect and replay the dead-letter topic (`rollout-stream dlq …`)."""

from stream.tools.dlq.record import DeadLetterRecord, parse_record
from stream.tools.dlq.replay import ReplayOptions, ReplayReport, run_replay
from stream.tools.dlq.scan import DeadLetterScanner, ScanPlan
from stream.tools.dlq.selection import Selection

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
