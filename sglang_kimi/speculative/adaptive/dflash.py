"""Adaptive DFLASH: the policy, its start-up cost profile and its runtime for :class:`DFlashTreeWorker`.

The profile times the two forwards a step of width w runs (``speculative/adaptive/start.py``): the step's own draft
(``DFlashTreeWorker._draft_tree``: the drafter's block, its LM-head ranking and the chain or tree; w > 0 only),
and the target's verify over w + 1 tokens per request, for every batch bucket and width. The step's own timings
then refine the table online (``speculators/policy.py``).

On a GPU every verify width runs eagerly here (SGLang's verify CUDA graph is captured for the widest window only
and is skipped for a narrower one); per-width graphs, like SGLang's adaptive EAGLE tiers, are a separate runner per
width. The profile measures what actually runs, so the policy's costs stay honest either way.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_kimi.speculative.adaptive.config import acceptance_estimate, load_adaptive_config
from sglang_kimi.speculative.adaptive.runtime import AdaptiveRuntime
from sglang_kimi.speculative.adaptive.start import (
    dummy_batch,
    fastest,
    plan_dummy_window,
    start_runtime,
    verify_forward,
)


def start_adaptive(worker, args) -> AdaptiveRuntime:
    config = load_adaptive_config(args.adaptive_config)  # checked at start-up already; re-read in this process
    chain = worker.tree_budget is None
    mode = "chain" if chain else "tree"
    return start_runtime(
        worker,
        f"DFLASH {mode}",
        lambda widths: acceptance_estimate(config, chain, widths),
        config,
        tuple(args.adaptive_widths),
        (mode, worker.block_size),
        lambda b, w: profile_step(worker, b, w, config.profile_repeats),
    )  # fmt: skip


@torch.inference_mode()
def profile_step(worker, batch_size: int, width: int, repeats: int) -> float:
    """Seconds of the forwards of one step of ``width`` for ``batch_size`` dummy requests (the fastest of
    ``repeats`` after one warm-up)."""
    runner = worker.target_worker.model_runner
    device = worker.device
    window, block = width + 1, worker.block_size
    req_pool_indices, prefix, prefix_cpu = dummy_batch(runner, device, batch_size, max(window, block))
    # a batch of the served shape: the drafter replays its graph where a served step would
    batch = SimpleNamespace(req_pool_indices=req_pool_indices, seq_lens=prefix, can_run_decode_cuda_graph=True)
    root = torch.zeros(batch_size, dtype=torch.int64, device=device)  # [bs]

    def one_step():
        if width > 0:
            plan = plan_dummy_window(runner, device, req_pool_indices, prefix, prefix_cpu, block)
            worker._draft_tree(batch, root, prefix, prefix_cpu, plan, width)
        verify_forward(runner, device, req_pool_indices, prefix, prefix_cpu, window, SpeculativeAlgorithm.DFLASH)

    return fastest(one_step, repeats, device)
