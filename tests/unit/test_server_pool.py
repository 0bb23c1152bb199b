"""The e2e tests' server pool (``tests/support/servers.py``), with fake server processes: the plan follows the
modules' ``SERVERS`` in run order, each configuration once; servers start ahead of use in plan order, never more
than ``ahead`` waiting unused; a test gets the server started for it; a shared server stops once the last module
listing it is done; a module cannot use a server it does not list."""

from __future__ import annotations

import itertools
import time
from types import SimpleNamespace

import pytest
from support import lanes, servers
from support.servers import ServerPool, server_config, session_plan

A, B, C, D = (server_config(name, ["--flag", name]) for name in "abcd")
WITH_FILES = server_config("files", ["--config", "{dir}/policy.json"], env={"X": "1"}, files={"policy.json": "{}"})


def item(module: str, listed: list) -> SimpleNamespace:
    return SimpleNamespace(module=SimpleNamespace(__name__=module, SERVERS=listed))


def request(module: str) -> SimpleNamespace:
    return SimpleNamespace(module=SimpleNamespace(__name__=module))


class FakeServer:
    pids = itertools.count(1000)

    def __init__(self, folder, args, env):
        self.folder, self.args, self.env = folder, args, env
        self.pgid = next(self.pids)
        self.stopped = False

    def stop(self):
        self.stopped = True


@pytest.fixture
def started(monkeypatch):
    """The fake servers in the order they were started."""
    log: list[FakeServer] = []

    def start(folder, args, env):
        log.append(FakeServer(folder, args, env))
        return log[-1]

    monkeypatch.setattr(servers, "_start", start)
    monkeypatch.setattr(servers, "_settle", lambda server: None)
    monkeypatch.setattr(servers, "_ready", lambda server: server)
    monkeypatch.setattr(servers, "group_alive", lambda pgid: False)
    return log


def names(log) -> list[str]:
    return [server.args[1] for server in log]


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the pool did not get there"
        time.sleep(0.01)


def test_the_plan_follows_the_modules_in_run_order_each_configuration_once():
    items = [item("m1", [A, B]), item("m1", [A, B]), item("m2", [C, A]), item("m3", []), item("m4", [B, D])]
    plan, users = session_plan(items)
    assert plan == [A, B, C, D]
    assert users == {A: {"m1", "m2"}, B: {"m1", "m4"}, C: {"m2"}, D: {"m4"}}


def test_servers_start_ahead_in_plan_order_and_stop_after_their_last_module(started, tmp_path_factory):
    plan, users = session_plan([item("m1", [A, B]), item("m2", [C, A]), item("m4", [D])])
    pool = ServerPool(tmp_path_factory, plan, users, ahead=2)
    wait_for(lambda: len(started) == 2)
    time.sleep(0.1)
    assert names(started) == ["a", "b"]  # no more than two wait unused

    a = pool.get(A, request("m1"))
    assert a is started[0]  # the server started ahead, not a new one
    wait_for(lambda: len(started) == 3)
    assert names(started) == ["a", "b", "c"]
    pool.get(B, request("m1"))
    wait_for(lambda: len(started) == 4)

    pool.module_done("m1")  # b: no later module lists it; a: m2 does
    assert started[1].stopped and not a.stopped
    assert pool.get(A, request("m2")) is a
    pool.module_done("m2")
    assert a.stopped and started[2].stopped  # c was started for m2, which never asked for it
    time.sleep(0.1)
    assert len(started) == 4  # nothing is started twice

    with pytest.raises(AssertionError, match="list it in SERVERS"):
        pool.get(A, request("m4"))
    pool.stop_all()
    assert all(server.stopped for server in started)


def test_a_stopped_configuration_asked_for_again_starts_again(started, tmp_path_factory):
    pool = ServerPool(tmp_path_factory, *session_plan([item("m1", [A])]), ahead=1)
    first = pool.get(A, request("m1"))
    pool.stop(A)
    assert first.stopped
    second = pool.get(A, request("m1"))
    assert second is not first and not second.stopped
    pool.stop_all()


def test_a_configuration_s_files_are_written_into_its_folder(started, tmp_path_factory):
    pool = ServerPool(tmp_path_factory, *session_plan([item("m1", [WITH_FILES])]), ahead=1)
    server = pool.get(WITH_FILES, request("m1"))
    assert server.args == ["--config", str(server.folder / "policy.json")]
    assert (server.folder / "policy.json").read_text() == "{}" and server.env == {"X": "1"}
    pool.stop_all()


def test_a_lane_planned_later_starts_its_servers_ahead_even_one_an_earlier_lane_stopped(started, tmp_path_factory):
    pool = ServerPool(tmp_path_factory, ahead=1)
    time.sleep(0.1)
    assert started == []  # nothing planned, nothing started
    pool.add_plan(*session_plan([item("m1", [A])]))
    wait_for(lambda: len(started) == 1)
    pool.get(A, request("m1"))
    pool.module_done("m1")
    assert started[0].stopped
    with pytest.raises(AssertionError, match="list it in SERVERS"):
        pool.get(B, request("m2"))

    pool.add_plan(*session_plan([item("m2", [B, A])]))  # the second lane's first test starts
    wait_for(lambda: len(started) == 2)
    time.sleep(0.1)
    assert names(started) == ["a", "b"]  # one waits unused at a time
    pool.get(B, request("m2"))
    wait_for(lambda: len(started) == 3)
    assert names(started) == ["a", "b", "a"] and pool.get(A, request("m2")) is started[2]
    pool.stop_all()


def test_every_module_of_the_second_lane_exists_and_a_lane_is_one_scope():
    assert lanes.SECOND_LANE and all((lanes.TESTS / path).is_file() for path in lanes.SECOND_LANE)
    sched = lanes.LaneScheduling.__new__(lanes.LaneScheduling)
    sched.config = SimpleNamespace(rootpath=lanes.TESTS.parent)
    scope = sched._split_scope
    assert scope("tests/e2e/test_cpu_spec_decoding.py::test_x[dflash-chain]") == lanes.SECOND
    assert scope("tests/e2e/test_cpu_spec_decoding.py::test_y") == scope("tests/e2e/test_server.py::test_z")
    assert scope("tests/unit/test_server_pool.py::test_x") == scope("tests/e2e/test_variants.py::t") == lanes.FIRST
