"""The Kimi-K2.6 entries of the registration table: text-only serving, quantized checkpoints, FP8 KV scales, the cost
probe of the step-cost benchmark.
Data only; ``plugin.py`` runs them. Each module's docstring has the detail."""

from sglang_kimi.hooks import Entry

_MODELS = "sglang_kimi.models"
_KV_POOL = "sglang.srt.mem_cache.memory_pool"

ENTRIES: tuple[Entry, ...] = (
    Entry(
        "kimi-language-model-only",
        "sglang.srt.server_args.ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES",
        f"{_MODELS}.install:install_language_model_only_arch",
        "lets --language-model-only (text-only serving, no multimodal processor) accept Kimi-K2.5/K2.6",
    ),
    Entry(
        "kimi-text-only-model",
        "sglang.srt.model_loader.utils.get_model_architecture",
        f"{_MODELS}.install:install_text_only_kimi_class",
        "with --language-model-only Kimi is built and loaded without its MoonViT tower, and takes input_embeds",
    ),
    Entry(
        "kimi-quant-dequant-fallback",
        "sglang.srt.layers.quantization.QUANTIZATION_METHODS",
        f"{_MODELS}.quant.fallback:install_dequant_fallbacks",
        "INT4 (compressed-tensors) and MXFP4 (Quark) checkpoints load where SGLang has no kernel, dequantized; "
        "where it has one, its own method is kept (existing keys overridden: ROCm refuses new ones)",
        reads=(
            "sglang.srt.layers.quantization.CPU_QUANTIZATION_METHODS",
            "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors.CompressedTensorsConfig",
            "sglang.srt.layers.quantization.quark.quark.QuarkConfig",
        ),
    ),
    Entry(
        "kimi-fp8-kv-scales",
        "sglang.srt.model_executor.model_runner_components.load_model_utils.load_kv_cache_scales",
        f"{_MODELS}.kv_scales:install_kv_scales",
        "FP8 KV cache scales for Kimi's target and drafter layers, from SGLANG_KIMI_KV_SCALES (file or dynamic)",
    ),
    Entry(
        "kimi-kv-observe-mla",
        f"{_KV_POOL}.MLATokenToKVPool.set_kv_buffer",
        f"{_MODELS}.kv_scales:install_mla_observer",
        "running max of the MLA latent rows written to the KV cache (dynamic scales, calibrate-kv)",
    ),
    Entry(
        "kimi-kv-observe-mha",
        f"{_KV_POOL}.MHATokenToKVPool.set_kv_buffer",
        f"{_MODELS}.kv_scales:install_mha_observer",
        "running max of K and V written to MHA pools (the DFlash drafter's), so drafter layers get FP8 scales too",
    ),
    Entry(
        "kimi-cost-probe-forwards",
        "sglang.srt.model_executor.model_runner.ModelRunner.forward",
        f"{_MODELS}.cost_probe:install_forward_clock",
        "with SGLANG_KIMI_COST_PROBE=1 every forward (target and drafter) is timed between device synchronisations, "
        "by forward mode, for bench/bench_step_cost.py",
        hooks=(
            "sglang.srt.speculative.eagle_draft_cuda_graph_runner.EAGLEDraftCudaGraphRunner.execute",
            "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner.EAGLEDraftExtendCudaGraphRunner.execute",
        ),
    ),
    Entry(
        "kimi-cost-probe-experts",
        "sglang.srt.layers.moe.topk.select_experts",
        f"{_MODELS}.cost_probe:install_expert_counter",
        "with SGLANG_KIMI_COST_PROBE=1 the distinct routed experts of every MoE router call are counted on the device",
    ),
)
