"""The platform's entries of the registration table: what makes SGLang serve on CPU (``cpu/``) and on a CUDA device
without ``sgl_kernel`` (``cuda_stand_in/``). Data only; ``plugin.py`` runs them. Each module's docstring has the
detail."""

from sglang_kimi.hooks import CPU_ONLY, CUDA_STAND_IN, Entry

_CPU = "sglang_kimi.platform.cpu"
_STAND_IN = "sglang_kimi.platform.cuda_stand_in.missing_ops"

ENTRIES: tuple[Entry, ...] = (
    Entry(
        "cpu-absorbed-mla",
        "sglang.srt.models.deepseek_common.attention_backend_handler.AttentionBackendRegistry",
        f"{_CPU}.cpu_path_fixes:install_absorbed_mla_handler",
        "upstream bug: torch_native's MLA prefill attends over the latent pool (wrong logits); run absorbed MLA",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-attention-backend",
        "sglang.srt.layers.attention.attention_registry.ATTENTION_BACKENDS",
        f"{_CPU}.backend_registration:install_attention_backend",
        "--attention-backend kimi_cpu: torch attention for every forward mode speculative decoding uses on CPU",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-eagle-draft-backends",
        "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend",
        f"{_CPU}.backend_registration:install_draft_backends",
        "EAGLE's draft backends for kimi_cpu (DraftBackendFactory refuses names outside its hard-coded map)",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-tree-mask-mode",
        "sglang.srt.speculative.eagle_utils.default_tree_mask_mode",
        f"{_CPU}.cpu_path_fixes:install_tree_mask_mode",
        "upstream bug: on any CPU the EAGLE tree mask takes intel_amx's layout; pick it by the verify backend",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-dflash-allowed",
        "sglang.srt.arg_groups.speculative_hook._handle_dflash",
        f"{_CPU}.cpu_path_fixes:install_dflash_on_cpu",
        "upstream bug: DFLASH is refused on device cpu although its worker has torch paths for every step",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-eagle3-mla-embed",
        "sglang.srt.models.kimi_k25_eagle3.Eagle3DeepseekV2ForCausalLM.set_embed",
        f"{_CPU}.cpu_path_fixes:install_eagle3_mla_embed_on_cpu",
        "upstream bug: the MLA EAGLE3 drafter synchronises CUDA when it takes the target's embedding (fails on CPU)",
        when=CPU_ONLY,
        hooks=("sglang.srt.models.kimi_k25_eagle3.Eagle3DeepseekV2ForCausalLM.set_embed_and_head",),
    ),
    Entry(
        "cpu-simulated-routing",
        "sglang.srt.layers.moe.topk._simulate_balanced_routing",
        f"{_CPU}.cpu_path_fixes:install_simulated_routing_on_cpu",
        "upstream gap: SGLANG_SIMULATE_UNIFORM_EXPERTS (benchmark MoE routing) is a Triton kernel; on CPU, torch",
        when=CPU_ONLY,
        since=(0, 5, 23),  # num_ranks, num_token_non_padded and weight_scale arrived there
    ),
    Entry(
        "cpu-rank-thread-binding",
        "sglang.srt.distributed.bootstrap._init_cpu_threads_env",
        f"{_CPU}.thread_binding:install_rank_thread_binding",
        "upstream gap: CPU ranks are bound to their cores only on AMX and arm64; elsewhere they oversubscribe",
        when=CPU_ONLY,
        reads=(
            "sglang.srt.distributed.bootstrap._is_cpu_amx_available",
            "sglang.srt.distributed.bootstrap._is_cpu_arm64",
            "sglang.srt.distributed.bootstrap.get_parallel",
        ),
    ),
    Entry(
        "cuda-stand-in-silu-and-mul",
        "sglang.kernels.ops.activation.activation.silu_and_mul",
        f"{_STAND_IN}:install_silu_and_mul",
        "without sgl_kernel on CUDA: the fused MoE's silu(gate) * up in torch",
        when=CUDA_STAND_IN,
    ),
    Entry(
        "cuda-stand-in-moe-triton",
        "sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod.forward_native",
        f"{_STAND_IN}:install_moe_on_triton",
        "without sgl_kernel on CUDA: the unquantised MoE on SGLang's Triton path (its torch loop cannot be captured)",
        when=CUDA_STAND_IN,
        reads=("sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod.forward_cuda",),
    ),
    Entry(
        "cuda-stand-in-router-gemm",
        "sglang.srt.models.deepseek_common.utils.tiny_router_gemm_max_tokens",
        f"{_STAND_IN}:install_no_tiny_router_gemm",
        "without sgl_kernel on CUDA: the DeepSeek router's GEMM through F.linear",
        when=CUDA_STAND_IN,
    ),
    Entry(
        "cuda-stand-in-renorm",
        "sglang.srt.speculative.dflash_utils._dflash_top_k_renorm_prob",
        f"{_STAND_IN}:install_renorm",
        "without FlashInfer on CUDA: the DFLASH worker's top-k / top-p renormalisation in torch",
        when=CUDA_STAND_IN,
        hooks=("sglang.srt.speculative.dflash_utils._dflash_top_p_renorm_prob",),
        reads=("sglang.srt.layers.sampler.top_p_normalize_probs_torch",),
    ),
    Entry(
        "cuda-stand-in-dual-gemm",
        "sglang.srt.layers.dual_gemm.DualGemm._select_mode",
        f"{_STAND_IN}:install_no_dual_gemm",
        "without the CuTe DSL on CUDA: the EAGLE3 drafter's MLP keeps its two GEMMs",
        when=CUDA_STAND_IN,
        since=(0, 5, 22),  # the fused dual GEMM arrived there
    ),
    Entry(
        "cuda-stand-in-tree-build",
        "sglang.kernels.ops.speculative.tree.build_tree_kernel_efficient",
        f"{_STAND_IN}:install_tree_build",
        "without sgl_kernel on CUDA: EAGLE's draft-tree build through SGLang's Triton version",
        when=CUDA_STAND_IN,
        reads=("sglang.kernels.ops.speculative.spec_tree.sgl_build_tree_kernel_triton",),
        since=(0, 5, 23),  # SGLang's Triton version of the kernel arrived there
    ),
    Entry(
        "cuda-stand-in-tree-verify",
        "sglang.kernels.ops.speculative.tree.verify_tree_greedy",
        f"{_STAND_IN}:install_tree_verify",
        "without sgl_kernel on CUDA: EAGLE's greedy tree verify through SGLang's Triton version",
        when=CUDA_STAND_IN,
        reads=("sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton",),
        since=(0, 5, 23),  # SGLang's Triton version of the kernel arrived there
    ),
    Entry(
        "cpu-pd-prefill-host-indices",
        "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.send_kv_chunk",
        f"{_CPU}.cpu_path_fixes:install_pd_prefill_host_indices",
        "upstream bug: a PD prefill server on CPU (mooncake_tcp) pins host memory and records a CUDA event for "
        "Mooncake's page indices at its first request (RuntimeError); the indices stay on the host",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-pd-prefill-no-early-send",
        "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.maybe_send_cached_prefix_chunk",
        f"{_CPU}.cpu_path_fixes:install_pd_prefill_no_early_send",
        "upstream bug: a PD prefill server on CPU records a CUDA event to send a cached prefix early, under the "
        "overlap scheduler (RuntimeError at the first radix-cache hit); the request's own send covers it",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-dflash-record-stream",
        "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2.forward_batch_generation",
        f"{_CPU}.cpu_path_fixes:install_dflash_record_stream_guard",
        "upstream bug: DFlashWorkerV2 calls record_stream on CPU tensors (RuntimeError)",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-dflash2-sampling",
        "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2.__init__",
        f"{_CPU}.cpu_path_fixes:install_dflash2_cpu_sampling",
        "upstream gap: a DFlash2 drafter's sampled verify is a Triton kernel (no CPU driver: the server ended); on CPU "
        "its walk is greedy and the plugin verifies sampled requests",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-future-map-record-stream",
        "sglang.srt.managers.overlap_utils.FutureMap._resolve_spec_extras",
        f"{_CPU}.cpu_path_fixes:install_dflash_record_stream_guard",
        "SGLang 0.5.20-0.5.21: the overlap scheduler calls record_stream on CPU tensors at the first DFLASH decode",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-no-triton",
        "sglang.srt.utils.common.support_triton",
        f"{_CPU}.cpu_path_fixes:install_no_triton_for_kimi_cpu",
        "SGLang 0.5.20-0.5.21: kimi_cpu's KV-index writes would launch Triton kernels on CPU",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-dflash-draft-rope",
        "sglang.srt.models.dflash.DFlashAttention.__init__",
        f"{_CPU}.cpu_path_fixes:install_dflash_draft_torch_rope",
        "upstream bug: a bfloat16 DFLASH drafter runs its rope as a Triton kernel on CPU too; take the torch path",
        when=CPU_ONLY,
        reads=("sglang.srt.models.dflash.apply_qk_norm",),
    ),
)
