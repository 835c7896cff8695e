"""The `rollout-stream` command line: the entry point, which says so when Ctrl-C comes while it starts.

The application itself (typer, rich and every command module, a second or more to import) is in
stream/app.py.
"""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["app", "main"]

_STARTING = "rollout-stream: interrupted while starting; nothing was done"


def _interrupted_while_starting(signum: int, frame: object) -> None:
    # Nothing has been done while modules load: one line and exit 130 (128 + SIGINT), not a KeyboardInterrupt
    # traceback from deep inside an import.
    print(_STARTING, file=sys.stderr, flush=True)
    raise SystemExit(130)


# Only over Python's own handler: an ignored SIGINT (a background job) stays ignored.
_sigint = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
_guard = _sigint is signal.default_int_handler
if _guard:
    signal.signal(signal.SIGINT, _interrupted_while_starting)
try:
    from rollout_stream.app import app
finally:  # importing this module (tests, `python -m`) leaves Ctrl-C as it found it
    if _guard:
        signal.signal(signal.SIGINT, _sigint)


def main() -> None:
    try:
        app()  # a command interrupted while it runs exits 130 (typer), having said what it did
    except KeyboardInterrupt:  # while typer builds the command line, before any command runs
        print(_STARTING, file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
