"""Stopping a server: the whole process group goes; a launcher left alone once its workers are gone (SGLang's sleeps
before its crash diagnostics) is killed, one that exits on its own keeps its exit status, one whose worker runs in a
group of its own (``sglang-kimi serve``) is left to stop it, and a worker that ignores SIGTERM is killed."""

import os
import signal
import sys
import textwrap
import time

import pytest
from support.processes import children

from sglang_kimi.launcher.checks import DEFAULT_HOST
from sglang_kimi.launcher.server import LaunchSpec, ServerProcess, group_alive, group_members

# Stands in for SGLang's launcher: starts multiprocessing's resource tracker (which lives until the launcher exits) and
# a worker in its process group (or in a group of its own, which it stops on SIGTERM, as `sglang-kimi serve` does
# SGLang's), and on SIGTERM waits for the worker, then leaves with status 7: at once ("exit") or after SGLang's 5 s
# wait before its crash diagnostics ("sleep").
FAKE_LAUNCHER = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    from multiprocessing import resource_tracker
    after_workers, worker_ignores_term, own_group = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1"
    resource_tracker.ensure_running()
    worker = "import signal, time\\n"
    if worker_ignores_term:
        worker += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    worker += "print('worker up', flush=True)\\nwhile True: time.sleep(1)\\n"
    child = subprocess.Popen([sys.executable, "-c", worker], start_new_session=own_group)

    def on_term(signum, frame):
        if own_group:
            os.killpg(child.pid, signal.SIGTERM)
        child.wait()
        if after_workers == "sleep":
            time.sleep(5)
        sys.exit(7)

    signal.signal(signal.SIGTERM, on_term)
    print("launcher up", flush=True)
    while True:
        time.sleep(1)
    """
)


def started(tmp_path, after_workers: str, worker_ignores_term: bool = False, own_group: bool = False):
    flags = ["1" if worker_ignores_term else "0", "1" if own_group else "0"]
    argv = [sys.executable, "-c", FAKE_LAUNCHER, after_workers, *flags]
    spec = LaunchSpec(argv=argv, env={}, host=DEFAULT_HOST, port=1, cpu=True)
    log = tmp_path / "server.log"
    server = ServerProcess(spec, log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = log.read_text()
        if "launcher up" in text and "worker up" in text:
            return server
        time.sleep(0.05)
    server.stop()
    pytest.fail("the fake launcher did not start: " + log.read_text())


@pytest.fixture
def start(tmp_path):
    """``started`` for a test, whose fake launchers are all stopped at its end, whatever it asserted."""
    servers = []

    def _start(*args, **kwargs):
        servers.append(started(tmp_path, *args, **kwargs))
        return servers[-1]

    yield _start
    for server in servers:
        server.stop(timeout=1.0)


def test_a_launcher_outliving_its_workers_is_killed(start):
    server = start("sleep")
    assert len(group_members(server.pgid)) == 3, "launcher, resource tracker, worker"
    server.stop()
    assert not group_alive(server.pgid)
    assert server.proc.returncode == -signal.SIGKILL


def test_a_launcher_that_exits_after_its_workers_keeps_its_status(start):
    server = start("exit")
    server.stop()
    assert not group_alive(server.pgid)
    assert server.proc.returncode == 7


def test_a_launcher_whose_worker_has_its_own_group_stops_it(start):
    server = start("sleep", own_group=True)
    [worker] = [pid for pid in children(server.proc.pid) if os.getpgid(pid) != server.pgid]
    server.stop()
    assert server.proc.returncode == 7, "the launcher was killed before it stopped its worker"
    assert not group_alive(server.pgid) and not group_alive(worker)


def test_a_worker_ignoring_sigterm_is_killed(start):
    server = start("exit", worker_ignores_term=True)
    server.stop(timeout=1.0)
    assert not group_alive(server.pgid)
    assert server.proc.returncode == -signal.SIGKILL
