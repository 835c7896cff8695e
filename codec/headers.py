"""Header names of dead-letter and replayed records: one definition for the worker (core, stream) and
`dlq` (docs/spec.md §4.4, docs/dlq.md)."""

__all__ = [
    "REASON",
    "MESSAGE",
    "ORIGINAL_TOPIC",
    "ORIGINAL_PARTITION",
    "ORIGINAL_OFFSET",
    "ORIGINAL_TIMESTAMP",
    "GROUP_KEY",
    "STAGE_VERSION",
    "FAILED_AT",
    "ORIGINAL_HEADERS",
    "CARRIED_ON_REPLAY",
    "FAILURE_HEADERS",
    "REPLAY_ID",
    "REPLAY_COUNT",
    "REPLAYED_FROM",
    "REPLAY_HEADERS",
    "DEAD_LETTER_HEADERS",
]

# Written by the worker on every dead-letter record.
REASON = "x-dlq-reason"
MESSAGE = "x-dlq-message"
ORIGINAL_TOPIC = "x-original-topic"
ORIGINAL_PARTITION = "x-original-partition"
ORIGINAL_OFFSET = "x-original-offset"
ORIGINAL_TIMESTAMP = "x-original-timestamp"
GROUP_KEY = "x-group-key"
STAGE_VERSION = "x-stage-version"
FAILED_AT = "x-failed-at"

# Where the record was read before it failed: carried over onto a replayed record unchanged.
ORIGINAL_HEADERS = (ORIGINAL_TOPIC, ORIGINAL_PARTITION, ORIGINAL_OFFSET, ORIGINAL_TIMESTAMP)
# Carried over too: the worker keeps a replayed record's first failure time if it fails again.
CARRIED_ON_REPLAY = (*ORIGINAL_HEADERS, FAILED_AT)
# Why it failed: meaningful only in the dead-letter topic, so a replay drops them.
FAILURE_HEADERS = (REASON, MESSAGE, GROUP_KEY, STAGE_VERSION)

# Written by `dlq replay` on every replayed record.
REPLAY_ID = "x-replay-id"  # one id per replay run: the worker windows a replayed group by (group key, id)
REPLAY_COUNT = "x-replay-count"  # 1 on the first replay, previous count + 1 on a replay of a replay
REPLAYED_FROM = "x-replayed-from"  # "<dead-letter topic>:<partition>:<offset>" of the record replayed
REPLAY_HEADERS = (REPLAY_ID, REPLAY_COUNT, REPLAYED_FROM)
# Every header the worker writes on a dead-letter record, in the order it writes them.
DEAD_LETTER_HEADERS = (REASON, MESSAGE, *ORIGINAL_HEADERS, GROUP_KEY, STAGE_VERSION, FAILED_AT)
