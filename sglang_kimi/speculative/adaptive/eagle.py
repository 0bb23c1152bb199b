"""Adaptive EAGLE3 chains (topk 1): SGLang's own adaptive machinery, steered by the plugin's policy.

SGLang 0.5.23's ``EAGLEWorkerV2`` with ``--speculative-adaptive`` builds one runtime state per candidate step
count (draft, draft-extend and verify attention backends and CUDA graphs, ``AdaptiveController.init_states``) and
switches between them by pointer swaps, asking its policy ``get_steps_for_batch(batch_size)`` before each decode
step. Its own policy (``AdaptiveSpeculativeParams``) follows an EMA of the accept length and knows nothing of cost.
With ``--speculative-kimi-adaptive`` the plugin turns SGLang's adaptive mode on with the plugin's candidate steps
(``validation.py``) and, once the states exist, hands the controller :class:`EagleStepsPolicy`: the same
``WidthPolicy`` as DFLASH (width = steps = drafts per step, 0 = SGLang's trivial one-token verify), chain
acceptance by position, and a cost table by batch bucket and width.

Measurement: the start-up profile times, for every bucket and width, a whole step on dummy requests in that width's
runtime state: the drafter's multi-step draft, the target's verify over steps + 1 tokens and the draft extend
(``profile_step``). Real steps refine it (a cell's first real step replaces its profiled value, and the cells not
yet run are scaled by the bucket's real / profiled ratio, see ``speculators/policy.CostTable``); each decode step
is timed around ``forward_batch_generation`` and its accepted counts are read where SGLang's result processing has
them on the host (``metrics._record_step``, ``adaptive/runtime.record_tagged_step``).
"""

from __future__ import annotations

import logging

import torch

from sglang_kimi.hooks import hook
from sglang_kimi.settings import plugin_args
from sglang_kimi.speculative.adaptive.config import acceptance_estimate, load_adaptive_config
from sglang_kimi.speculative.adaptive.eagle_policy import EagleStepsPolicy
from sglang_kimi.speculative.adaptive.runtime import AdaptiveRuntime, tag_step

logger = logging.getLogger("sglang_kimi")


def _worker_adaptive(worker) -> bool:
    return getattr(worker, "adaptive_controller", None) is not None and plugin_args(worker.server_args).adaptive


def start_eagle_adaptive(worker) -> AdaptiveRuntime:
    """Profile (or reuse the profile), build the policy, and hand it to SGLang's adaptive controller."""
    from sglang_kimi.speculative.adaptive.start import start_runtime  # the model runner's modules

    args = plugin_args(worker.server_args)
    config = load_adaptive_config(args.adaptive_config)  # checked at start-up already; re-read in this process
    controller = worker.adaptive_controller
    widths = tuple(sorted(args.adaptive_widths))
    if list(widths) != list(controller.candidate_steps):
        raise RuntimeError(
            f"sglang-kimi adaptive EAGLE3: SGLang built states for steps {controller.candidate_steps}, the plugin "
            f"resolved widths {list(widths)}; --speculative-adaptive-config must not be changed by another plugin"
        )
    active = int(worker.speculative_num_steps)
    try:
        runtime = start_runtime(
            worker,
            "EAGLE3 chain",
            lambda ws: acceptance_estimate(config, True, ws),
            config,
            widths,
            ("eagle3-chain", 0),
            lambda b, w: profile_step(worker, b, w, config.profile_repeats),
            # what a cell times (earlier files timed the verify only)
            extra_key={"step": "draft, verify, draft extend"},
        )
    finally:
        controller._activate(active)  # the profile ran each width in its own runtime state
    previous = controller.params
    controller.params = EagleStepsPolicy(runtime, widths, getattr(previous, "_cuda_graph_bs", None))
    worker._sglang_kimi_adaptive = runtime
    return runtime


@torch.inference_mode()
def profile_step(worker, batch_size: int, width: int, repeats: int) -> float:
    """Seconds of one EAGLE3 decode step of ``width`` drafts for ``batch_size`` dummy requests, in the width's own
    runtime state: the draft (``width - 1`` draft forwards of one token per request; width 1 drafts from the
    previous step's extend, width 0 not at all), the target's verify over ``width + 1`` tokens, and the draft
    extend over those ``width + 1`` tokens that SGLang runs after every verify (width 0 included)."""
    from sglang.srt.environ import envs
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_kimi.speculative.adaptive.start import dummy_batch, fastest, verify_forward

    runner = worker.target_worker.model_runner
    device = worker.device
    window = width + 1
    req_pool_indices, prefix, prefix_cpu = dummy_batch(runner, device, batch_size, window)
    algorithm = SpeculativeAlgorithm.from_string("EAGLE3")
    extend = width > 0 or not envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.get()

    def one_step():
        if width > 1:
            with _draft_context(worker):
                draft_decode_forward(worker, batch_size, width)
        verify_forward(runner, device, req_pool_indices, prefix, prefix_cpu, window, algorithm)
        if extend:
            with _draft_context(worker):
                draft_extend_forward(worker, batch_size, window)

    # the width's runtime state (attention backends, graphs), as a real step of this width runs; the caller puts
    # the starting state back once every cell is timed
    worker.adaptive_controller._activate(width)
    return fastest(one_step, repeats, device)


def _draft_context(worker):
    """The parallel and MoE settings SGLang's EAGLE worker enters around every draft-model forward."""
    import contextlib

    from sglang.srt.layers.moe.utils import speculative_moe_a2a_backend_context, speculative_moe_backend_context
    from sglang.srt.speculative.spec_utils import draft_tp_context

    stack = contextlib.ExitStack()
    stack.enter_context(draft_tp_context(worker.draft_worker.parallel_layout))
    stack.enter_context(speculative_moe_backend_context())
    stack.enter_context(speculative_moe_a2a_backend_context())
    return stack


