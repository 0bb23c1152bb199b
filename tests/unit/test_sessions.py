"""A session request that starts its session over (``replace`` without ``rid``), ``sglang_kimi/hardening/sessions.py``:
served
with no history, where SGLang's own clearing raised in the scheduler.

SGLang's session module imports its scheduler's request types, which need the CPU import shims, so the tests run in
the session's CPU SGLang child process (``cpu_sglang_child``); in the parent, one test fails with the child's report.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.session.session_controller import Session, SessionReqNode

from sglang_kimi.hardening.sessions import restart_session_first

pytestmark = pytest.mark.cpu_sglang_child


class Fields(SimpleNamespace):
    """A request object whose unset fields read as None (``create_req`` copies many of them to the new request)."""

    def __getattr__(self, name):
        return None


def made_req(**fields):
    return Fields(**fields, set_finish_with_abort=lambda message: None)


def session_with_history() -> tuple[Session, Fields, Fields]:
    """A session of two turns: a finished one and, appended to it, one still running."""
    session = Session(capacity_of_str_len=1000, session_id="s")
    first = Fields(rid="r1", finished_reason="stop", to_finish=None)
    second = Fields(rid="r2", finished_reason=None, to_finish=None)
    session.req_nodes["r1"] = root = SessionReqNode(first)
    session.req_nodes["r2"] = SessionReqNode(second, root)
    return session, first, second


def new_turn(replace: bool, rid: str | None = None) -> Fields:
    params = SimpleNamespace(id="s", rid=rid, replace=replace, offset=None, drop_previous_output=False)
    return Fields(rid="r3", session_params=params, input_ids=[5, 6, 7])


def create(session, req):
    return Session.create_req(session, req, tokenizer=None, vocab_size=4096, req_factory=made_req)


def test_sglang_alone_raises_on_a_session_with_history():
    session, _, _ = session_with_history()
    with pytest.raises(RuntimeError, match="dictionary changed size"):
        create(session, new_turn(replace=True))


def test_the_session_starts_over():
    session, finished, running = session_with_history()
    new = restart_session_first(create, session, new_turn(replace=True))
    assert new.origin_input_ids == [5, 6, 7]  # no history
    assert list(session.req_nodes) == ["r3"] and session.req_nodes["r3"].parent is None
    assert isinstance(running.to_finish, FINISH_ABORT) and finished.to_finish is None


@pytest.mark.parametrize("replace, rid", [(True, "r1"), (False, None), (False, "r2")])
def test_other_session_requests_reach_sglang_with_their_history(replace, rid):
    session, _, _ = session_with_history()
    seen = []

    def original(session, req):
        seen.append(list(session.req_nodes))
        return "sglang"

    assert restart_session_first(original, session, new_turn(replace, rid)) == "sglang"
    assert seen == [["r1", "r2"]]


def test_a_streaming_session_is_left_to_sglang():
    session, _, _ = session_with_history()
    session.streaming = True
    seen = []
    restart_session_first(lambda s, r: seen.append(list(s.req_nodes)), session, new_turn(replace=True))
    assert seen == [["r1", "r2"]]


# -- a streaming session's finished turn ---------------------------------------------------------------------


def finished_turn(handled: bool = True, allocated: int = 40, session_id: str = "s"):
    """A streaming session whose turn (23 prompt tokens, 10 output tokens) SGLang has just committed: the slot's
    count as SGLang leaves it, every one of the turn's 33 tokens (capped at the slots allocated)."""
    kv = SimpleNamespace(holds_kv=True, kv_allocated_len=allocated, kv_committed_len=min(33, allocated))
    sessions = SimpleNamespace(slots={"s": SimpleNamespace(kv=kv)})
    req = SimpleNamespace(session=SimpleNamespace(session_id=session_id), origin_input_ids=[1] * 23)
    req.output_ids = [2] * 10

    def original(sessions, req):
        return handled

    return sessions, req, original, kv


def test_the_last_output_tokens_kv_is_prefilled_again():
    from sglang_kimi.speculative.streaming_sessions import commit_all_but_the_last_token

    sessions, req, original, kv = finished_turn()  # a speculative server: slots past the last token
    assert commit_all_but_the_last_token(original, sessions, req) is True
    assert kv.kv_committed_len == 32


@pytest.mark.parametrize(
    "handled, allocated, session_id, committed",
    [
        (True, 32, "s", 32),  # autoregressive: the last token never got a slot; nothing changes
        (False, 40, "s", 33),  # SGLang did not keep the turn (an aborted one): its own path
        (True, 40, "other", 33),  # the session holds no slot here
    ],
)
def test_other_finished_turns_are_left_as_they_are(handled, allocated, session_id, committed):
    from sglang_kimi.speculative.streaming_sessions import commit_all_but_the_last_token

    sessions, req, original, kv = finished_turn(handled, allocated, session_id)
    assert commit_all_but_the_last_token(original, sessions, req) is handled
    assert kv.kv_committed_len == committed
