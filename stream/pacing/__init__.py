"""Pacing rollouts to the trainer (docs/pacing.md): the admission log paced producers ask for room on and
trainers report to, and the progress topic every party writes its state to for display. The rule itself
is pure: `rollout_stream.core.admission`."""

from rollout_stream.pacing.admission_log import AdmissionFollower, AdmissionWriter, ensure_admission_topic
from rollout_stream.pacing.gate import (
    AdmissionGate,
    AdmissionRevoked,
    PacingError,
    PacingStats,
    PacingTimeout,
    UnpaceableTrainer,
    WeightsTooOld,
)
from rollout_stream.pacing.progress import ProgressBoard, ProgressWriter, ensure_progress_topic, now_ms
from rollout_stream.pacing.trainer import TrainerProgressPublisher

__all__ = ["AdmissionFollower", "AdmissionGate", "AdmissionRevoked", "AdmissionWriter", "PacingError",
           "PacingStats", "PacingTimeout", "ProgressBoard", "ProgressWriter", "TrainerProgressPublisher",
           "UnpaceableTrainer", "WeightsTooOld", "ensure_admission_topic", "ensure_progress_topic", "now_ms"]
