"""``sglang_kimi/hardening/memory_occupation.py``: releasing and resuming memory cannot end a serving server. A release
while
requests run, or of an unknown tag, is an HTTP 400; what still reaches the scheduler releases nothing while requests
run, and a resume resumes only what was released (SGLang's scheduler asserted, or raised KeyError)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from support.refusals import refused

from sglang_kimi.hardening import memory_occupation
from sglang_kimi.hardening.memory_occupation import (
    check_release,
    check_resume,
    release_when_idle,
    resume_what_was_released,
)


@pytest.fixture(autouse=True)
def replies(monkeypatch):
    """The scheduler's reply objects by name (SGLang's io_struct needs the scheduler process's imports)."""
    monkeypatch.setattr(memory_occupation, "_reply", lambda name: name)


def tokenizer(in_flight=0, paused=False):
    return SimpleNamespace(rid_to_state={f"r{i}": object() for i in range(in_flight)}, is_pause=paused)


def test_a_release_while_requests_are_served_is_refused():
    assert "2 requests are being served" in refused(check_release, tokenizer(2), SimpleNamespace(tags=None))
    assert "/pause_generation" in refused(check_release, tokenizer(1), SimpleNamespace(tags=["kv_cache"]))


@pytest.mark.parametrize("check", [check_release, check_resume])
def test_unknown_tags_are_refused(check):
    message = refused(check, tokenizer(), SimpleNamespace(tags=["kv_cache", "kv"]))
    assert "unknown memory tags ['kv']" in message and "'weights'" in message


def test_an_idle_or_paused_server_may_release():
    assert check_release(tokenizer(), SimpleNamespace(tags=None)) is None
    assert check_release(tokenizer(3, paused=True), SimpleNamespace(tags=["weights"])) is None  # RL: pause first
    assert check_resume(tokenizer(3), SimpleNamespace(tags=["weights", "cuda_graph"])) is None


class Manager:
    """The scheduler's weight updater: SGLang's idleness check, the released tags, the calls that reached it."""

    def __init__(self, idle=True, engine_paused=False, released=()):
        self.scheduler = SimpleNamespace(_engine_paused=engine_paused)
        self.idle, self.offload_tags, self.calls, self.asked = idle, set(released), [], []

    def is_fully_idle(self, ignore_waiting=False):
        self.asked.append(ignore_waiting)
        return self.idle


def sglang(manager, recv_req):  # the original handler: records which tags reached it
    manager.calls.append(list(recv_req.tags) if recv_req.tags else None)
    return "output"


def test_a_release_that_finds_requests_running_releases_nothing():
    busy = Manager(idle=False)
    assert release_when_idle(sglang, busy, SimpleNamespace(tags=None)) == "ReleaseMemoryOccupationReqOutput"
    assert busy.calls == []
    idle = Manager(engine_paused=True)
    assert release_when_idle(sglang, idle, SimpleNamespace(tags=None)) == "output" and idle.calls == [None]
    assert idle.asked == [True]  # SGLang's own rule: a paused engine's retracted requests may wait


@pytest.mark.parametrize(
    "released, tags, reached",
    [
        ({"kv_cache", "weights", "cuda_graph"}, None, ["kv_cache", "weights", "cuda_graph"]),
        ({"weights"}, None, ["weights"]),
        ({"weights"}, ["kv_cache", "weights"], ["weights"]),
        (set(), None, "nothing"),
        ({"kv_cache"}, ["weights"], "nothing"),
    ],
)
def test_a_resume_reaches_sglang_with_the_released_tags_only(released, tags, reached):
    manager = Manager(released=released)
    result = resume_what_was_released(sglang, manager, SimpleNamespace(tags=tags))
    if reached == "nothing":
        assert manager.calls == [] and result == "ResumeMemoryOccupationReqOutput"
    else:
        assert manager.calls == [reached] and result == "output"
