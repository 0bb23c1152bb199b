"""Fixes for SGLang's CPU path, installed through SGLang's registries and hooks (entries: platform/registrations.py)."""

CPU_MLA_BACKENDS = ("torch_native",)


def _absorbed_mla(attn, forward_batch):
    """Always run MLA in the absorbed form (queries against the latent KV cache)."""
    from sglang.srt.models.deepseek_common.attention_backend_handler import _dispatch_mla_subtype

    return _dispatch_mla_subtype(attn, forward_batch)


def install_absorbed_mla_handler(target: str):
    """torch_native has no entry in the DeepSeek attention-method registry, so it falls back to the triton
    handler, which picks the non-absorbed MHA path for prefill without a cached prefix. But
    ``TorchNativeAttnBackend.forward_extend`` ignores the per-head k/v it is given and attends over the
    latent KV pool, so prefill is wrong (or crashes when the MLA dims differ). Absorbed MLA is correct."""
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    for backend in CPU_MLA_BACKENDS:
        if backend in AttentionBackendRegistry._handlers:
            return f"SGLang already has a {backend} handler"
        AttentionBackendRegistry.register(backend, _absorbed_mla)
    return None


# ---------------------------------------------------------------------------------------------------------------
# Upstream bugs on SGLang's speculative CPU path (entries: platform/registrations.py).

# Backends whose TARGET_VERIFY reads SGLang's QLEN_ONLY tree mask; every other backend reads FULL_MASK.
QLEN_ONLY_MASK_BACKENDS = ("intel_amx", "kimi_cpu")


def _verify_attention_backend() -> str | None:
    """The backend that runs TARGET_VERIFY: the decode backend under ``--speculative-attention-mode decode``,
    the prefill backend otherwise (``HybridAttnBackend._select_backend``)."""
    from sglang.srt.runtime_context import attention_backends, get_spec

    prefill, decode = attention_backends()
    return decode if get_spec().speculative_attention_mode == "decode" else prefill


def _tree_mask_mode_for_verify_backend(original):
    """On CPU, QLEN_ONLY only for the backends that read it; FULL_MASK (the GPU layout) for the others."""
    from sglang.srt.speculative.eagle_utils import TreeMaskMode
    from sglang.srt.utils import is_cpu

    if not is_cpu():
        return original()
    backend = _verify_attention_backend()
    return TreeMaskMode.QLEN_ONLY if backend in QLEN_ONLY_MASK_BACKENDS else TreeMaskMode.FULL_MASK


def install_tree_mask_mode(target: str):
    """``eagle_utils.default_tree_mask_mode()`` returns QLEN_ONLY whenever the platform is CPU (a layout meant for
    the intel_amx kernel), but SGLang's other backends read FULL_MASK rows of ``seq_len + N`` cells
    (``triton_backend.py``): with ``--attention-backend triton`` on CPU the verify reads a garbage mask and greedy
    speculative output diverges. Pick the layout by the backend that runs TARGET_VERIFY."""
    from sglang_kimi.hooks import hook

    hook(target, _tree_mask_mode_for_verify_backend, "AROUND")


class CpuSRTPlatformWithDFlash:
    """Stands in for SGLang's CPU platform while ``_handle_dflash`` validates a CPU server: it claims DFLASH
    support (the in-tree check accepts only cuda/npu/xpu) and answers the out-of-tree draft-backend questions
    with SGLang's in-tree rule (``DRAFT_ATTENTION_BACKEND_CHOICES``), falling back to ``kimi_cpu``. Everything
    else is the real platform."""

    def __init__(self, platform):
        self._platform = platform

    def __getattr__(self, name):
        return getattr(self._platform, name)

    def is_out_of_tree(self) -> bool:
        return True

    def supports_speculative_algorithm(self, algorithm: str) -> bool:
        return algorithm == "DFLASH"

    def supports_speculative_draft_attention_backend(self, algorithm: str, backend: str) -> bool:
        from sglang.srt.arg_groups.choices import DRAFT_ATTENTION_BACKEND_CHOICES

        return backend in DRAFT_ATTENTION_BACKEND_CHOICES

    def get_default_speculative_draft_attention_backend(self, algorithm: str) -> str:
        from sglang_kimi.platform.cpu import KIMI_CPU_BACKEND

        return KIMI_CPU_BACKEND


