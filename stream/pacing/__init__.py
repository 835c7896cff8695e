"""Pacing rollouts to the trainer (docs/pacing.md): the progress topic every party writes its state to, and
the admission gate a paced `RolloutProducer` waits at. The rule itself is pure: `core.pacing`."""

from stream.pacing.gate import AdmissionGate, PacingError, PacingStats, PacingTimeout, WeightsTooOld
from stream.pacing.progress import ProgressBoard, ProgressWriter, ensure_progress_topic, now_ms
from stream.pacing.trainer import TrainerProgressPublisher

__all__ = ["AdmissionGate", "PacingError", "PacingStats", "PacingTimeout", "ProgressBoard", "ProgressWriter",
           "TrainerProgressPublisher", "WeightsTooOld", "ensure_progress_topic", "now_ms"]
