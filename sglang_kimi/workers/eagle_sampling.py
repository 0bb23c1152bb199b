"""Lossless sampled verification for EAGLE trees and DFLASH chains on ROCm and CPU.

Upstream (SGLang 0.5.23) verifies sampled requests with ``tree_speculative_sampling_target_only``, a CUDA kernel:

- ``eagle_utils.eagle_sample`` takes the greedy path whenever ``_verify_uses_greedy`` says so, which includes every
  CPU batch and every HIP batch without ``--speculative-use-rejection-sampling`` (that option is chain-only:
  ``topk == 1``). A sampled request with EAGLE ``topk > 1`` on ROCm or CPU is therefore committed by argmax: the
  output follows the target's mode, not its distribution.
- ``dflash_utils.is_dflash_sampling_verify_available()`` is False where the kernel is missing (HIP, CPU), and the
  DFLASH worker then verifies sampled requests greedily too ("falling back to greedy argmax verification").

On HIP and CPU this module routes those sampled batches to the plugin's tree verification
(``sglang_kimi.kernels.tree_verify``: the Triton kernel on the GPU, its torch twin ``tree_verify_ref`` on CPU), the
target-only rule: at node v draw y ~ p(.|v), descend if y is a drafted child, else emit y (SGLang's kernel rule with
thresholds 1; lossless for any tree). ``p`` is exactly what SGLang's non-speculative ``pytorch`` sampler (the
default sampler on both platforms) samples from (``tree_batch.verify_probs``), after the same logit processing
``eagle_sample`` applies (NaN sanitising, accumulated penalties, logit bias, grammar mask). Coins come from
``eagle_utils._verify_coins`` (torch's generator, or the per-request seeded hash under deterministic inference).

Greedy batches keep upstream's greedy path; CUDA, XPU and NPU keep upstream's code unchanged. With
``SGLANG_KIMI_DEBUG_GREEDY_VERIFY=1`` (debugging only) sampled batches are left to upstream too, i.e. verified greedily
on HIP and CPU: the switch that shows a sampling test can fail.
"""

from __future__ import annotations

import logging

import torch

from sglang_kimi.options import debug_greedy_verify
from sglang_kimi.workers.tree_batch import verify_probs

logger = logging.getLogger("sglang_kimi")

_warned: set[str] = set()


def _warn_once(key: str, message: str, *args) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def plugin_verifies_sampling() -> bool:
    """Whether this process needs the plugin's sampled verification (ROCm or CPU)."""
    from sglang.srt.utils import is_cpu, is_hip

    return is_cpu() or is_hip()


def verify_tree_sampled(
    candidates: torch.Tensor,  # [bs, N]
    retrieve_index: torch.Tensor,  # [bs, N]
    retrieve_next_token: torch.Tensor,  # [bs, N]
    retrieve_next_sibling: torch.Tensor,  # [bs, N]
    target_probs: torch.Tensor,  # [bs, N, V]
    coins: torch.Tensor,  # [bs, N]
    final_coins: torch.Tensor,  # [bs]
    num_spec_tokens: int,
    predicts: torch.Tensor,  # [bs * N] int32 (written)
    accept_index: torch.Tensor,  # [bs, num_spec_tokens] int32 (written)
    accept_token_num: torch.Tensor,  # [bs] int32 (written)
) -> None:
    """The plugin's target-only tree verification: the Triton kernel on a GPU, the torch twin on CPU."""
    from sglang_kimi.kernels import tree_verify as tv

    verify = tv.tree_verify if candidates.is_cuda else tv.tree_verify_ref
    verify(
        candidates,
        retrieve_index,
        retrieve_next_token,
        retrieve_next_sibling,
        num_spec_tokens=num_spec_tokens,
        target_probs=target_probs,
        uniform_samples=coins,
        uniform_samples_for_final_sampling=final_coins,
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_token_num,
    )


def _thresholds_are_lossless() -> bool:
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    return spec.speculative_accept_threshold_single == 1.0 and spec.speculative_accept_threshold_acc == 1.0