def _handle_dflash_on_cpu(original, server_args):
    from sglang.srt.arg_groups import speculative_hook
    from sglang.srt.arg_groups.overrides import resolving_view

    if resolving_view(server_args).device != "cpu":
        return original(server_args)
    platform = getattr(speculative_hook, "current_platform", None)
    if platform is None:  # SGLang 0.5.20: no platform; _handle_dflash compares cfg.device with cuda/npu/xpu
        return _handle_dflash_reading_xpu(original, server_args, speculative_hook)
    if platform.is_out_of_tree():
        return original(server_args)
    speculative_hook.current_platform = CpuSRTPlatformWithDFlash(platform)
    try:
        if _plugin_tree_with_dp_attention(server_args):
            return _handle_dflash_reading_device(original, server_args, speculative_hook, "cuda")
        return original(server_args)
    finally:
        speculative_hook.current_platform = platform


def _plugin_tree_with_dp_attention(server_args) -> bool:
    """A DFLASH tree server (the plugin's worker) under DP attention: SGLang refuses DFLASH with DP attention on
    every device but CUDA and NPU, for its own chain worker; the tree worker's DP-attention path runs on CPU
    (its CPU-only parts: gloo collectives, eager forwards). Its other DP-attention conditions still apply."""
    from sglang.srt.arg_groups.overrides import resolving_view

    from sglang_kimi.settings import attention_dp_size, plugin_args

    tree = plugin_args(server_args).dflash_tree_budget is not None
    return tree and attention_dp_size(resolving_view(server_args)) > 1


class _DeviceView:
    def __init__(self, view, device: str):
        self._view, self.device = view, device

    def __getattr__(self, name):
        return getattr(self._view, name)


def _handle_dflash_reading_xpu(original, server_args, speculative_hook):
    """SGLang 0.5.20's ``_handle_dflash`` reads the device twice: its device check, and a dp-attention check that
    refuses every device but NPU (CPU and XPU alike); while it runs, its ``resolving_view`` reports ``xpu``."""
    return _handle_dflash_reading_device(original, server_args, speculative_hook, "xpu")


def _handle_dflash_reading_device(original, server_args, speculative_hook, device: str):
    """``_handle_dflash`` run with its ``resolving_view`` reporting ``device`` (it reads the device only in its
    device checks)."""
    resolving_view = speculative_hook.resolving_view
    speculative_hook.resolving_view = lambda args: _DeviceView(resolving_view(args), device)
    try:
        return original(server_args)
    finally:
        speculative_hook.resolving_view = resolving_view


def install_dflash_on_cpu(target: str):
    """``_handle_dflash`` refuses every device but cuda/npu/xpu (``ValueError: DFLASH speculative decoding is not
    supported by CpuSRTPlatform on device 'cpu'``) although the DFLASH worker has eager torch paths for all of its
    steps. On a CPU server, run the whole upstream validation with the platform claiming DFLASH support."""
    from sglang_kimi.hooks import hook

    hook(target, _handle_dflash_on_cpu, "AROUND")


def _record_stream_cuda_only(self, stream):
    """``Tensor.record_stream`` as SGLang's ``spec_utils.record_stream_each`` applies it: CUDA tensors only."""
    import torch

    if self.is_cuda:
        return torch._C.TensorBase.record_stream(self, stream)
    return None


def _dflash_forward_without_cpu_record_stream(original, self, *args, **kwargs):
    import torch

    if torch.device(self.device).type != "cpu" or "record_stream" in torch.Tensor.__dict__:
        return original(self, *args, **kwargs)
    torch.Tensor.record_stream = _record_stream_cuda_only
    try:
        return original(self, *args, **kwargs)
    finally:
        del torch.Tensor.record_stream  # back to TensorBase.record_stream


def install_dflash_record_stream_guard(target: str):
    """``DFlashWorkerV2.forward_batch_generation`` calls ``batch.seq_lens.record_stream(current_stream())``
    unconditionally; on CPU ``torch.cpu.current_stream()`` is no ``torch.Stream`` (``RuntimeError: unknown
    parameter type``) and CPU tensors have no stream to record. While that worker runs on a CPU device,
    ``record_stream`` skips non-CUDA tensors (as ``spec_utils.record_stream_each`` does); other devices and
    other code are untouched."""
    from sglang_kimi.hooks import hook

    hook(target, _dflash_forward_without_cpu_record_stream, "AROUND")


