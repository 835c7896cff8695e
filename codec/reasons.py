"""Dead-letter reason codes (part of the contract, docs/spec.md §4.4)."""

from enum import StrEnum

__all__ = ["DeadLetterReason"]


class DeadLetterReason(StrEnum):
    DECODE_ERROR = "decode_error"
    INVALID_SAMPLE = "invalid_sample"
    SHARED_REWARD_VIOLATION = "shared_reward_violation"
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    INCOMPLETE_GROUP = "incomplete_group"
    LATE_MEMBER = "late_member"
    # Beyond the contract (docs/spec.md §4.4): a group that alone would hold more than --max-open-mib. Back-
    # pressure waits for windows to close, and this one never would: refused whole, the partition moves on.
    GROUP_TOO_LARGE = "group_too_large"
    # Chunked values (docs/chunks.md): chunks that never all arrived before the group timeout, chunks whose
    # reassembled bytes do not match the digest they travel under, or two chunks of one slot that differ.
    INCOMPLETE_CHUNKS = "incomplete_chunks"
    CHUNK_DIGEST_MISMATCH = "chunk_digest_mismatch"
    CHUNK_CONFLICT = "chunk_conflict"
    # A prompt source's (docs/loop.md): every attempt a prompt was allowed ended without a result. Written by
    # a prompt source, not the stage: one record per prompt, keyed by the prompt, its attempts in the value.
    PROMPT_ATTEMPTS_EXHAUSTED = "prompt_attempts_exhausted"
