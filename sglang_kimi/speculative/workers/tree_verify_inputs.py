"""Tensors in SGLang's conventions for verifying a batch of draft trees (torch only, no SGLang import).

A tree verify runs the target once over every node of every request's tree (``TARGET_VERIFY``), with node i of
request b at position ``prefix_lens[b] + depth[b, i]`` and its KV row written to the i-th slot of the request's
verify window (``req_to_token[b, prefix : prefix + N]``); ``speculators/window.py`` commits the accepted path.
Here, for every plugin verification inside SGLang (DFLASH trees and chains, EAGLE trees): the attention mask in
SGLang's FULL_MASK layout, the target distribution from SGLang's sampling state (exactly what the non-speculative
sampler draws from) and the verification coins (seeded per request when SGLang carries sampling seeds). Torch only;
SGLang objects are read, never imported.
"""

from __future__ import annotations

import torch

from sglang_kimi.speculators.verify import TOP_K_ALL, Coins, process_logits, random_coins, seeded_coins

# SGLang's "no top-k" value in SamplingBatchInfo.top_ks.
SGLANG_TOP_K_ALL = 1 << 30


def write_tree_mask(buffer: torch.Tensor, ancestor_mask: torch.Tensor, prefix_lens: torch.Tensor) -> None:
    """A tree verify's attention mask, written in place into ``buffer`` in SGLang's FULL_MASK layout: only each
    request's N x N tree block.

    ancestor_mask bool [B, N, N] (node i sees node j iff j is i or an ancestor of i); prefix_lens [B]: the committed
    length of each request, the same tensor as the verify batch's ``seq_lens`` (SGLang's attention backends lay the
    mask out from it: request b's N rows of ``prefix + N`` cells start at ``N * sum(prefix_lens[:b] + N)``, the
    prefix's cells first); buffer: at least ``N * sum(prefix_lens + N)`` cells (:func:`tree_mask_capacity`), bool or
    uint8. Every prefix key is visible to every node, and the kernels that read this layout take them so without
    reading their cells (SGLang's Triton verify kernels: ``skip_prefix_custom_mask``; the ``kimi_cpu`` backend):
    the prefix cells and everything past the last request's rows are neither written nor read, so the buffer is
    never cleared or copied whole. Under SGLang's overlap scheduler the host does not know the exact lengths, so
    the layout comes from the device tensor and nothing here waits for the device.

    Example: one request, prefix 2, tree root -> a: cells 2, 3 of row 0 and 6, 7 of row 1 get [1, 0], [1, 1].
    """
    batch, n, _ = ancestor_mask.shape
    device = ancestor_mask.device
    prefix = prefix_lens.to(device=device, dtype=torch.long)[:, None]  # [B, 1]
    # Cell (b, i, j) = start_b + prefix_b + i * (prefix_b + N) + j, where start_b = N * sum_{c < b} (prefix_c + N)
    # = N * (cumsum_b - prefix_b) + N * N * b; regrouped: N * cumsum_b + prefix_b * (1 - N + i), plus N*N*b + N*i + j,
    # which is the flat index of (b, i, j) in a [B, N, N] block.
    row_starts = torch.add(prefix * torch.arange(1 - n, 1, device=device), prefix.cumsum(0), alpha=n)  # [B, N]
    block_cells = torch.arange(batch * n * n, device=device).view(batch, n, n)  # [B, N, N]
    tree_cells = row_starts[:, :, None] + block_cells  # [B, N, N]
    buffer[tree_cells.view(-1)] = ancestor_mask.reshape(-1).to(buffer.dtype)


def tree_mask_capacity(host_sum: int, batch: int, window: int, context_len: int) -> int:
    """The length of a tree verify's FULL_MASK buffer: ``window * sum(prefix + window)`` over the batch, from the
    host's upper bound of the committed lengths (``host_sum``: their sum over the ``batch`` requests), and never more
    than a batch of full contexts, ``batch * window * (context_len + window)``: the bound can run past the context
    near its end, and SGLang sizes its graph-replay mask buffer (per request ``window * (context_len + window)``) by
    the latter."""
    from_bound = window * (int(host_sum) + batch * window)
    return min(from_bound, batch * window * (int(context_len) + window))


def requests_max_top_k(reqs) -> int | None:
    """The largest top-k of a batch's requests when every one has a top-k (greedy ones: 1), else None: read on the
    host from the requests' sampling parameters."""
    top_ks = [getattr(getattr(req, "sampling_params", None), "top_k", None) for req in reqs or ()]
    if not top_ks or any(k is None or not 0 < k < SGLANG_TOP_K_ALL for k in top_ks):
        return None
    return max(top_ks)


def verify_probs(
    logits: torch.Tensor, sampling_info, tokens_per_request: int, max_top_k: int | None = None
) -> torch.Tensor:
    """The target distribution at every verify row, as the non-speculative sampler would draw from it.

    logits [B*N, V] (after SGLang's logit adjustments: penalties, bias, grammar); ``sampling_info``:
    SGLang's ``SamplingBatchInfo`` (per-request temperatures [B, 1], top_ks, top_ps, min_ps [B]). Greedy requests
    (SGLang encodes them as top_k = 1) get a one-hot at the argmax. ``max_top_k``: every request's top-k is at most
    this (:func:`requests_max_top_k`); with it, and where the sampling info says no request filters at all, the
    vocabulary is not sorted (``process_logits``). Returns float32 [B*N, V].
    """

    def per_row(values: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(values.reshape(-1), tokens_per_request, dim=0)

    top_k = per_row(sampling_info.top_ks).long()
    top_k = torch.where(top_k >= SGLANG_TOP_K_ALL, TOP_K_ALL, top_k)
    min_p = per_row(sampling_info.min_ps) if sampling_info.need_min_p_sampling else 0.0
    # SGLang's own flags (host, over the batch's requests), which its non-speculative sampler filters by
    filtered = any(
        getattr(sampling_info, flag, True)
        for flag in ("need_top_k_sampling", "need_top_p_sampling", "need_min_p_sampling")
    )
    return process_logits(
        logits,
        per_row(sampling_info.temperatures),
        top_k,
        per_row(sampling_info.top_ps),
        min_p,
        filtered=filtered,
        max_top_k=max_top_k,
    )


def verify_coins(sampling_info, offsets: torch.Tensor, batch: int, num_slots: int) -> Coins:
    """The coins of one verify step: from each request's sampling seed and committed length (``offsets`` [B]) when
    SGLang carries per-request seeds (``SamplingBatchInfo.sampling_seed``, set under
    ``--enable-deterministic-inference``), so a seeded request draws the same coins whatever shares its batch;
    otherwise from torch's generator, as SGLang's own verify does."""
    seeds = getattr(sampling_info, "sampling_seed", None)
    if seeds is not None:
        return seeded_coins(seeds.view(-1), offsets.view(-1), num_slots)
    return random_coins(batch, num_slots, offsets.device)
