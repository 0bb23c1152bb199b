"""The output budget of a speculative request in the KV pool: what it can decode without running the pool dry alone.

When a request arrives, SGLang's scheduler (``Scheduler.init_req_max_new_tokens``) clips its ``max_new_tokens`` so
that its prompt and output fit the KV pool on their own: ``paged(prompt) + max_new_tokens + page_size`` below the
pool's token capacity. That budget counts one KV slot per decode step, which is what an autoregressive step takes.
A speculative decode step takes more: before each step SGLang reserves ``get_alloc_reserve_per_decode()`` slots past
the request's committed length (``2 x`` the draft tokens for DFLASH and EAGLE; the double buffer of the overlap
scheduler). A request whose prompt and output come within that reserve of the pool's capacity (a server whose
``--max-total-tokens`` or memory holds fewer tokens than its context length) then cannot take its next step even
with every other request retracted, and SGLang aborts it with HTTP 500 ("Out of memory even after retracting all
other requests"), its tokens so far lost. The autoregressive server answers the same request with HTTP 200, its
output ending with ``finish_reason`` ``length`` where the pool ends.

Here the budget of a speculative server counts the reserve:

    max_new_tokens <= capacity - paged(prompt) - page_size - reserve

so such a request ends with ``length`` too: its output is the autoregressive output up to where the reserve leaves
room, never a different token. At least one token is always allowed (the one the prefill computes, which needs no
decode step). Requests that fit with room to spare, the usual case, are not touched.
"""

from __future__ import annotations

from sglang_kimi.hooks import hook


def token_capacity(scheduler) -> int:
    """The tokens one request may hold in the pool, as SGLang's own clip counts them (KV sharded over
    ``kv_shard_widening`` ranks, or ``attn_dcp_size`` on releases before it, adds capacity)."""
    widening = getattr(scheduler, "kv_shard_widening", None)
    if widening is None:
        try:
            from sglang.srt.runtime_context import get_parallel

            widening = get_parallel().attn_dcp_size
        except Exception:
            widening = 1
    widening = max(1, int(widening or 1))
    return scheduler.max_total_num_tokens * widening - scheduler.page_size * (widening - 1)


def speculative_output_budget(capacity: int, input_len: int, page_size: int, reserve: int) -> int:
    """The most output tokens a lone request of ``input_len`` prompt tokens can decode speculatively."""
    paged_input = -(-input_len // page_size) * page_size
    return max(1, capacity - paged_input - page_size - reserve)


def _clip_after(result, scheduler, req, *args, **kwargs):
    """AFTER ``Scheduler.init_req_max_new_tokens(self, req)``."""
    if scheduler.spec_algorithm.is_none() or req.finished():
        return result
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode

    params = req.sampling_params
    budget = speculative_output_budget(
        token_capacity(scheduler), len(req.origin_input_ids), scheduler.page_size, get_alloc_reserve_per_decode()
    )
    if params.max_new_tokens is not None and params.max_new_tokens > budget:
        params.max_new_tokens = budget
        if params.min_new_tokens > budget:  # as SGLang restores it after its own clip
            params.min_new_tokens = budget
    return result


def install_speculative_output_budget(target: str):
    hook(target, _clip_after, "AFTER")