def _without_cuda_calls(original, self, *args, **kwargs):
    """``original`` with ``torch.cuda.synchronize`` and ``empty_cache`` doing nothing, when torch has no CUDA."""
    import torch

    if torch.cuda.is_available():
        return original(self, *args, **kwargs)
    saved = torch.cuda.synchronize, torch.cuda.empty_cache
    torch.cuda.synchronize = torch.cuda.empty_cache = lambda *a, **k: None
    try:
        return original(self, *args, **kwargs)
    finally:
        torch.cuda.synchronize, torch.cuda.empty_cache = saved


def install_eagle3_mla_embed_on_cpu(target: str, *more: str):
    """``Eagle3DeepseekV2ForCausalLM.set_embed`` / ``set_embed_and_head`` (the MLA EAGLE3 drafter taking the target's
    embedding and head) end with ``torch.cuda.empty_cache(); torch.cuda.synchronize()``: on a CPU build of torch that
    raises "Torch not compiled with CUDA enabled" and the server ends while allocating the drafter's memory pool. On
    a machine without CUDA both calls do nothing while these two run."""
    import importlib.util

    from sglang_kimi.hooks import hook

    if importlib.util.find_spec(target.rsplit(".", 2)[0]) is None:
        return "this SGLang has no MLA EAGLE3 drafter model"
    for name in (target, *more):
        hook(name, _without_cuda_calls, "AROUND")
    return None


