"""Adaptive DFLASH: the policy, its start-up cost profile and its runtime for :class:`DFlashTreeWorker`.

The profile times the two forwards a step of width w runs, on dummy inputs before any request arrives (like
SGLang's CUDA-graph capture: request row 0, KV writes to the reserved padding slot 0): the step's own draft
(``DFlashTreeWorker._draft_tree``: the drafter's block, its LM-head ranking and the chain or tree; w > 0 only),
and the target's verify over w + 1 tokens per request, for every batch bucket and width. The step's own timings
then refine the table online (``speculators/policy.py``).

On a GPU every verify width runs eagerly here (SGLang's verify CUDA graph is captured for the widest window only
and is skipped for a narrower one); per-width graphs, like SGLang's adaptive EAGLE tiers, are a separate runner per
width. The profile measures what actually runs, so the policy's costs stay honest either way.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.runtime_context import get_parallel
from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from sglang_kimi.adaptive.config import default_buckets, load_adaptive_config
from sglang_kimi.adaptive.profile import config_digest, device_name, load_or_measure
from sglang_kimi.adaptive.runtime import AdaptiveRuntime, set_current
from sglang_kimi.speculators.policy import ChainAcceptance, CostTable, TreeAcceptance, WidthPolicy

logger = logging.getLogger("sglang_kimi")

PROFILE_CONTEXT = 64  # committed tokens each dummy request attends to while profiling


def start_adaptive(worker, args) -> AdaptiveRuntime:
    config = load_adaptive_config(args.adaptive_config)  # checked at start-up already; re-read in this process
    widths = tuple(args.adaptive_widths)
    runner = worker.target_worker.model_runner
    max_requests = getattr(runner, "max_running_requests", None) or worker.server_args.max_running_requests
    buckets = config.buckets or default_buckets(max_requests or runner.req_to_token_pool.size)
    chain = worker.tree_budget is None
    acceptance = (
        ChainAcceptance(max(widths), decay=config.acceptance_decay)
        if chain
        else TreeAcceptance(widths, decay=config.acceptance_decay)
    )
    costs = CostTable(decay=config.cost_decay)
    sa = worker.server_args
    tp = get_parallel().tp_group
    key = {
        "device": device_name(worker.device),
        "model": sa.model_path,
        "model_config": config_digest(sa.model_path),
        "drafter": sa.speculative_draft_model_path,
        "drafter_config": config_digest(sa.speculative_draft_model_path),
        "tp_size": int(sa.tp_size),
        "dtype": str(runner.dtype),
        "attention_backend": str(sa.attention_backend),
        "mode": "chain" if chain else "tree",
        "block": int(worker.block_size),
        "widths": list(widths),
        "buckets": list(buckets),
    }
    share = (lambda value: tp.broadcast_object(value, src=0)) if tp.world_size > 1 else None
    table, file, measured = load_or_measure(
        args.adaptive_profile,
        key,
        buckets,
        widths,
        lambda b, w: profile_step(worker, b, w, config.profile_repeats),
        share=share,
        writer=int(tp.rank_in_group) == 0,
    )
    for bucket, row in table.items():
        for width, seconds in row.items():
            costs.set(bucket, width, seconds)
    policy = WidthPolicy(
        widths,
        buckets,
        acceptance,
        costs,
        initial_width=config.initial_width,
        explore_every=config.explore_every,
        hysteresis=config.hysteresis,
    )
    runtime = AdaptiveRuntime(
        policy,
        "DFLASH chain" if chain else "DFLASH tree",
        worker.device,
        prometheus=bool(sa.enable_metrics),
        sync=share,
        profile={"file": str(file), "measured_at_start": measured, "key": key},
    )
    set_current(runtime)
    logger.info(
        "sglang-kimi adaptive %s: widths %s, batch buckets %s, explore 1/%d steps, hysteresis %.0f%%",
        runtime.label,
        list(widths),
        list(buckets),
        config.explore_every,
        100 * config.hysteresis,
    )
    return runtime


@torch.inference_mode()
def profile_step(worker, batch_size: int, width: int, repeats: int) -> float:
    """Seconds of the forwards of one step of ``width`` for ``batch_size`` dummy requests (the fastest of
    ``repeats`` after one warm-up)."""
    runner = worker.target_worker.model_runner
    device = worker.device
    bs, window, block = batch_size, width + 1, worker.block_size
    context = min(PROFILE_CONTEXT, runner.req_to_token_pool.req_to_token.shape[1] - max(window, block) - 1)
    req_pool_indices = torch.zeros(bs, dtype=torch.int64, device=device)
    prefix = torch.full((bs,), context, dtype=torch.int64, device=device)
    prefix_cpu = torch.full((bs,), context, dtype=torch.int64)
    batch = SimpleNamespace(req_pool_indices=req_pool_indices, seq_lens=prefix)
    root = torch.zeros(bs, dtype=torch.int64, device=device)
    cuda = torch.device(device).type == "cuda"

    def plan(n):
        return runner.kv_index_translator.plan(
            req_pool_indices=req_pool_indices,
            seq_lens=prefix,
            seq_lens_cpu=prefix_cpu,
            write_virtual=torch.zeros(bs * n, dtype=torch.int64, device=device),  # the padding slot
            read_extent=n,
        )

    def one_step():
        if width > 0:
            worker._draft_tree(batch, root, prefix, prefix_cpu, plan(block), width)
        host = prefix_cpu + window
        forward_batch = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=torch.zeros(bs * window, dtype=torch.int64, device=device),
            req_pool_indices=req_pool_indices,
            seq_lens=prefix,
            out_cache_loc=None,
            seq_lens_sum=int(host.sum()),
            seq_lens_cpu=host,
            positions=(prefix[:, None] + torch.arange(window, device=device)).reshape(-1),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=make_draft_block_spec_info(draft_token_num=window, device=device),
            capture_hidden_mode=CaptureHiddenMode.FULL,
            global_num_token_non_padded_cpu=bs * window,
            can_run_decode_cuda_graph=False,
        )
        plan(window).bind(forward_batch, runner.kv_index_translator, cols=slice(0, window))
        runner.forward(forward_batch)

    times = []
    for i in range(repeats + 1):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        one_step()
        if cuda:
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return min(times)
