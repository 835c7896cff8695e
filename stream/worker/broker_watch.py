"""Say when the worker has no broker connection left, and when it is back. The clients reconnect with
backoff on their own; uncommitted outputs and offsets wait in the open transaction."""

from __future__ import annotations

import logging
from collections.abc import Callable

from rollout_stream.logs import log_event

__all__ = ["BrokerWatch"]

log = logging.getLogger("rollout_stream.worker")


class BrokerWatch:
    def __init__(self, connections: Callable[[], int | None], bootstrap: str) -> None:
        self.connections, self.bootstrap = connections, bootstrap
        self.lost_at: float | None = None  # monotonic time the last broker connection went away
        self._last_said = 0.0

    def check(self, now: float, open_windows: int) -> None:
        count = self.connections()
        if count is None:
            return  # the client cannot tell: say nothing rather than something wrong
        if count == 0 and self.lost_at is None:
            self.lost_at = self._last_said = now
            log_event(
                log,
                "broker.unreachable",
                logging.WARNING,
                bootstrap=self.bootstrap,
                open_windows=open_windows,
                action="retrying with backoff; nothing is committed until it is back",
            )
        elif count == 0 and self.lost_at is not None and now - self._last_said >= 10.0:
            self._last_said = now
            log_event(log, "broker.still_unreachable", logging.WARNING, bootstrap=self.bootstrap,
                      down_s=f"{now - self.lost_at:.0f}")
        elif count > 0 and self.lost_at is not None:
            log_event(log, "broker.reconnected", bootstrap=self.bootstrap, down_s=f"{now - self.lost_at:.1f}")
            self.lost_at = None
