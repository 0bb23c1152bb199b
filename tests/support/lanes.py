"""The test session's two lanes under ``pytest -n 2`` (``make test``).

A test process mostly waits on a server that computes on one core, and a server start-up is mostly imports on one
core: one process leaves the second core of a small machine idle much of the time. Under ``pytest -n`` the tests
run in two lanes, each a fixed list of modules run in order by one worker process (:class:`LaneScheduling`), with
its own server pool. The second lane holds the modules that share the session's two speculative trees, and the ones
that balance the lanes' times; every other test is in the first lane, the unit and statistical tests first.
"""

from __future__ import annotations

from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parents[1]
FIRST, SECOND = "lane-1", "lane-2"
# from the tests' folder
# Files that start servers of their own (a PD pair, a drafter per comparison, a SpecForge export): they run last, at
# the end of the longer lane, after its shared servers have stopped and once the other lane's servers are done, so
# that they add no server to the most the machine's memory holds at once.
LAST = ("e2e/test_disaggregation.py", "e2e/test_drafter_compare.py", "e2e/test_specforge_exports.py")
SECOND_LANE = {
    "e2e/test_cpu_spec_decoding.py",
    "e2e/test_reliability.py",
    "e2e/test_router.py",
    "e2e/test_eval_gsm8k.py",
    "e2e/test_gpu_serve_check_profile.py",
    "e2e/test_parallel.py",
    "e2e/test_cpu_spec_triton.py",
    "e2e/test_faults.py",
    "e2e/test_server.py",
    "e2e/test_bench.py",
    *LAST,
}


def run_order(path: Path) -> int:
    """0 for a file run in collection order, 1, 2, ... for the files of :data:`LAST`, which run after all others."""
    relative = path.resolve().relative_to(TESTS).as_posix()
    return LAST.index(relative) + 1 if relative in LAST else 0


def lane_of_path(path: Path) -> str:
    """The lane of a test file."""
    return SECOND if path.resolve().relative_to(TESTS).as_posix() in SECOND_LANE else FIRST


class LaneScheduling(LoadScopeScheduling):
    """pytest-xdist's scheduling by scope, each lane one scope: a worker runs a whole lane, in collection order."""

    def _split_scope(self, nodeid: str) -> str:
        return lane_of_path(Path(self.config.rootpath) / nodeid.split("::", 1)[0])
