"""The verify step against the expert-parallel all-to-all's dispatch buffer, checked at start-up.

With ``--moe-a2a-backend`` an all-to-all backend, every MoE layer of a decode or verify forward sends one rank's tokens
through a buffer sized in tokens per rank (``SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK``, 128 by default for
DeepEP's low-latency mode). A verify forward carries ``requests x window`` tokens on a rank: a DFLASH tree of budget
16 verifies 17 tokens a request, so about 7 requests fill DeepEP's default buffer, and the first batch past it fails
the dispatch's assertion inside a serving scheduler. SGLang checks this itself for ``deepep_v2`` and FlashInfer's
all-to-all (with the speculative tokens per request); the backends below have no such check, so the plugin refuses
the start-up with both numbers and the fix.

The requests on one rank are counted as SGLang counts them for ``deepep_v2``: the decode CUDA graph's largest batch,
at most the rank's share of ``--max-running-requests``; with decode graphs off, that share alone.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from sglang_kimi.errors import SpeculativeConfigError

logger = logging.getLogger("sglang_kimi")


@dataclass(frozen=True)
class DispatchBuffer:
    variable: str  # the environment variable sizing the buffer, in tokens per rank
    default: int  # SGLang's default when the variable is unset
    limit: int | None  # the most the backend accepts (its kernels' bound), or None


# ``--moe-a2a-backend`` -> its decode dispatch buffer (SGLang 0.5.23's token dispatchers)
DISPATCH_BUFFERS = {
    "deepep": DispatchBuffer("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128, 1024),
    "mooncake": DispatchBuffer("SGLANG_MOONCAKE_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128, 1024),
    "nixl": DispatchBuffer("SGLANG_NIXL_EP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128, 1024),
    "pplx": DispatchBuffer("SGLANG_PPLX_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128, None),
    "mori": DispatchBuffer("SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 4096, None),
}
CHECKED_BY_SGLANG = ("deepep_v2", "flashinfer")  # SGLang counts the speculative tokens for these itself


@dataclass(frozen=True)
class VerifyTokens:
    """The largest verify forward on one rank."""

    requests: int  # requests in it
    per_request: int  # tokens each request verifies (the window)
    requests_from: str  # which setting bounds ``requests``, as a flag

    @property
    def total(self) -> int:
        return self.requests * self.per_request


def buffer_tokens(buffer: DispatchBuffer) -> int:
    """The buffer's size on this launch: the variable as SGLang reads it, else SGLang's default."""
    value = os.environ.get(buffer.variable)
    if value is None or not value.strip():
        return buffer.default
    try:
        return int(value)
    except ValueError:
        raise SpeculativeConfigError(f"{buffer.variable}={value!r} is not a whole number of tokens") from None


def verify_tokens_per_rank(cfg, window: int) -> VerifyTokens | None:
    """Requests x ``window`` of the largest verify on one rank (``cfg``: SGLang's resolved view); None when the
    largest batch is known only after the KV pool is sized (decode graphs off and no --max-running-requests)."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    attn_dp = max(1, int(getattr(cfg, "attn_dp_size", 1) or 1))
    running = cfg.max_running_requests
    rank_share = max(1, int(running) // attn_dp) if running is not None else None
    graphs = cfg.cuda_graph_config
    if graphs is not None and graphs.decode.backend != Backend.DISABLED and graphs.decode.max_bs:
        requests, source = int(graphs.decode.max_bs), "--cuda-graph-max-bs-decode"
        if rank_share is not None and rank_share < requests:
            requests, source = rank_share, "--max-running-requests"
    elif rank_share is not None:
        requests, source = rank_share, "--max-running-requests"
    else:
        return None
    return VerifyTokens(requests, window, source)


def check_dispatch_capacity(cfg, window: int, window_from: str) -> None:
    """Refuse a verify forward larger than the all-to-all backend's dispatch buffer (``window``: the tokens a request
    verifies, ``window_from``: the setting it comes from)."""
    backend = str(getattr(cfg, "moe_a2a_backend", None) or "none")
    buffer = DISPATCH_BUFFERS.get(backend)
    if buffer is None:
        return
    if backend == "deepep" and getattr(cfg, "deepep_mode", "auto") == "normal":
        return  # normal dispatch has no per-rank token cap (SGLang turns decode graphs off for it)
    capacity = buffer_tokens(buffer)
    if buffer.limit is not None and capacity > buffer.limit:
        raise SpeculativeConfigError(
            f"{buffer.variable}={capacity}, but --moe-a2a-backend {backend} takes at most {buffer.limit} tokens a "
            f"rank (its kernels' bound; the dispatcher would refuse it while the model loads): set it to at most "
            f"{buffer.limit}"
        )
    verify = verify_tokens_per_rank(cfg, window)
    if verify is None:
        logger.warning(
            "sglang-kimi: --moe-a2a-backend %s dispatches at most %s=%d tokens a rank, and a verify forward carries "
            "%d tokens a request (%s); the largest batch is known only after the KV pool is sized: set "
            "--max-running-requests to at most %d a DP rank to have it checked here",
            backend, buffer.variable, capacity, window, window_from, max(1, capacity // window),
        )  # fmt: skip
        return
    if verify.total <= capacity:
        return
    fits = capacity // window
    fixes = [f"lower {verify.requests_from} to {fits}"] if fits >= 1 else []
    if buffer.limit is None or verify.total <= buffer.limit:
        fixes.append(f"set {buffer.variable}={verify.total} (more buffer memory on every rank)")
    fixes.append(f"verify fewer tokens a request ({window_from})")
    ceiling = "" if buffer.limit is None else f"; {backend} takes at most {buffer.limit} there"
    raise SpeculativeConfigError(
        f"--moe-a2a-backend {backend} dispatches at most {capacity} tokens a rank ({buffer.variable}{ceiling}), but "
        f"a verify forward sends up to {verify.total} on one rank: {verify.requests} requests "
        f"({verify.requests_from}) x {window} tokens each ({window_from}), and the first batch past {capacity} "
        f"tokens would end the server: {', or '.join(fixes)}"
    )
