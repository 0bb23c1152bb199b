"""Torch versions of the ``sgl_kernel`` ops SGLang 0.5.23's CUDA path calls when it serves a Kimi-architecture model
with ``--attention-backend triton --sampling-backend pytorch`` (served by the import shim on a CUDA device).

Each keeps the compiled op's signature and writes its outputs in place. None synchronises with the host, so each
can be captured in a CUDA graph as the compiled op is.

====================== ===================================================== ===========================================
op                     caller                                                what it computes
====================== ===================================================== ===========================================
utils.is_arch_support_pdl  ``layers/attention/triton_backend.py``            False: no programmatic dependent launch
moe_align_block_size   ``kernels/ops/moe`` (AOT backend of the MoE align)     tokens grouped by expert, block-padded
moe_sum_reduce         ``moe_runner/triton_utils/fused_moe.py`` (> 32 tokens) the top-k expert outputs summed, scaled
weak_ref_tensor        ``model_executor/runner_backend_utils``                the tensor itself (CUDA graph outputs)
====================== ===================================================== ===========================================
"""

from __future__ import annotations

import torch


def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch is a property of the compiled kernels; the Triton kernels these stand-ins feed
    are launched without it."""
    return False


def moe_align_block_size(
    topk_ids: torch.Tensor,  # [num_tokens, top_k] expert of each (token, slot); -1: filtered out
    num_experts: int,  # buckets: experts + 1 (bucket 0 holds the filtered slots, expert e is bucket e + 1)
    block_size: int,
    sorted_token_ids: torch.Tensor,  # [max_num_tokens_padded] int32 (written)
    experts_ids: torch.Tensor,  # [max_num_m_blocks] int32 (written)
    num_tokens_post_pad: torch.Tensor,  # [1] or [2] int32 (element 0 written)
    cumsum_buffer: torch.Tensor,  # [num_experts + 1] int32 (written: padded bucket offsets)
    pad_sorted_token_ids: bool = False,
    ignore_invalid_expert: bool = False,
) -> None:
    """Group the flattened (token, slot) indices by expert, each expert's group padded to a multiple of
    ``block_size``, for the fused-MoE Triton kernel (one expert per block of ``block_size`` rows).

    - ``sorted_token_ids``: the slot indices bucket after bucket, stable within a bucket; pad slots hold
      ``topk_ids.numel()`` (an index past the last slot, which the kernel masks);
    - ``experts_ids[b]``: the expert of block b (-1 for the filtered bucket and for blocks past the total);
    - ``num_tokens_post_pad[0]``: the padded total.
    """
    if ignore_invalid_expert:
        raise NotImplementedError(
            "moe_align_block_size(ignore_invalid_expert=True) has no torch version in sglang-kimi's sgl_kernel "
            "stand-in: install sgl_kernel for expert-parallel MoE"
        )
    device = topk_ids.device
    bucket = topk_ids.reshape(-1).to(torch.int64) + 1  # [numel]
    numel = bucket.numel()
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.scatter_add_(0, bucket, torch.ones_like(bucket))  # [num_experts]
    padded = (counts + block_size - 1) // block_size * block_size  # [num_experts]
    ends = torch.cumsum(padded, 0)  # [num_experts]
    order = torch.sort(bucket, stable=True).indices  # [numel] slots in bucket order
    sorted_bucket = bucket[order]  # [numel]
    first_of_bucket = torch.cumsum(counts, 0) - counts  # [num_experts] position of a bucket's first slot in order
    rank = torch.arange(numel, device=device) - first_of_bucket[sorted_bucket]  # [numel] rank within its bucket
    position = (ends - padded)[sorted_bucket] + rank  # [numel] output row of each slot
    sorted_token_ids.fill_(numel)
    sorted_token_ids.scatter_(0, position, order.to(sorted_token_ids.dtype))
    num_tokens_post_pad[:1].copy_(ends[-1:])
    cumsum_buffer[:1].zero_()
    cumsum_buffer[1 : num_experts + 1].copy_(ends)
    block_start = torch.arange(experts_ids.numel(), device=device) * block_size  # [max_num_m_blocks]
    block_bucket = torch.searchsorted(ends, block_start, right=True)  # [max_num_m_blocks]; num_experts past the end
    experts_ids.copy_(torch.where(block_bucket < num_experts, block_bucket - 1, -1))


def moe_sum_reduce(
    input: torch.Tensor,  # [num_tokens, top_k, hidden] each expert's output
    output: torch.Tensor,  # [num_tokens, hidden] (written)
    routed_scaling_factor: float,
) -> None:
    """``output = routed_scaling_factor * input.sum(1)``, summed in float32 as the compiled op does."""
    output.copy_(input.float().sum(dim=1).mul_(routed_scaling_factor))


def weak_ref_tensor(tensor):
    """The compiled op returns a tensor over the same memory that does not keep it alive, so that a CUDA graph's
    outputs do not pin its memory pool. The graph pool is kept for the server's lifetime anyway, so the tensor
    itself serves."""
    return tensor


OPS: dict = {
    "is_arch_support_pdl": is_arch_support_pdl,
    "moe_align_block_size": moe_align_block_size,
    "moe_sum_reduce": moe_sum_reduce,
    "weak_ref_tensor": weak_ref_tensor,
}
