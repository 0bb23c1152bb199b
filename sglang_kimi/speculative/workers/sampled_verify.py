"""Which sampled batches the plugin verifies itself, and what the EAGLE and DFLASH sampling hooks share.

Upstream (SGLang 0.5.23) verifies sampled requests with ``tree_speculative_sampling_target_only``, a CUDA kernel.
Where it is missing (ROCm, CPU) SGLang verifies sampled EAGLE trees and DFLASH chains greedily: the output follows
the target's mode, not its distribution. On CUDA SGLang compiles it at run time from FlashInfer's headers, so
without FlashInfer the first sampled verify (the DFLASH worker's start-up warm-up among them) ends the scheduler.
On those devices the plugin verifies them with the lossless target-only rule (``speculators.verify``), as long as
the acceptance thresholds are the lossless ones (1.0).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from sglang_kimi.platform.capabilities import flashinfer_installed


@functools.cache
def plugin_verifies_sampling() -> bool:
    """Whether this process needs the plugin's sampled verification: ROCm, CPU, or CUDA without FlashInfer."""
    from sglang.srt.utils import is_cpu, is_cuda, is_hip

    if is_cpu() or is_hip():
        return True
    return is_cuda() and not flashinfer_installed()


def thresholds_are_lossless() -> bool:
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    return spec.speculative_accept_threshold_single == 1.0 and spec.speculative_accept_threshold_acc == 1.0


def _verify_group():
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().attn_tp_group if is_dp_attention_enabled() else get_parallel().tp_group


def broadcast_from_rank0(*tensors: torch.Tensor) -> None:
    """As ``eagle_sample``: every TP rank commits rank 0's tokens."""
    group = _verify_group()
    if group.world_size > 1:
        for t in tensors:
            group.broadcast(t, src=0)


def sampled_result_from_rank0(result):
    """A sampled verify's ``VerifyResult`` as rank 0 drew it, on every TP rank (one broadcast of the packed int64
    fields). Each rank draws its own coins from its own generator; SGLang's DFLASH and EAGLE workers broadcast rank
    0's sampled acceptance for the same reason: ranks that commit different tokens hold different KV from then on."""
    group = _verify_group()
    if group.world_size == 1:
        return result
    nodes, tokens = result.accepted_nodes.shape[1], result.output_tokens.shape[1]
    packed = torch.cat(
        [result.accepted_nodes, result.output_tokens, result.num_accepted[:, None], result.bonus[:, None]], dim=1
    ).contiguous()  # [B, nodes + tokens + 2] int64
    group.broadcast(packed, src=0)
    return dataclasses.replace(
        result,
        accepted_nodes=packed[:, :nodes],
        output_tokens=packed[:, nodes : nodes + tokens],
        num_accepted=packed[:, nodes + tokens],
        bonus=packed[:, nodes + tokens + 1],
        window_order=None,  # this rank's own; commit_layout derives rank 0's from the accepted nodes
    )
