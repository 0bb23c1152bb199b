"""Lossless sampled verification of EAGLE trees on ROCm and CPU (an AROUND hook on ``eagle_utils.eagle_sample``).

``eagle_sample`` takes the greedy path whenever ``_verify_uses_greedy`` says so, which includes every CPU batch and
every HIP batch without ``--speculative-use-rejection-sampling`` (that option is chain-only: ``topk == 1``). A sampled
request with EAGLE ``topk > 1`` on ROCm or CPU is therefore committed by argmax upstream. On those devices this hook
verifies the batch with ``speculators.verify.verify_tree`` (the Triton kernel on a GPU, the torch walk on CPU) over
exactly what SGLang's non-speculative ``pytorch`` sampler samples from (``tree_verify_inputs.verify_probs``), after the
same
logit processing ``eagle_sample`` applies (NaN sanitising, accumulated penalties, logit bias, grammar mask).

Greedy batches keep upstream's greedy path; CUDA (with FlashInfer, whose headers SGLang builds its sampling kernel
from: ``sampled_verify``), XPU and NPU keep upstream's code unchanged. With
``SGLANG_KIMI_DEBUG_GREEDY_VERIFY=1`` (debugging only) sampled batches are left to upstream too, i.e. verified
greedily on HIP and CPU: the switch that shows a sampling test can fail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from sglang_kimi.hooks import hook
from sglang_kimi.log import warn_once
from sglang_kimi.settings import debug_greedy_verify
from sglang_kimi.speculative.workers.custom_processors import apply_processors, has_processors
from sglang_kimi.speculative.workers.penalty_hooks import apply_to_eagle_verify, bias_applied
from sglang_kimi.speculative.workers.sampled_verify import (
    broadcast_from_rank0,
    plugin_verifies_sampling,
    thresholds_are_lossless,
)
from sglang_kimi.speculative.workers.tree_verify_inputs import requests_max_top_k, verify_coins, verify_probs
from sglang_kimi.speculators.trees import NO_NODE, DraftTree
from sglang_kimi.speculators.verify import verify_tree


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
        warn_once("watermark", "sglang-kimi: watermarked sampled requests keep SGLang's own speculative verify")
        return False
    if not thresholds_are_lossless():
        warn_once(
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
    ``tree_verify_inputs.verify_probs``; everything else runs upstream. Returns ``(predict, accept_lens, accept_index)``
    in upstream's conventions (``accept_lens`` counts the bonus). In a batch with penalties every node first gets
    its own (``speculative/workers/penalty_hooks.py``), and in a batch with custom logit processors each node's row is
    processed
    with the request seen at the node (``speculative/workers/custom_processors.py``), which ``eagle_sample`` does not
    do."""
    logits = logits_output.next_token_logits  # [bs * N, V], processed in place as upstream does
    trees = lambda: _eagle_trees(verify_input, len(batch.seq_lens))  # noqa: E731 - built only when needed
    with (
        apply_to_eagle_verify(batch, logits, trees) as tree,
        _processors_last(batch, logits, grammar_mask, tree, trees) as grammar_mask,
    ):
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
        return _verify_sampled(verify_input, batch, logits, grammar_mask, tree)


@contextlib.contextmanager
def _processors_last(batch, logits: torch.Tensor, grammar_mask, tree: DraftTree | None, trees) -> Iterator[object]:
    """In a batch with custom logit processors: the logit bias and the grammar mask applied now and the processors
    after them, per node, as the non-speculative sampler orders them; yields the grammar mask left for the rest of
    ``eagle_sample`` (None then). ``tree``: the step's trees if the penalties built them, ``trees()`` builds them."""
    sampling_info = batch.sampling_info
    if not has_processors(sampling_info):
        yield grammar_mask
        return
    tree = tree if tree is not None else trees()
    with bias_applied(sampling_info, logits, tree.num_slots):
        if grammar_mask is not None:
            grammar_mask.apply(logits)
        apply_processors(logits, sampling_info, tree)
        yield None


def _eagle_trees(verify_input, bs: int) -> DraftTree:
    """The step's B trees, from SGLang's retrieve arrays (node 0 of each = its root; node i of request b scored by
    logits row b * N + i)."""
    n = verify_input.draft_token_num
    depth = verify_input.max_tree_depth - 1  # accept_index holds the root and up to `depth` accepted nodes
    tokens = verify_input.draft_token.reshape(bs, n)  # [bs, N]: node 0 = the root
    return DraftTree.from_retrieve(tokens, verify_input.retrieve_next_token, verify_input.retrieve_next_sibling, depth)


def _verify_sampled(verify_input, batch, logits: torch.Tensor, grammar_mask, tree: DraftTree | None):
    """The sampled batch verified by the target-only tree rule, after eagle_sample's logit processing; ``tree``:
    the step's trees when the penalties already built them."""
    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties
    from sglang.srt.utils.async_probe import sanitize_nan_logits

    device = batch.device
    bs = len(batch.seq_lens)
    n = verify_input.draft_token_num
    sampling_info = batch.sampling_info

    retrieve_index = verify_input.retrieve_index
    if not torch.equal(retrieve_index.reshape(-1), torch.arange(bs * n, device=retrieve_index.device)):
        raise RuntimeError("sglang-kimi: EAGLE's retrieve_index is not b * N + i; the sampled verify cannot map it")

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

    tree = tree if tree is not None else _eagle_trees(verify_input, bs)
    depth = tree.max_depth
    coins = verify_coins(sampling_info, batch.seq_lens, bs, n)
    max_top_k = requests_max_top_k(getattr(batch, "reqs", None))  # host: the selection then takes no full sort
    probs = verify_probs(logits, sampling_info, n, max_top_k).view(bs, n, -1)  # [bs, N, V]
    result = verify_tree(tree, target_probs=probs, coins=coins)

    predict = torch.zeros(bs * n, dtype=torch.int32, device=device)
    accept_index = torch.full((bs, depth + 1), NO_NODE, dtype=torch.int32, device=device)
    num_accepted = torch.empty((bs,), dtype=torch.int32, device=device)
    result.to_sglang(predict, accept_index, num_accepted)
    broadcast_from_rank0(predict, accept_index, num_accepted)
    return predict, num_accepted + 1, accept_index


def install_eagle_sampling(target: str):
    """``eagle_sample`` verifies sampled EAGLE trees greedily on ROCm (without rejection sampling) and CPU:
    route them to the lossless target-only rule."""
    from sglang_kimi.version import sglang_at_least

    # eagle_sample's keyword-only watermark_state / watermark_full_mask arrived in SGLang 0.5.22
    watermark = sglang_at_least((0, 5, 22))[0]
    hook(target, eagle_sample_lossless if watermark else _eagle_sample_lossless_pre_watermark, "AROUND")


def _eagle_sample_lossless_pre_watermark(
    original, verify_input, batch, logits_output, grammar_mask=None, uno_target_max_top_k=None
):
    """:func:`eagle_sample_lossless` for SGLang 0.5.20-0.5.21, whose ``eagle_sample`` has no watermark keywords."""
    return eagle_sample_lossless(
        lambda *args, **_watermark: original(*args),
        verify_input,
        batch,
        logits_output,
        grammar_mask,
        uno_target_max_top_k,
    )
