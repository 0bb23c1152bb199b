"""What SGLang's CUDA path needs from packages a machine without ``sgl_kernel`` also lacks, replaced by torch or by
SGLang's own Triton twins, on such a machine only (``plugin.py``'s ``CUDA_STAND_IN`` entries):

- ops SGLang compiles at run time (``sglang.kernels.jit``) with no fallback: the fused MoE's activation, EAGLE's
  tree build and greedy tree verify, the router's small GEMM;
- FlashInfer's top-k / top-p renormalisation, which the DFLASH worker runs at start-up;
- the CuTe DSL dual GEMM, which SGLang's Llama MLP (the EAGLE3 drafter's) imports at construction;
- the unquantised MoE's native torch loop, which ``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` selects and no CUDA graph
  can capture: SGLang's Triton fused MoE instead.

Other JIT ops on that path either fall back by themselves when they cannot be built (the KV store's
``can_use_store_cache``) or sit behind SGLang's fused ops, which ``SGLANG_FORCE_FUSED_OP_BACKEND=torch`` puts on
their torch implementation.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from sglang_kimi.hooks import hook


def silu_and_mul(
    input: torch.Tensor,  # [num_rows, 2 * d]: gate then up
    out: torch.Tensor | None = None,  # [num_rows, d] (written)
    expert_ids: torch.Tensor | None = None,
    expert_step: int = 1,
    *,
    sorted_token_ids: torch.Tensor | None = None,
    num_tokens_post_padded: torch.Tensor | None = None,
    num_valid_tokens: int = 0,
) -> torch.Tensor:
    """``silu(gate) * up`` in the input's dtype (SGLang's ``sglang.kernels.ops.activation.activation.silu_and_mul``).

    The JIT kernel's row filters (``expert_ids``, ``sorted_token_ids``) only skip rows that the fused MoE never
    reads (blocks of filtered experts, padding), so every row is computed here.
    """
    d = input.shape[-1] // 2
    if out is None:
        out = input.new_empty(*input.shape[:-1], d)
    gate, up = input[..., :d], input[..., d:]
    out.copy_(F.silu(gate.float()).mul_(up.float()))
    return out


def install_silu_and_mul(target: str):
    hook(target, silu_and_mul, "REPLACE")


def _build_tree_kernel_efficient(
    parent_list,
    selected_index,
    verified_seq_len,
    tree_mask,
    positions,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    topk,
    depth,
    draft_token_num,
    tree_mask_mode,
):
    from sglang.kernels.ops.speculative.spec_tree import TreeMaskMode, sgl_build_tree_kernel_triton

    sgl_build_tree_kernel_triton(
        parent_list,
        selected_index,
        verified_seq_len,
        tree_mask,
        positions,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        topk,
        depth,
        draft_token_num,
        TreeMaskMode(tree_mask_mode),
    )


def install_tree_build(target: str):
    """EAGLE's draft-tree build: SGLang's Triton version (the one it runs on XPU) for the JIT CUDA kernel."""
    hook(target, _build_tree_kernel_efficient, "REPLACE")


def _verify_tree_greedy(
    predicts,
    accept_index,
    accept_token_num,
    candidates,
    retrive_index,
    retrive_next_token,
    retrive_next_sibling,
    target_predict,
):
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    verify_tree_greedy_triton(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        target_predict,
    )


def install_tree_verify(target: str):
    """EAGLE's greedy tree verify: SGLang's Triton version for the JIT CUDA kernel (same keyword names)."""
    hook(target, _verify_tree_greedy, "REPLACE")


def moe_on_triton(self, layer, dispatch_output):
    """The unquantised MoE's CUDA path (SGLang's Triton fused MoE) where the forced torch backend would run the native
    loop, whose host copy of the per-expert token counts no CUDA graph can capture."""
    return self.forward_cuda(layer, dispatch_output)


def install_moe_on_triton(target: str):
    hook(target, moe_on_triton, "REPLACE")


def no_tiny_router_gemm(*, num_experts: int, hidden_size: int, weight_dtype: torch.dtype) -> int:
    """-1: the router's logits through ``F.linear``, SGLang's path for shapes its small JIT GEMM does not serve."""
    return -1


def install_no_tiny_router_gemm(target: str):
    hook(target, no_tiny_router_gemm, "REPLACE")


def top_k_renorm_prob(probs: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    """Each row's ``top_ks[i]`` largest probabilities (ties at the k-th kept), renormalised to sum to 1."""
    probs_sorted = probs.sort(dim=-1, descending=True).values  # [bs, vocab]
    k = top_ks.reshape(-1, 1).to(device=probs.device, dtype=torch.int64).clamp(1, probs.shape[-1])  # [bs, 1]
    kept = torch.where(probs >= probs_sorted.gather(1, k - 1), probs, 0.0)  # [bs, vocab]
    return kept / kept.sum(dim=-1, keepdim=True)


def top_p_renorm_prob(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    """SGLang's own torch top-p renormalisation (``sampler.top_p_normalize_probs_torch``)."""
    from sglang.srt.layers.sampler import top_p_normalize_probs_torch

    return top_p_normalize_probs_torch(probs, top_ps)


def install_renorm(top_k_target: str, top_p_target: str):
    """SGLang takes top-k / top-p renormalisation on CUDA from FlashInfer (a lazy import resolved at the first call,
    which SGLang's hooks cannot wrap); the DFLASH worker's two renormalisations run in torch instead."""
    from sglang_kimi.platform.capabilities import flashinfer_installed

    if flashinfer_installed():
        return "FlashInfer is installed"
    hook(top_k_target, top_k_renorm_prob, "REPLACE")
    hook(top_p_target, top_p_renorm_prob, "REPLACE")
    return None


def no_dual_gemm(self, gate_up_proj, hidden_size):
    """None: the MLP's gate/up and down projections as two GEMMs, SGLang's path where the fused kernel is absent."""
    return None


def install_no_dual_gemm(target: str):
    """SGLang's Llama MLP (the EAGLE3 drafter's) imports the CuTe DSL dual GEMM on every CUDA device."""
    if importlib.util.find_spec("cutlass") is not None:
        return "the CuTe DSL (cutlass) is installed"
    hook(target, no_dual_gemm, "REPLACE")
    return None
