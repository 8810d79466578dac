"""How xdist hands tests to workers: any test to any idle worker, except the suites whose tests
share a costly resource of their process, which go whole to one worker."""
from __future__ import annotations

import pytest


# Suites whose tests share a costly resource of their process (a data-parallel rank pool, the
# transformers anchor): under xdist each of these files runs on one worker, which pays for it once.
ONE_WORKER_PER_FILE = ("suites/test_data_parallel_execution.py", "suites/test_numerical_anchor.py")


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist's "load" (any test to any idle worker), except that each file above goes whole to one
    worker; those go first, being the longest units."""
    try:
        from xdist.scheduler import LoadScopeScheduling
    except ImportError:
        return None
    uses = ("_split_scope", "_reschedule", "schedule", "remove_node")  # xdist's internals this leans on
    if config.getoption("dist") != "load" or not all(hasattr(LoadScopeScheduling, name) for name in uses):
        return None  # xdist's own choice

    class SharedResourceScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return path if path.endswith(ONE_WORKER_PER_FILE) else nodeid

        def schedule(self):
            if self.collection is None:
                return super().schedule()
            # A worker replaced one that died. Only workers that have collected get work (another
            # replacement may still be collecting: xdist's own loop would ask for its collection and
            # fail), each twice: a second unit, or its shutdown, as a worker runs a test once it knows the next.
            for node in [n for n in self.nodes if n in self.registered_collections]:
                self._reschedule(node)
                self._reschedule(node)
            return None

        def remove_node(self, node):
            # A worker that died (a native hang the watchdog ended, say): its running test is
            # reported as crashed and not run again (loadscope would requeue it, and loop on
            # it); the rest of its work goes back in the queue.
            workload = self.assigned_work.pop(node)
            pending = [(scope, nodeid) for scope, unit in workload.items() for nodeid, done in unit.items() if not done]
            if not pending:
                return None
            scope, crashed = pending[0]
            workload[scope][crashed] = True
            self.workqueue.update((s, unit) for s, unit in workload.items() if not all(unit.values()))
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return SharedResourceScheduling(config, log)
