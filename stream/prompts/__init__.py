"""The prompt source (docs/loop.md): a dataset handed out to rollout processes through the admission log."""

from rollout_stream.prompts.dataset import DatasetError, fingerprint, load_rows
from rollout_stream.prompts.errors import DatasetMismatch, LogNotFolded, NothingToTake, SourceFinished
from rollout_stream.prompts.fence import prompt_fence
from rollout_stream.prompts.source import PromptLease, PromptSource

__all__ = ["DatasetError", "DatasetMismatch", "LogNotFolded", "NothingToTake", "PromptLease", "PromptSource",
           "SourceFinished", "fingerprint", "load_rows", "prompt_fence"]
