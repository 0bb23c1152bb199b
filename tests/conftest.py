"""Shared by every test folder.

- ``tests/`` is on ``sys.path`` so that ``support`` (the tests' own machinery) imports.
- Each folder is a layer, marked so that any layer can be selected (``pytest -m statistical``):
  ``unit`` (fast, CPU, no server), ``statistical`` (distribution tests, large samples), ``e2e`` (real SGLang server
  processes on CPU), ``gpu`` (a CUDA or ROCm device).
- Under ``pytest -n 2`` (``make test``) each of two worker processes runs one lane of the tests, with its own
  server pool (``support.lanes``).
- A file marked ``pytestmark = pytest.mark.cpu_sglang_child`` (or ``interpreted_sglang_child``) runs in an SGLang
  child process: here it is one test that runs the file there (``support.child_process``); the files marked
  ``cpu_sglang_child`` share one child, the ``cpu_sglang_child`` fixture.
- The tests' shared machinery and helpers are in ``support`` (``tests/support/``): the repository's paths
  (``support.paths``), the servers and the e2e helpers (``support.servers``, ``support.spec_e2e``), the drafter
  checkpoints written for a test (``support.drafter_checkpoints``), the child processes, ...
"""

import os
import sys
import time
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# One torch (OpenMP) thread in every process of the session: this process, and the servers and children it starts,
# which inherit the variable. On two cores a process's second OpenMP thread waits for a core whenever another
# process runs, at every parallel region: beside one busy process a DFLASH tree server at concurrency 1 decoded
# 8 x 64 tokens in 131 s with two threads and in 6.8 s with one (7.0 s and 6.3 s on an idle machine). Every process
# running one thread also sums alike, so servers compared token for token cannot differ by their thread counts.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from support.child_process import make_child_module  # noqa: E402
from support.lanes import LaneScheduling, lane_of_path, run_order  # noqa: E402

LAYERS = ("unit", "statistical", "e2e", "gpu")
LANES_STARTED = pytest.StashKey[list]()  # the lanes whose tests have started in this process, in order
POOL = pytest.StashKey[object]()


def lane(item) -> str:
    return lane_of_path(Path(str(item.fspath)))


def xdist_worker(config) -> bool:
    """Whether this session is a ``pytest -n`` worker (not a pytest child process of one, which inherits its
    environment)."""
    return hasattr(config, "workerinput")


def items_here(session, lanes) -> list:
    """The session's items that run in this process: all of them, or under ``pytest -n`` those of ``lanes``."""
    return [item for item in session.items if not xdist_worker(session.config) or lane(item) in lanes]


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent):
    """A file marked to run in an SGLang child process is, outside that child, one test that runs it there (never
    imported here: its module-level SGLang imports need the child's environment)."""
    return make_child_module(module_path, parent)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: run_order(Path(str(item.fspath))))  # stable: support.lanes.LAST at the end
    for item in items:
        layer = Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return LaneScheduling(config, log)


LANE_TIMES = pytest.StashKey[dict]()  # in a worker: lane -> [first test's start, last test's end] (monotonic s)
LANE_SECONDS = pytest.StashKey[dict]()  # in the controller: lane -> seconds, as the workers reported them


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The lane's time so far, for the summary (under ``pytest -n``: ``pytest_testnodedown`` reads it)."""
    if xdist_worker(item.config):
        times = item.config.stash.get(LANE_TIMES, {})
        times[lane(item)][1] = time.monotonic()
        item.config.workeroutput["lane_seconds"] = {name: end - start for name, (start, end) in times.items()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    lanes = getattr(node, "workeroutput", {}).get("lane_seconds", {})
    node.config.stash.setdefault(LANE_SECONDS, {}).update(lanes)


def pytest_terminal_summary(terminalreporter, config):
    lanes = config.stash.get(LANE_SECONDS, {})
    if lanes:
        times = ", ".join(f"{name} {int(t) // 60}m{int(t) % 60}s" for name, t in sorted(lanes.items()))
        terminalreporter.write_line(f"lanes (first test's start to last test's end): {times}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Under ``pytest -n``, the first test of a lane on this worker plans the lane's servers (before any fixture,
    which may already ask the pool for one)."""
    if xdist_worker(item.config):
        times = item.config.stash.setdefault(LANE_TIMES, {})
        times.setdefault(lane(item), [time.monotonic(), 0.0])
    started = item.config.stash.setdefault(LANES_STARTED, [])
    if not xdist_worker(item.config) or lane(item) in started:
        return
    started.append(lane(item))
    pool = item.config.stash.get(POOL, None)
    if pool is not None:  # otherwise the pool is made for this test and plans the lane itself
        from support.servers import session_plan

        pool.add_plan(*session_plan(items_here(item.session, [lane(item)])))


@pytest.fixture(scope="session")
def cpu_sglang_child(request, tmp_path_factory):
    """The session's CPU SGLang child process, which runs every selected file marked ``cpu_sglang_child`` (of the
    lanes that run here): their tests here, one per file, use this fixture (``support.child_process``)."""
    from support.child_process import CpuSglangChild

    lanes = request.config.stash.get(LANES_STARTED, [])
    files = {
        str(Path(str(item.fspath)).resolve())
        for item in items_here(request.session, lanes)
        if "cpu_sglang_child" in item.fixturenames
    }
    return CpuSglangChild(sorted(files), tmp_path_factory.mktemp("cpu_sglang_child"))


@pytest.fixture(scope="session", autouse=True)
def server_pool(request, tmp_path_factory):
    """The session's SGLang servers (``support.servers.ServerPool``): those the selected e2e modules (of the lanes
    that run here) list in their ``SERVERS``, the first started while the tests before them run."""
    from support.servers import AHEAD, ServerPool, session_plan

    lanes = request.config.stash.get(LANES_STARTED, [])
    ahead = 1 if xdist_worker(request.config) else AHEAD  # two lanes: one server waits in each
    pool = ServerPool(tmp_path_factory, *session_plan(items_here(request.session, lanes)), ahead=ahead)
    request.config.stash[POOL] = pool
    yield pool
    del request.config.stash[POOL]
    pool.stop_all()
