"""The stage's own work per sample, this checkout against an earlier commit, on this machine, alternating.

The target is the stage's own work cut to a third of the baseline's on the same machine. A figure from
another machine does not answer that: the same code's figure differs between machines as much as the
target asks the code to change (docs/benchmarks-archive.md). So this script
runs `bench/scripts/stage_work_bench.py` of both commits in fresh processes, one after
the other, `--rounds`
times (a slow spell of the machine then hits both sides), and prints each side's runs, the ratio of the
medians and each round's ratio.

The earlier commit is checked out in a temporary `git worktree` (removed afterwards) and runs its own sources
on this checkout's virtual environment, with the C extensions off (`ROLLOUT_STREAM_COMPILED=0`: the fresh
worktree has none built, and this checkout's were built from other sources). Both sides get only the arguments
every version of the bench takes, so each times best of 3 passes on the wall clock; with `--cpu`, on the
thread's CPU time instead (both sides' `time.perf_counter` is `time.thread_time` there). This machine is a VM
whose host takes time from it now and then (the `steal` column of /proc/stat); the wall clock counts that
time, the thread's CPU time does not.

    .venv/bin/python bench/scripts/stage_work_against.py                     # against the \
        baseline
    .venv/bin/python bench/scripts/stage_work_against.py --cpu --rounds 7           # \
        steadier on a VM
    .venv/bin/python bench/scripts/stage_work_against.py --rev HEAD~3 --tokens 32768 --groups 80
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
BENCH = Path("benchmarks") / "stage_work_bench.py"
BASELINE = "3d21e53"
"""The code before the performance work (its figures: docs/benchmarks-archive.md)."""

_FIGURE = re.compile(r"([0-9.]+) µs per sample")
COMPILED_ENV = "ROLLOUT_STREAM_COMPILED"


_ON_CPU_TIME = ("import runpy, sys, time; time.perf_counter = time.thread_time; "
                "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
"""Runs a bench with the thread's CPU time as its clock: older benches have no `--cpu`."""


def run_bench(checkout: Path, args: list[str], *, compiled: bool, cpu: bool = False) -> float:
    """µs per sample that `checkout`'s stage_work_bench.py prints for `args` (with this checkout's C
    extensions, which `make venv` builds)."""
    env = dict(os.environ, PYTHONPATH=str(checkout))
    env.pop(COMPILED_ENV, None)
    if not compiled:
        env[COMPILED_ENV] = "0"
    launcher = ["-c", _ON_CPU_TIME] if cpu else []
    done = subprocess.run([sys.executable, *launcher, str(checkout / BENCH), *args], cwd=checkout, env=env,
                          capture_output=True, text=True, check=False)
    found = _FIGURE.search(done.stdout)
    if done.returncode or found is None:
        raise SystemExit(f"{checkout / BENCH} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    if compiled and "hot path C extensions)" not in done.stdout:
        raise SystemExit(f"this checkout ran without its C extensions (make venv):\n{done.stdout}")
    return float(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=BASELINE, help=f"the earlier commit (default {BASELINE}, the baseline)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--groups", type=int, default=3000)
    ap.add_argument("--cpu", action="store_true", help="time each side's thread CPU time, not the wall clock")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    bench_args = ["--tokens", str(args.tokens), "--group-size", str(args.group_size),
                  "--groups", str(args.groups)]
    with tempfile.TemporaryDirectory(prefix="stage-work-") as tmp:
        earlier = Path(tmp) / "earlier"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--quiet", "--detach", str(earlier),
                        args.rev], check=True)
        try:
            before: list[float] = []
            now: list[float] = []
            for _ in range(args.rounds):
                before.append(run_bench(earlier, bench_args, compiled=False, cpu=args.cpu))
                now.append(run_bench(ROOT, bench_args, compiled=True, cpu=args.cpu))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(earlier)],
                           check=False)
    label = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.rev], capture_output=True,
                           text=True, check=False).stdout.strip() or args.rev
    ratio = statistics.median(now) / statistics.median(before)
    print(f"{args.tokens} tokens, groups of {args.group_size}, {args.groups} groups, µs per sample "
          f"(best of 3 passes each, {'thread CPU time' if args.cpu else 'wall clock'}, {args.rounds} "
          f"alternating rounds):")
    print(f"  {label:<10} {', '.join(f'{x:.1f}' for x in before)}")
    print(f"  {'this':<10} {', '.join(f'{x:.1f}' for x in now)}")
    print(f"  ratio of the medians: {ratio:.2f} (rounds: "
          f"{', '.join(f'{n / b:.2f}' for b, n in zip(before, now, strict=True))})")


if __name__ == "__main__":
    main()
