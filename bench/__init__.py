"""The workshop: benchmarks and acceptance harnesses, in the repository and not in the wheel.

`python -m bench run` (from the repository's root, in the project's venv): the stage measured against the
client's ceiling on a real broker (docs/benchmarks.md). `scripts/` holds one script per other measurement.

workloads   what a prompt group looks like; topics pre-loaded with many of them
passthrough consume raw bytes → produce raw bytes → commit: the same clients with no stage work
runner      one process under test (stage or passthrough), reporting JSON events from inside
proc        drives a runner subprocess
latency     paced load and a read_committed observer of train-data
suite       the run: throughput, latency at half load, memory, delivery modes, commit cadence
command     the `python -m bench run` options
report      rich tables for people (`--json` prints the suite's report as JSON)

Nothing is imported here: `python -m bench.runner` must not find its own module pre-imported.
"""
