"""The ``req_to_token`` row headroom of speculative servers: wide enough for the KV that a decode step reserves.

Each request owns one row of SGLang's ``req_to_token`` table, ``context_len + extra`` slots wide, with ``extra``
from ``allocation_sizing.get_req_to_token_extra_context_len``: ``4 + num_draft_tokens``, widened to the decode
reserve only for pages above 1 and for UNO. A speculative ``prepare_for_decode`` reserves
``2 x get_alloc_len_per_decode()`` slots past the committed length at every step (a double buffer for the overlap
scheduler), where the length per decode is the larger of ``steps x topk`` and the draft tokens. So a request that
decodes near the end of the context writes past its row whenever that reserve exceeds ``4 + num_draft_tokens``:
``index ... is out of bounds`` on CPU, a device-side assert on a GPU, and the scheduler dies.

- DFLASH: a reserve of ``2 x num_draft_tokens``. A chain of 8 draft tokens takes a request within a few tokens of the
  context length; in tree mode, where the verify window is ``budget + 1`` tokens (33 for budget 32), any request
  that reaches ~30 tokens short of the context does it (a long prompt with a large ``max_new_tokens``, or a chat
  request without ``max_tokens``).
- EAGLE trees: ``2 x steps x topk`` (24 for 3 steps of top-4 with 8 draft tokens, against a headroom of 12): a
  request without ``max_new_tokens`` ended the scheduler when it reached the end of the context.
- EAGLE chains, NGRAM and STANDALONE: ``2 x num_draft_tokens`` once the draft tokens exceed 4.

The row is widened for every speculative algorithm the way SGLang widens it for UNO: to the decode reserve plus the
page rounding. The extra slots are int32 indices per running request (a few hundred bytes each); the KV pool is
unchanged.
"""

from __future__ import annotations

from sglang_kimi.hooks import hook


def _extra_context_len(original, *args, **kwargs) -> int:
    extra = original(*args, **kwargs)
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_page_size, get_alloc_reserve_per_decode
    from sglang.srt.runtime_context import get_spec

    if get_spec().speculative_algorithm is None:
        return extra
    return max(extra, get_alloc_reserve_per_decode() + get_alloc_page_size() - 1)


def install_speculative_row_headroom(target: str):
    hook(target, _extra_context_len, "AROUND")