def _broadcast_from_rank0(*tensors: torch.Tensor) -> None:
    """As ``eagle_sample``: every TP rank commits rank 0's tokens."""
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().attn_tp_group if is_dp_attention_enabled() else get_parallel().tp_group
    if group.world_size > 1:
        for t in tensors:
            group.broadcast(t, src=0)


def _eagle_batch_is_ours(batch, uno_target_max_top_k, watermark_state) -> bool:
    from sglang.srt.runtime_context import get_spec
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_LEN

    if not plugin_verifies_sampling() or batch.forward_mode.is_idle() or batch.sampling_info.is_all_greedy:
        return False
    if debug_greedy_verify():
        return False  # upstream's greedy verify on this device: the debug switch's purpose
    if get_spec().speculative_use_rejection_sampling or uno_target_max_top_k is not None or SIMULATE_ACC_LEN > 0:
        return False  # upstream's chain rejection sampler (lossless), UNO, or the acceptance simulator
    if watermark_state is not None and batch.sampling_info.has_watermark_candidates:
        _warn_once("watermark", "sglang-kimi: watermarked sampled requests keep SGLang's own speculative verify")
        return False
    if not _thresholds_are_lossless():
        _warn_once(
            "thresholds",
            "sglang-kimi: --speculative-accept-threshold-single/-acc != 1 keep SGLang's own verify (greedy on "
            "this device); the plugin's sampled verification is the lossless rule only",
        )
        return False
    return True


def eagle_sample_lossless(
    original,
    verify_input,
    batch,
    logits_output,
    grammar_mask=None,
    uno_target_max_top_k=None,
    *,
    watermark_state=None,
    watermark_full_mask=True,
):
    """AROUND ``eagle_utils.eagle_sample``: sampled batches on HIP/CPU are verified by the target-only rule over
    ``tree_batch.verify_probs``; everything else runs upstream. Returns ``(predict, accept_lens, accept_index)``
    in upstream's conventions (``accept_lens`` counts the bonus)."""
    if not _eagle_batch_is_ours(batch, uno_target_max_top_k, watermark_state):
        return original(
            verify_input,
            batch,
            logits_output,
            grammar_mask,
            uno_target_max_top_k,
            watermark_state=watermark_state,
            watermark_full_mask=watermark_full_mask,
        )
    from sglang.srt.sampling.penaltylib.repetition_penalty import (
        apply_scaling_penalties,
    )
    from sglang.srt.speculative.eagle_utils import _verify_coins
    from sglang.srt.utils.async_probe import sanitize_nan_logits

    device = batch.device
    bs = len(batch.seq_lens)
    n = verify_input.draft_token_num
    sampling_info = batch.sampling_info
    logits = logits_output.next_token_logits  # [bs * N, V], processed in place as upstream does

    # The logit processing of eagle_sample, step for step.
    sanitize_nan_logits(logits, "verify: target model logits")
    if sampling_info.acc_additive_penalties is not None:
        logits.add_(torch.repeat_interleave(sampling_info.acc_additive_penalties, n, dim=0))
    if sampling_info.acc_scaling_penalties is not None:
        apply_scaling_penalties(logits, torch.repeat_interleave(sampling_info.acc_scaling_penalties, n, dim=0))
    if sampling_info.logit_bias is not None:
        logits.add_(torch.repeat_interleave(sampling_info.logit_bias, n, dim=0))
    if grammar_mask is not None:
        grammar_mask.apply(logits)

    candidates = verify_input.draft_token.reshape(bs, n)
    predict = torch.zeros(bs * n, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, verify_input.max_tree_depth), -1, dtype=torch.int32, device=device)
    num_correct_drafts = torch.empty((bs,), dtype=torch.int32, device=device)
    coins, final_coins = _verify_coins(
        sampling_info=sampling_info, seq_lens=batch.seq_lens, draft_token_num=n, candidates=candidates, device=device
    )
    verify_tree_sampled(
        candidates,
        verify_input.retrieve_index,
        verify_input.retrieve_next_token,
        verify_input.retrieve_next_sibling,
        verify_probs(logits, sampling_info, n).view(bs, n, -1),
        coins,
        final_coins,
        verify_input.max_tree_depth,
        predict,
        accept_index,
        num_correct_drafts,
    )
    _broadcast_from_rank0(predict, accept_index, num_correct_drafts)
    return predict, num_correct_drafts + 1, accept_index


