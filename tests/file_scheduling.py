"""pytest-xdist's file scheduling, with a worker crash handled as a failure of one test, never as a hang.

pytest-xdist 3.8 puts a crashed worker's whole workload back on the queue, its finished files and the test
it died on included (pytest-xdist #1323, #1371), and gives the replacement one file. A worker runs a test
only once it knows the next one (or that none follows), so a replacement handed a file with one test or
none left waits forever: a run whose worker died (a segfault, the OOM killer, a hung test ended by
`faulthandler_exit_on_timeout`) hangs until CI kills it, with no summary. Here only the files with tests
left go back, the test the worker died on counts as done (the controller reports it failed, naming it),
and a worker is always given either more than two tests or the word that nothing follows.
"""

from __future__ import annotations

from typing import Any

from xdist.scheduler import LoadFileScheduling


class CrashSafeFileScheduling(LoadFileScheduling):
    def remove_node(self, node: Any) -> str | None:
        workload: dict[str, dict[str, bool]] = self.assigned_work.pop(node)
        left = [nodeid for unit in workload.values() for nodeid, done in unit.items() if not done]
        if not left:
            return None
        crashed = left[0]  # a worker runs its tests in order: the first not done is the one it died on
        for unit in workload.values():
            if crashed in unit:
                unit[crashed] = True
        for scope, unit in workload.items():
            if not all(unit.values()):
                self.workqueue[scope] = unit
                self.workqueue.move_to_end(scope, last=False)  # what was running goes on first
        for other in self.assigned_work:
            self._reschedule(other)
        return crashed

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down or node not in self.registered_collections:  # a replacement still collecting
            return
        while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
            self._assign_work_unit(node)
        if not self.workqueue:
            node.shutdown()