def _simulated_routing_in_torch(original, topk_ids, topk_weights, num_experts, *, random, num_ranks=1, layer_id=None,
                                token_shard_rank=0, num_token_shards=1, seed=None, num_token_non_padded=None,
                                weight_scale=1.0):  # fmt: skip
    """``_simulate_balanced_routing`` for CPU tensors: the Triton kernel's assignment written in torch (one program
    per token there, one row here): uniform ``random`` gives each token a random base expert and its k experts
    ``step = E // k`` apart; otherwise the round-robin deal; weights ``weight_scale / k``; padded rows -1 and 0."""
    import torch

    if topk_ids.is_cuda or topk_ids.numel() == 0:
        return original(topk_ids, topk_weights, num_experts, random=random, num_ranks=num_ranks, layer_id=layer_id,
                        token_shard_rank=token_shard_rank, num_token_shards=num_token_shards, seed=seed,
                        num_token_non_padded=num_token_non_padded, weight_scale=weight_scale)  # fmt: skip
    num_tokens, k = topk_ids.shape
    experts_per_rank = num_experts // num_ranks
    slot = torch.arange(k, device=topk_ids.device)  # [k]
    token = torch.arange(num_tokens, device=topk_ids.device)  # [num_tokens]
    if random:
        generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        base = torch.randint(0, num_experts, (num_tokens, 1), generator=generator)  # [num_tokens, 1]
        gid = (base + slot * max(num_experts // k, 1)) % num_experts  # [num_tokens, k]
    else:
        rank_rotation = (token_shard_rank * max(num_ranks, num_token_shards)) // num_token_shards
        offset = (0 if layer_id is None else layer_id) + rank_rotation + token_shard_rank * num_ranks
        deal = token[:, None] * k + slot + offset  # [num_tokens, k]
        gid = (deal % num_ranks) * experts_per_rank + (deal // num_ranks) % experts_per_rank
    weights = torch.full((num_tokens, k), weight_scale / k, dtype=topk_weights.dtype)  # [num_tokens, k]
    if num_token_non_padded is not None:
        padded = (token >= num_token_non_padded)[:, None]  # [num_tokens, 1]
        gid = torch.where(padded, -1, gid)
        weights = torch.where(padded, 0.0, weights)
    topk_ids.copy_(gid.to(topk_ids.dtype))
    topk_weights.copy_(weights)


def install_simulated_routing_on_cpu(target: str):
    """``SGLANG_SIMULATE_UNIFORM_EXPERTS=1`` / ``SGLANG_SIMULATE_ROUND_ROBIN_EXPERTS=1`` (benchmark routing in place of
    the router's, which random weights collapse onto a few experts) run a Triton kernel, which has no driver on a
    CPU: the server ended at its first MoE layer. On CPU tensors the same assignment is made in torch."""
    from sglang_kimi.hooks import hook

    hook(target, _simulated_routing_in_torch, "AROUND")


def _no_triton_for_kimi_cpu(original, backend):
    from sglang_kimi.platform.cpu import KIMI_CPU_BACKEND

    return False if backend == KIMI_CPU_BACKEND else original(backend)


def install_no_triton_for_kimi_cpu(target: str):
    """``support_triton("kimi_cpu")``: False (SGLang 0.5.22+ answers False on any CPU already)."""
    from sglang_kimi.hooks import hook

    hook(target, _no_triton_for_kimi_cpu, "AROUND")


def _dflash_attention_without_triton_rope(result, self, *args, **kwargs):
    self.use_table_qk_norm_rope = False  # the torch path: apply_qk_norm, then the rotary embedding


def install_dflash_draft_torch_rope(target: str):
    """``DFlashAttention`` runs its q/k norm and rotary embedding as one Triton kernel (``table_qk_norm_rope_``)
    whenever the drafter's activations are bfloat16; on CPU Triton has no driver, so a ``--dtype bfloat16`` DFLASH
    server ended at its first draft block. On CPU the drafter takes SGLang's torch path (the one every other dtype
    takes)."""
    from sglang_kimi.hooks import hook

    hook(target, _dflash_attention_without_triton_rope, "AFTER")


def _dflash2_walks_greedily_on_cpu(result, self, *args, **kwargs):
    import torch

    if getattr(self, "selector", None) is not None and torch.device(self.device).type == "cpu":
        self._selector_sampling_enabled = False  # what SGLang sets on NPU, whose verify is greedy-only
        # its warning then says sampled requests fall back to greedy verification, which is not so here: they reach
        # the DFLASH chain's sampled verify (is_dflash_sampling_verify_available, true where the plugin verifies)
        self._warned_sampling_fallback = True


def install_dflash2_cpu_sampling(target: str):
    """A DFlash2 drafter's sampled requests: SGLang samples the selector's walk and verifies it against the walk's
    probabilities with DSpark's accept, a Triton kernel; on CPU Triton has no driver, so the first block-wide step
    of a sampled request ended the server. On CPU the walk is greedy for every request (SGLang's switch for it), and
    sampled requests take the DFLASH chain's sampled verify, which the plugin runs losslessly there
    (``speculative/workers/dflash_sampling.py``)."""
    from sglang_kimi.hooks import hook

    hook(target, _dflash2_walks_greedily_on_cpu, "AFTER")


def _send_kv_chunk_with_host_indices(original, self, req, *args, **kwargs):
    sender = getattr(req, "disagg_kv_sender", None)
    if getattr(sender, "supports_host_tensor_indices", False):
        sender.supports_host_tensor_indices = False  # this sender's pages are indexed on the host, as the others'
    return original(self, req, *args, **kwargs)


def install_pd_prefill_host_indices(target: str):
    """A PD prefill server sends each KV chunk's page indices to Mooncake. For senders that take host tensors
    (``MooncakeKVSender.supports_host_tensor_indices``) ``send_kv_chunk`` copies them device-to-host into pinned
    memory and records a ``torch.cuda.Event``: on CPU that ended the prefill scheduler ("pin_memory=True requires a
    CUDA or other accelerator backend") at the first request. On CPU the indices are already on the host: the
    sender takes SGLang's path for the other backends (``kv_to_page_indices``), the same pages."""
    from sglang_kimi.hooks import hook

    hook(target, _send_kv_chunk_with_host_indices, "AROUND")


def _no_early_send_under_overlap(original, self, req, *args, **kwargs):
    if getattr(self, "enable_overlap", False):
        return None  # the final send covers the prefix, as when the early send is switched off
    return original(self, req, *args, **kwargs)


def install_pd_prefill_no_early_send(target: str):
    """Under the overlap scheduler a PD prefill server sends a request's cached prefix early, after recording a
    ``torch.cuda.Event`` on the forward stream: on CPU that ended the prefill scheduler ("Tried to instantiate dummy
    base class Event") at the first request whose prompt hit the radix cache. On CPU the early send is skipped
    there (as with ``SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX=0``); the request's send covers its prefix."""
    from sglang_kimi.hooks import hook

    hook(target, _no_early_send_under_overlap, "AROUND")
