"""Lossless sampled verification of DFLASH chains on ROCm, CPU and CUDA without FlashInfer (hooks on ``dflash_utils``).

Where ``tree_speculative_sampling_target_only`` is missing (HIP, CPU), ``is_dflash_sampling_verify_available()`` is
False and SGLang's DFLASH worker verifies sampled requests greedily ("falling back to greedy argmax verification").
On CUDA without FlashInfer the kernel cannot be built (``sampled_verify``). There the plugin reports sampled
verification as available and verifies the chain itself: the chain as a
``DraftTree`` through ``speculators.verify.verify_tree`` over ``tree_verify_inputs.verify_probs``, with SGLang's coins
when
it passes them and torch's generator otherwise (SGLang's DFLASH chain verify draws from torch's generator too: it has
no per-request seeds).
"""

from __future__ import annotations

import torch

from sglang_kimi.hooks import hook
from sglang_kimi.settings import debug_greedy_verify
from sglang_kimi.speculative.workers.sampled_verify import plugin_verifies_sampling, thresholds_are_lossless
from sglang_kimi.speculative.workers.tree_verify_inputs import verify_probs
from sglang_kimi.speculators.trees import build_chain
from sglang_kimi.speculators.verify import Coins, random_coins, verify_tree


def dflash_sampling_available(original) -> bool:
    """AROUND ``dflash_utils.is_dflash_sampling_verify_available``: True where the plugin verifies
    (with the lossless thresholds; other thresholds keep upstream's greedy fallback and its warning)."""
    if plugin_verifies_sampling() and thresholds_are_lossless() and not debug_greedy_verify():
        return True
    return original()


def dflash_sampled_verify(
    original,
    *,
    candidates: torch.Tensor,  # [bs, N]: the bonus, then N-1 drafted tokens
    next_token_logits: torch.Tensor,  # [bs * N, V]
    sampling_info,
    max_top_k=None,
    uniform_top_k_value=None,
    threshold_single=None,
    threshold_acc=None,
    uniform_samples=None,
    uniform_samples_for_final_sampling=None,
    use_sparse_topk: bool = True,
):
    """AROUND ``dflash_utils.compute_dflash_sampling_correct_drafts_and_bonus``: where the plugin verifies sampling
    (``plugin_verifies_sampling``) verify the chain with the target-only rule over ``tree_verify_inputs.verify_probs``.
    Returns ``(accepted drafts [bs], bonus [bs] int64)`` as upstream."""

    if not plugin_verifies_sampling():
        return original(
            candidates=candidates,
            next_token_logits=next_token_logits,
            sampling_info=sampling_info,
            max_top_k=max_top_k,
            uniform_top_k_value=uniform_top_k_value,
            threshold_single=threshold_single,
            threshold_acc=threshold_acc,
            uniform_samples=uniform_samples,
            uniform_samples_for_final_sampling=uniform_samples_for_final_sampling,
            use_sparse_topk=use_sparse_topk,
        )
    lossless = threshold_single in (None, 1.0) and threshold_acc in (None, 1.0) and thresholds_are_lossless()
    if not lossless:
        raise ValueError(
            "sglang-kimi verifies sampled DFLASH requests on this device with the lossless rule only: "
            "--speculative-accept-threshold-single and --speculative-accept-threshold-acc must be 1"
        )
    bs, n = candidates.shape
    device = next_token_logits.device
    if uniform_samples is not None and uniform_samples_for_final_sampling is not None:  # SGLang's (seeded) coins
        final = uniform_samples_for_final_sampling.to(device=device, dtype=torch.float32).reshape(bs, -1)
        coins = Coins(uniform_samples.to(device=device, dtype=torch.float32), final.expand(bs, n).contiguous())
    else:
        coins = random_coins(bs, n, device)
    chain = build_chain(candidates[:, 0], candidates[:, 1:])  # the bonus as the root, then the drafts
    probs = verify_probs(next_token_logits, sampling_info, n).view(bs, n, -1)  # [bs, N, V]
    result = verify_tree(chain, target_probs=probs, coins=coins)
    return result.num_accepted.to(torch.int32), result.bonus


def install_dflash_sampling(target: str):
    """DFLASH verifies sampled requests greedily where ``tree_speculative_sampling_target_only`` is missing (HIP,
    CPU): verify the chain with the lossless target-only rule there."""
    hook(target, dflash_sampled_verify, "AROUND")


def install_dflash_sampling_available(target: str):
    """See :func:`dflash_sampling_available`."""
    hook(target, dflash_sampling_available, "AROUND")
