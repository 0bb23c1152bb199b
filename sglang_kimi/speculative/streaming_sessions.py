"""A streaming session's next turn on a speculative server prefills the last token of the turn before it.

A streaming session (``--enable-streaming-session``) keeps the KV cache of the turns before it and
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
"""

from __future__ import annotations

from sglang_kimi.hooks import hook


def commit_all_but_the_last_token(original, sessions, req, *args, **kwargs):
    """AROUND ``StreamingSession.try_cache_finished_req(self, req, ...)``."""
    handled = original(sessions, req, *args, **kwargs)
    session = getattr(req, "session", None)
    slot = sessions.slots.get(session.session_id) if handled and session is not None else None
    if slot is not None and slot.kv.holds_kv:
        last_token = len(req.origin_input_ids) + len(req.output_ids) - 1  # output_ids: trimmed to the finished length
        slot.kv.kv_committed_len = min(slot.kv.kv_committed_len, last_token)
    return handled


def install_streaming_session_commit(target: str):
    hook(target, commit_all_but_the_last_token, "AROUND")
