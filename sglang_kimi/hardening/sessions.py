"""SGLang's sessions made safe to serve: a session started over, a session's timeout.

**A session started over.** A ``/generate`` request with ``session_params: {"id": ..., "replace": true}`` and no
``rid`` asks SGLang to drop the session's whole history and start it again from the new prompt.
``Session.create_req`` does that by iterating the session's ``req_nodes`` dict while each node's ``clear`` deletes
itself (and its children) from that dict: on any session that has served a request, the iteration raises
``RuntimeError: dictionary changed size during iteration`` in the scheduler, which ends the server (SGLang 0.5.20 to
0.5.23). An AROUND hook on ``Session.create_req`` does the same clearing first, as ``clear`` would (each unfinished
request of the session aborted, every node dropped), so SGLang's loop then runs over an empty dict and the request
is served as one with no history. Streaming sessions refuse ``replace`` on their own path and are left alone.

**A session's timeout** (``/open_session``): SGLang closes a session idle for longer than ``timeout`` seconds. A
timeout of 0 or less opened the session, answered its id, and closed it at the scheduler's next pass, so every request
naming it failed; a BEFORE hook refuses it with HTTP 400.
"""

from __future__ import annotations

from sglang_kimi.hardening.http_errors import finite_number, refuse
from sglang_kimi.hooks import hook


def restart_session_first(original, session, req, *args, **kwargs):
    """AROUND ``Session.create_req(self, req, ...)``."""
    params = getattr(req, "session_params", None)
    if params is not None and params.replace and params.rid is None and not session.streaming and session.req_nodes:
        for node in session.req_nodes.values():
            node.abort()  # what SessionReqNode.clear does to a request still running, before it drops the node
        session.req_nodes.clear()
    return original(session, req, *args, **kwargs)


def check_session_timeout(tokenizer_manager, obj, *args, **kwargs):
    """BEFORE ``TokenizerManager.open_session(self, obj, ...)``: a timeout the session can live with, or none."""
    timeout = getattr(obj, "timeout", None)
    if timeout is None:
        return None
    if not finite_number(timeout) or timeout <= 0:
        refuse(
            f"timeout is {timeout!r}: give the seconds a session may stay idle before it is closed (more than 0), "
            "or leave it out for a session that stays open until /close_session"
        )
    return None


def install_session_timeout_check(target: str):
    hook(target, check_session_timeout, "BEFORE")


def install_session_restart(target: str):
    hook(target, restart_session_first, "AROUND")
