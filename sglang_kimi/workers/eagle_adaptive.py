"""Adaptive EAGLE3 chains (topk 1): SGLang's own adaptive machinery, steered by the plugin's policy.

SGLang 0.5.23's ``EAGLEWorkerV2`` with ``--speculative-adaptive`` builds one runtime state per candidate step
count (draft, draft-extend and verify attention backends and CUDA graphs, ``AdaptiveController.init_states``) and
switches between them by pointer swaps, asking its policy ``get_steps_for_batch(batch_size)`` before each decode
step. Its own policy (``AdaptiveSpeculativeParams``) follows an EMA of the accept length and knows nothing of cost.
With ``--speculative-kimi-adaptive`` the plugin turns SGLang's adaptive mode on with the plugin's candidate steps
(``validation.py``) and, once the states exist, hands the controller :class:`EagleStepsPolicy`: the same
``WidthPolicy`` as DFLASH (width = steps = drafts per step, 0 = SGLang's trivial one-token verify), chain
acceptance by position, and a cost table by batch bucket and width.

Measurement: the start-up profile times the target's verify over steps + 1 tokens per request for every bucket and
width (the drafter's share is learned from the real steps: a cell's first real step replaces its profiled value,
and the cells not yet run are scaled by the bucket's real / profiled ratio, see ``speculators/policy.CostTable``);
each decode step is timed around ``forward_batch_generation`` and its accepted counts are read where SGLang's result
processing has them on the host (``metrics._record_step``, ``adaptive/runtime.record_tagged_step``).
"""

from __future__ import annotations

import logging

import torch

from sglang_kimi.adaptive.config import default_buckets, load_adaptive_config
from sglang_kimi.adaptive.eagle_policy import EagleStepsPolicy
from sglang_kimi.adaptive.runtime import AdaptiveRuntime, tag_step
from sglang_kimi.hooks import hook
from sglang_kimi.options import plugin_args
from sglang_kimi.speculators.policy import ChainAcceptance

logger = logging.getLogger("sglang_kimi")


def _worker_adaptive(worker) -> bool:
    return getattr(worker, "adaptive_controller", None) is not None and plugin_args(worker.server_args).adaptive


def start_eagle_adaptive(worker) -> AdaptiveRuntime:
    """Profile (or reuse the profile), build the policy, and hand it to SGLang's adaptive controller."""
    from sglang_kimi.workers.adaptive_start import profile_key, start_runtime  # the model runner's modules

    args = plugin_args(worker.server_args)
    config = load_adaptive_config(args.adaptive_config)  # checked at start-up already; re-read in this process
    controller = worker.adaptive_controller
    widths = tuple(sorted(args.adaptive_widths))
    if list(widths) != list(controller.candidate_steps):
        raise RuntimeError(
            f"sglang-kimi adaptive EAGLE3: SGLang built states for steps {controller.candidate_steps}, the plugin "
            f"resolved widths {list(widths)}; --speculative-adaptive-config must not be changed by another plugin"
        )
    runner = worker.target_worker.model_runner
    max_requests = getattr(runner, "max_running_requests", None) or worker.server_args.max_running_requests
    buckets = config.buckets or default_buckets(max_requests or runner.req_to_token_pool.size)
    key = profile_key(worker.server_args, runner, worker.device, "eagle3-chain", 0, widths, buckets)
    runtime = start_runtime(
        "EAGLE3 chain",
        ChainAcceptance(max(widths), decay=config.acceptance_decay),
        config,
        widths,
        buckets,
        key,
        lambda b, w: profile_verify(worker, b, w, config.profile_repeats),
        worker.server_args,
        worker.device,
    )
    previous = controller.params
    controller.params = EagleStepsPolicy(runtime, widths, getattr(previous, "_cuda_graph_bs", None))
    worker._sglang_kimi_adaptive = runtime
    return runtime


@torch.inference_mode()
def profile_verify(worker, batch_size: int, width: int, repeats: int) -> float:
    """Seconds of the target's verify over ``width`` + 1 tokens for ``batch_size`` dummy requests."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_kimi.workers.adaptive_start import dummy_batch, fastest, verify_forward

    runner = worker.target_worker.model_runner
    device = worker.device
    req_pool_indices, prefix, prefix_cpu = dummy_batch(runner, device, batch_size, width + 1)
    algorithm = SpeculativeAlgorithm.from_string("EAGLE3")
    return fastest(
        lambda: verify_forward(runner, device, req_pool_indices, prefix, prefix_cpu, width + 1, algorithm),
        repeats,
        device,
    )


def _after_init_cuda_graphs(result, worker, *args, **kwargs):
    """AFTER ``EAGLEWorkerV2.init_cuda_graphs``: SGLang has built every step's runtime state; start the policy."""
    if _worker_adaptive(worker) and getattr(worker, "_sglang_kimi_adaptive", None) is None:
        start_eagle_adaptive(worker)
    return result


def _timed_step(original, worker, batch, *args, **kwargs):
    """AROUND ``EAGLEWorkerV2.forward_batch_generation``: marks the decode step's start and end and tags its
    result with them, the batch size and the steps it ran (chosen inside, by ``get_steps_for_batch``)."""
    if not _worker_adaptive(worker) or batch.forward_mode.is_extend() or batch.is_extend_in_batch:
        return original(worker, batch, *args, **kwargs)
    runtime = getattr(worker, "_sglang_kimi_adaptive", None)
    if runtime is None:  # a scheduler that did not call init_cuda_graphs on the worker
        runtime = start_eagle_adaptive(worker)
    bs = int(batch.seq_lens.shape[0])
    start = runtime.start()
    result = original(worker, batch, *args, **kwargs)
    tag_step(result, runtime, start, bs, int(worker.speculative_num_steps))
    return result


def install_policy(target: str):
    hook(target, _after_init_cuda_graphs, "AFTER")


def install_step_timing(target: str):
    hook(target, _timed_step, "AROUND")