def draft_decode_forward(worker, batch_size: int, steps: int) -> None:
    """SGLang's multi-step draft (``EagleDraftWorker.draft_forward``, the eager path of ``draft``) on dummy
    requests: chain drafts (topk 1) from a zero hidden state, KV writes to the padding slot 0."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec

    from sglang_kimi.speculative.adaptive.start import dummy_batch

    draft = worker.draft_worker
    runner = draft.draft_runner
    device = worker.device
    req_pool_indices, prefix, prefix_cpu = dummy_batch(runner, device, batch_size, steps + 1)
    hidden_size, hidden_dtype = get_draft_recurrent_hidden_state_spec(runner)
    spec_info = EagleDraftInput(
        topk_p=torch.ones((batch_size, 1), dtype=torch.float32, device=device),  # [bs, topk]
        topk_index=torch.zeros((batch_size, 1), dtype=torch.int64, device=device),  # [bs, topk]
        hidden_states=(
            None
            if hidden_size is None
            else torch.zeros((batch_size, hidden_size), dtype=hidden_dtype, device=device)  # [bs, hidden]
        ),
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    forward_batch = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=batch_size,
        input_ids=None,
        req_pool_indices=req_pool_indices,
        seq_lens=prefix,
        seq_lens_cpu=prefix_cpu,
        out_cache_loc=torch.zeros(batch_size * steps, dtype=torch.int64, device=device),  # [bs * steps]
        seq_lens_sum=int(prefix_cpu.sum()),
        positions=prefix.clone(),  # [bs]
        spec_algorithm=runner.spec_algorithm,
        spec_info=spec_info,
        sampling_info=_greedy_sampling(batch_size, runner, device),
        capture_hidden_mode=CaptureHiddenMode.LAST,
    )
    runner.kv_index_translator.bind_runner_slots(forward_batch)
    draft.draft_attn_backend.init_forward_metadata(forward_batch)
    forward_batch.mark_forward_metadata_ready()
    draft.draft_forward(forward_batch)


def draft_extend_forward(worker, batch_size: int, window: int) -> None:
    """SGLang's draft extend after a verify (``_draft_extend_for_decode``'s eager forward) on dummy requests:
    ``window`` tokens per request with the target's hidden states (zeros), KV writes to the padding slot 0."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftExtendInput
    from sglang.srt.speculative.eagle_utils import get_draft_input_from_target_hidden_dim

    from sglang_kimi.speculative.adaptive.start import dummy_batch

    runner = worker.draft_worker.draft_runner
    device = worker.device
    req_pool_indices, prefix, prefix_cpu = dummy_batch(runner, device, batch_size, window)
    tokens = batch_size * window
    spec_info = EagleDraftExtendInput(
        hidden_states=torch.zeros(
            (tokens, get_draft_input_from_target_hidden_dim(runner)), dtype=runner.model_config.dtype, device=device
        ),  # [bs * window, target hidden]
        num_correct_drafts=torch.full((batch_size,), window - 1, dtype=torch.int32, device=device),  # [bs]
        num_accept_tokens=torch.full((batch_size,), window, dtype=torch.int32, device=device),  # [bs]
        num_tokens_per_req=window,
        num_tokens_for_logprob_per_req=window,
        capture_hidden_mode=CaptureHiddenMode.FULL,
    )
    seq_lens_cpu = prefix_cpu + window
    forward_batch = ForwardBatch(
        forward_mode=ForwardMode.DRAFT_EXTEND_V2,
        batch_size=batch_size,
        input_ids=torch.zeros(tokens, dtype=torch.int64, device=device),  # [bs * window]
        req_pool_indices=req_pool_indices,
        seq_lens=prefix + window,
        seq_lens_cpu=seq_lens_cpu,
        out_cache_loc=torch.zeros(tokens, dtype=torch.int64, device=device),  # [bs * window]
        seq_lens_sum=int(seq_lens_cpu.sum()),
        positions=(prefix[:, None] + torch.arange(window, device=device)).reshape(-1),  # [bs * window]
        extend_num_tokens=tokens,
        extend_seq_lens=torch.full((batch_size,), window, dtype=torch.int32, device=device),  # [bs]
        extend_prefix_lens=prefix.to(torch.int32),  # [bs]
        extend_start_loc=torch.arange(0, tokens, window, dtype=torch.int32, device=device),  # [bs]
        extend_seq_lens_cpu=[window] * batch_size,
        extend_prefix_lens_cpu=prefix_cpu.tolist(),
        spec_algorithm=runner.spec_algorithm,
        spec_info=spec_info,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        return_logprob=False,
    )
    runner.kv_index_translator.bind_runner_slots(forward_batch)
    runner.forward(forward_batch)


def _greedy_sampling(batch_size: int, runner, device):
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    return SamplingBatchInfo(
        temperatures=torch.ones((batch_size, 1), dtype=torch.float, device=device),
        top_ps=torch.ones((batch_size,), dtype=torch.float, device=device),
        top_ks=torch.ones((batch_size,), dtype=torch.int32, device=device),
        min_ps=torch.zeros((batch_size,), dtype=torch.float, device=device),
        is_all_greedy=True,
        is_any_greedy=True,
        need_top_p_sampling=False,
        need_top_k_sampling=False,
        need_min_p_sampling=False,
        vocab_size=runner.model_config.vocab_size,
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
