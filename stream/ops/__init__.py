"""Operator tools: the development broker, dead-letter inspection and replay, ACLs, synthetic rollouts, the
benchmark. Each is a library the `rollout-stream` commands call (rollout_stream.commands only parse and
call)."""
