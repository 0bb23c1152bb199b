"""Starting the adaptive runtime in a scheduler process, for the plugin's DFLASH worker and for SGLang's EAGLE
worker: the profile key of this setup, the start-up cost profile (or the saved one), the policy and its runtime.

Also the one dummy forward both profiles time: the target's verify over ``window`` tokens per request, on dummy
inputs before any request arrives (like SGLang's CUDA-graph capture: request row 0, KV writes to the reserved
padding slot 0). It runs eagerly on a GPU too; see ``docs/adaptive.md`` for what that means for the costs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.runtime_context import get_parallel
from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info

from sglang_kimi.platform.capabilities import device_name
from sglang_kimi.speculative.adaptive.config import AdaptiveConfig, AdaptiveConfigError, default_buckets, width_policy
from sglang_kimi.speculative.adaptive.profile import (
    StepCostsError,
    config_digest,
    file_digest,
    fitting_step_costs,
    load_or_measure,
    step_costs_table,
    write_profile,
)
from sglang_kimi.speculative.adaptive.runtime import AdaptiveRuntime, set_current
from sglang_kimi.speculators.policy import CostTable

logger = logging.getLogger("sglang_kimi")

PROFILE_CONTEXT = 64  # committed tokens each dummy request attends to while profiling


def profile_key(server_args, runner, device, mode: str, block: int, widths, buckets) -> dict:
    """What a cost profile is valid for (``speculative/adaptive/profile.py``)."""
    sa = server_args
    return {
        "device": device_name(device),
        "model": sa.model_path,
        "model_config": config_digest(sa.model_path),
        "drafter": sa.speculative_draft_model_path,
        "drafter_config": config_digest(sa.speculative_draft_model_path),
        "tp_size": int(sa.tp_size),
        "dtype": str(runner.dtype),
        "attention_backend": str(sa.attention_backend),
        "mode": mode,
        "block": int(block),
        "widths": list(widths),
        "buckets": list(buckets),
    }


def start_runtime(
    worker,
    label: str,
    acceptance_for: Callable[[Sequence[int]], object],
    config: AdaptiveConfig,
    widths: Sequence[int],
    key_fields: tuple[str, int],
    step_seconds: Callable[[int, int], float],
    extra_key: dict | None = None,
) -> AdaptiveRuntime:
    """The batch buckets (the configured ones, else powers of two up to the server's max running requests), the
    profile (read or measured: tensor-parallel ranks measure together, rank 0 reads and writes the file), the
    policy over it, and the runtime this process reports in ``/server_info``. ``acceptance_for(widths)``: the
    acceptance estimate; ``key_fields``: (mode, block) of the profile key; ``step_seconds(batch, width)``: one
    profiled step."""
    from sglang_kimi.settings import plugin_args

    server_args, device = worker.server_args, worker.device
    runner = worker.target_worker.model_runner
    max_requests = getattr(runner, "max_running_requests", None) or server_args.max_running_requests
    buckets = config.buckets or default_buckets(max_requests or runner.req_to_token_pool.size)
    mode, block = key_fields
    key = profile_key(server_args, runner, device, mode, block, widths, buckets) | (extra_key or {})
    given = None
    if config.step_costs:  # a measured or projected t(B, w) table instead of the start-up profile
        given = given_step_costs(config.step_costs, server_args, runner, device, mode, buckets, widths)
        key["step_costs"] = file_digest(config.step_costs)
    acceptance = acceptance_for(widths)

    tp = get_parallel().tp_group
    share = (lambda value: tp.broadcast_object(value, src=0)) if tp.world_size > 1 else None
    writer = int(tp.rank_in_group) == 0
    saved, file, measured = load_or_measure(
        plugin_args(server_args).adaptive_profile,
        key,
        buckets,
        widths,
        step_seconds,
        share=share,
        writer=writer,
        given=given,
    )
    costs = CostTable(decay=config.cost_decay)
    for bucket, row in saved.table.items():
        for width, seconds in row.items():
            costs.set(bucket, width, seconds)
    for bucket, row in saved.measured.items():  # what the real steps of an earlier server measured
        for width, (seconds, steps) in row.items():
            if bucket in buckets and width in widths:
                costs.restore(bucket, width, seconds, steps)
    policy = width_policy(config, widths, buckets, acceptance, costs)
    runtime = AdaptiveRuntime(
        policy,
        label,
        device,
        prometheus=bool(server_args.enable_metrics),
        sync=share,
        profile={
            "file": str(file),
            "measured_at_start": measured,
            "restored_cells": sum(len(row) for row in saved.measured.values()),
            "step_costs": config.step_costs,
            "key": key,
        },
        save=(lambda cells: write_profile(file, key, saved.table, cells, created=saved.created)) if writer else None,
    )
    set_current(runtime)
    logger.info(
        "sglang-kimi adaptive %s: widths %s, batch buckets %s, explore 1/%d steps, hysteresis %.0f%%",
        label,
        list(widths),
        list(buckets),
        config.explore_every,
        100 * config.hysteresis,
    )
    return runtime


def given_step_costs(path: str, server_args, runner, device, mode: str, buckets, widths):
    """The start-up profile a step-costs table gives this server; AdaptiveConfigError naming every difference when
    it was made for another device, TP, rank shape or mode, or does not span the buckets and widths."""
    from sglang_kimi.speculators.configs import load_config_dict

    model = server_args.model_path
    model_config = load_config_dict(model) if Path(model).is_dir() else runner.model_config.hf_config.to_dict()
    try:
        costs = fitting_step_costs(
            path,
            model_config=model_config,
            tp=int(server_args.tp_size),
            ep=int(getattr(server_args, "ep_size", 1) or 1),
            moe_a2a_backend=getattr(server_args, "moe_a2a_backend", None),
            mode=mode,
            device=device_name(device),
        )
        return step_costs_table(costs, mode, buckets, widths)
    except StepCostsError as e:
        raise AdaptiveConfigError(f"--speculative-kimi-adaptive-config: {e}") from e


def dummy_batch(runner, device, batch_size: int, extent: int):
    """Row 0 of the request table for every dummy request, each with a committed context of up to
    ``PROFILE_CONTEXT`` tokens leaving room for ``extent`` more. Returns (req_pool_indices, prefix [bs] on the
    device, prefix on the host)."""
    context = min(PROFILE_CONTEXT, runner.req_to_token_pool.req_to_token.shape[1] - extent - 1)
    req_pool_indices = torch.zeros(batch_size, dtype=torch.int64, device=device)  # [bs]
    prefix = torch.full((batch_size,), context, dtype=torch.int64, device=device)  # [bs]
    return req_pool_indices, prefix, torch.full((batch_size,), context, dtype=torch.int64)


def plan_dummy_window(runner, device, req_pool_indices, prefix, prefix_cpu, n: int):
    """A KV plan of ``n`` slots per dummy request, every write to the padding slot 0."""
    return runner.kv_index_translator.plan(
        req_pool_indices=req_pool_indices,
        seq_lens=prefix,
        seq_lens_cpu=prefix_cpu,
        write_virtual=torch.zeros(prefix.shape[0] * n, dtype=torch.int64, device=device),
        read_extent=n,
    )


def verify_forward(runner, device, req_pool_indices, prefix, prefix_cpu, window: int, algorithm) -> None:
    """One target verify forward over ``window`` tokens per dummy request (a causal window: the cost of a chain
    and of a tree of the same size differ only by the mask)."""
    bs = prefix.shape[0]
    host = prefix_cpu + window
    forward_batch = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=bs,
        input_ids=torch.zeros(bs * window, dtype=torch.int64, device=device),  # [bs * window]
        req_pool_indices=req_pool_indices,
        seq_lens=prefix,
        out_cache_loc=None,
        seq_lens_sum=int(host.sum()),
        seq_lens_cpu=host,
        positions=(prefix[:, None] + torch.arange(window, device=device)).reshape(-1),  # [bs * window]
        spec_algorithm=algorithm,
        spec_info=make_draft_block_spec_info(draft_token_num=window, device=device),
        capture_hidden_mode=CaptureHiddenMode.FULL,
        global_num_token_non_padded_cpu=bs * window,
        can_run_decode_cuda_graph=False,
    )
    plan = plan_dummy_window(runner, device, req_pool_indices, prefix, prefix_cpu, window)
    plan.bind(forward_batch, runner.kv_index_translator, cols=slice(0, window))
    runner.forward(forward_batch)


def fastest(step: Callable[[], None], repeats: int, device) -> float:
    """Seconds of ``step``: the fastest of ``repeats`` timed runs after one warm-up."""
    cuda = torch.device(device).type == "cuda"
    times = []
    for i in range(repeats + 1):
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize(device)
        if i:
            times.append(time.perf_counter() - start)
    return min(times)
