"""SGLang's sessions made safe to serve: a session started over, a streaming session on a speculative server, a
session's timeout.

**A session started over.** A ``/generate`` request with ``session_params: {"id": ..., "replace": true}`` and no
``rid`` asks SGLang to drop the session's whole history and start it again from the new prompt.
``Session.create_req`` does that by iterating the session's ``req_nodes`` dict while each node's ``clear`` deletes
itself (and its children) from that dict: on any session that has served a request, the iteration raises
``RuntimeError: dictionary changed size during iteration`` in the scheduler, which ends the server (SGLang 0.5.20 to
0.5.23). An AROUND hook on ``Session.create_req`` does the same clearing first, as ``clear`` would (each unfinished
request of the session aborted, every node dropped), so SGLang's loop then runs over an empty dict and the request
is served as one with no history. Streaming sessions refuse ``replace`` on their own path and are left alone.

**A streaming session's next turn** (``--enable-streaming-session``) keeps the KV cache of the turns before it and
prefills only what is new. When a turn finishes, ``StreamingSession.try_cache_finished_req`` counts the KV of every
input and output token as committed: the prompt, and each output token up to the last. The last output token's KV
is never computed by the decode that produced it; it would be by the next forward, which a finished request does not
get. Autoregressively its slot was never allocated, so the count stops one short and the next turn prefills that
token. A speculative step allocates and writes a slot for every drafted position, and the last output token is often
the step's bonus token, sampled by the target where a draft was rejected: its slot holds the rejected draft token's
KV, which the next turn then attends to as the bonus token's. Its outputs differ from the autoregressive server's
(the tiny model: the last token of a 24-token turn, with DFLASH chains and trees and EAGLE3 trees alike). An AROUND
hook lowers the committed count of the session's KV to one short of the finished turn, so the next turn prefills its
last token, as autoregressively (one token more to prefill per turn, where the last token's KV was already right).

**A session's timeout** (``/open_session``): SGLang closes a session idle for longer than ``timeout`` seconds. A
timeout of 0 or less opened the session, answered its id, and closed it at the scheduler's next pass, so every request
naming it failed; a BEFORE hook refuses it with HTTP 400.
"""

from __future__ import annotations

from sglang_kimi.admin_validation import finite_number, refuse
from sglang_kimi.hooks import hook


def restart_session_first(original, session, req, *args, **kwargs):
    """AROUND ``Session.create_req(self, req, ...)``."""
    params = getattr(req, "session_params", None)
    if params is not None and params.replace and params.rid is None and not session.streaming and session.req_nodes:
        for node in session.req_nodes.values():
            node.abort()  # what SessionReqNode.clear does to a request still running, before it drops the node
        session.req_nodes.clear()
    return original(session, req, *args, **kwargs)


def commit_all_but_the_last_token(original, sessions, req, *args, **kwargs):
    """AROUND ``StreamingSession.try_cache_finished_req(self, req, ...)``."""
    handled = original(sessions, req, *args, **kwargs)
    session = getattr(req, "session", None)
    slot = sessions.slots.get(session.session_id) if handled and session is not None else None
    if slot is not None and slot.kv.holds_kv:
        last_token = len(req.origin_input_ids) + len(req.output_ids) - 1  # output_ids: trimmed to the finished length
        slot.kv.kv_committed_len = min(slot.kv.kv_committed_len, last_token)
    return handled


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


def install_streaming_session_commit(target: str):
    hook(target, commit_all_but_the_last_token, "AROUND")