def install_eagle_sampling(target: str):
    """``eagle_sample`` verifies sampled EAGLE trees greedily on ROCm (without rejection sampling) and CPU:
    route them to the lossless target-only rule."""
    from sglang_kimi.hooks import hook

    hook(target, eagle_sample_lossless, "AROUND")


def dflash_sampling_available(original) -> bool:
    """AROUND ``dflash_utils.is_dflash_sampling_verify_available``: True on HIP/CPU, where the plugin verifies
    (with the lossless thresholds; other thresholds keep upstream's greedy fallback and its warning)."""
    if plugin_verifies_sampling() and _thresholds_are_lossless() and not debug_greedy_verify():
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
    """AROUND ``dflash_utils.compute_dflash_sampling_correct_drafts_and_bonus``: on HIP/CPU verify the chain with
    the target-only rule over ``tree_batch.verify_probs``. Returns ``(accepted drafts [bs], bonus [bs] int64)``
    as upstream."""
    kwargs = dict(
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
    from sglang.srt.speculative import dflash_utils

    if dflash_utils._DFLASH_SAMPLING_VERIFY_AVAILABLE or not plugin_verifies_sampling():
        return original(**kwargs)
    lossless = (threshold_single in (None, 1.0)) and (threshold_acc in (None, 1.0)) and _thresholds_are_lossless()
    if not lossless:
        raise ValueError(
            "sglang-kimi verifies sampled DFLASH requests on this device with the lossless rule only: "
            "--speculative-accept-threshold-single and --speculative-accept-threshold-acc must be 1"
        )
    bs, n = candidates.shape
    device = next_token_logits.device
    coins = (
        torch.rand((bs, n), dtype=torch.float32, device=device)
        if uniform_samples is None
        else uniform_samples.to(device=device, dtype=torch.float32)
    )
    final_coins = (
        torch.rand((bs,), dtype=torch.float32, device=device)
        if uniform_samples_for_final_sampling is None
        else uniform_samples_for_final_sampling.to(device=device, dtype=torch.float32)
    )
    # A chain as a tree: node i's only child is node i + 1 ([a, b, c] -> next_token [1, 2, -1]).
    nodes = torch.arange(n, device=device)
    retrieve_index = (torch.arange(bs, device=device)[:, None] * n + nodes).contiguous()
    next_token = torch.where(nodes + 1 < n, nodes + 1, -1).expand(bs, n).contiguous()
    next_sibling = torch.full((bs, n), -1, dtype=torch.long, device=device)
    predicts = torch.zeros(bs * n, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, n), -1, dtype=torch.int32, device=device)
    accept_token_num = torch.zeros((bs,), dtype=torch.int32, device=device)
    verify_tree_sampled(
        candidates.to(torch.int64),
        retrieve_index,
        next_token,
        next_sibling,
        verify_probs(next_token_logits, sampling_info, n).view(bs, n, -1),
        coins,
        final_coins,
        n,
        predicts,
        accept_index,
        accept_token_num,
    )
    rows = torch.arange(bs, device=device)
    bonus = predicts[accept_index[rows, accept_token_num.long()].long()].to(torch.int64)
    return accept_token_num, bonus


def install_dflash_sampling(target: str):
    """DFLASH verifies sampled requests greedily where ``tree_speculative_sampling_target_only`` is missing (HIP,
    CPU): verify the chain with the lossless target-only rule there."""
    from sglang_kimi.hooks import hook

    hook(target, dflash_sampled_verify, "AROUND")


def install_dflash_sampling_available(target: str):
    """See :func:`dflash_sampling_available`."""
    from sglang_kimi.hooks import hook

    hook(target, dflash_sampling_available, "AROUND")
