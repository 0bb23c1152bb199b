"""Everything sglang-kimi registers into SGLang, in one table.

Each :class:`Entry` names the SGLang object it touches, the function that installs it (imported lazily,
so ``register()`` stays cheap; it is called with the entry's target) and why it exists: the feature it adds, or the
upstream bug it works around. :func:`register_all` runs the table once per process and records each entry's
outcome in :data:`STATUS`; the scheduler reports that record in ``/server_info``
(``internal_states[i]["sglang_kimi"]``, see ``server_info.py``) and ``sglang-kimi doctor`` prints it, so a
registration that failed is never silent.
"""

from __future__ import annotations

import importlib
import logging
import os
import traceback
from dataclasses import dataclass

logger = logging.getLogger("sglang_kimi")

ALWAYS = "always"
CPU_ONLY = "cpu"  # only in processes started with SGLANG_USE_CPU_ENGINE=1
CUDA_STAND_IN = "cuda without sgl_kernel"  # only on a CUDA device whose sgl_kernel is the plugin's shim


@dataclass(frozen=True)
class Entry:
    name: str  # short id, shown in /server_info and `sglang-kimi doctor`
    target: str  # the SGLang object hooked, or the registry written to
    install: str  # "module:function" inside sglang_kimi, called with the target; returns None or why it skipped
    why: str  # the feature it adds, or the upstream bug it works around
    when: str = ALWAYS
    # Dotted SGLang names the entry needs, checked by `sglang-kimi doctor --strict`; None: the target itself.
    needs: tuple[str, ...] | None = None
    # The first SGLang release that has what the entry needs: older releases skip it (and the audit its names).
    since: tuple[int, int, int] | None = None

    def sglang_names(self) -> tuple[str, ...]:
        return (self.target,) if self.needs is None else self.needs


REGISTRATIONS: tuple[Entry, ...] = (
    Entry(
        "sglang-version",
        "sglang.version.__version__",
        "sglang_kimi.plugin:check_sglang_version",
        "logs one line when the installed SGLang is outside the tested range",
    ),
    Entry(
        "server-info",
        "sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        "sglang_kimi.server_info:install_server_info",
        "reports the plugin's version and this table's outcome in /server_info from the scheduler process",
    ),
    Entry(
        "cpu-absorbed-mla",
        "sglang.srt.models.deepseek_common.attention_backend_handler.AttentionBackendRegistry",
        "sglang_kimi.cpu.fixes:install_absorbed_mla_handler",
        "upstream bug: with torch_native, MLA prefill takes the MHA path but TorchNativeAttnBackend.forward_extend "
        "ignores the given k/v and attends over the latent pool (wrong logits); route torch_native to absorbed MLA",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-attention-backend",
        "sglang.srt.layers.attention.attention_registry.ATTENTION_BACKENDS",
        "sglang_kimi.cpu.draft_backends:install_attention_backend",
        "--attention-backend kimi_cpu: torch attention serving every mode speculative decoding uses on CPU "
        "(TARGET_VERIFY chains and tree masks, EAGLE multi-step draft, DFLASH non-causal draft blocks, absorbed "
        "MLA); SGLang's torch_native has none of them and intel_amx needs the compiled CPU sgl_kernel",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-eagle-draft-backends",
        "sglang.srt.speculative.draft_utils.DraftBackendFactory._create_backend",
        "sglang_kimi.cpu.draft_backends:install_draft_backends",
        "EAGLE's draft backends for kimi_cpu: DraftBackendFactory refuses names outside its hard-coded map "
        '("EAGLE is not supported in decode attention backend kimi_cpu")',
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-tree-mask-mode",
        "sglang.srt.speculative.eagle_utils.default_tree_mask_mode",
        "sglang_kimi.cpu.fixes:install_tree_mask_mode",
        "upstream bug: default_tree_mask_mode() returns QLEN_ONLY on any CPU (the intel_amx layout) while the "
        "triton backend reads FULL_MASK rows, so EAGLE tree verify on CPU uses a garbage mask; pick the layout by "
        "the backend that runs TARGET_VERIFY",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-dflash-allowed",
        "sglang.srt.arg_groups.speculative_hook._handle_dflash",
        "sglang_kimi.cpu.fixes:install_dflash_on_cpu",
        "upstream bug: _handle_dflash rejects device cpu (only cuda/npu/xpu pass) although the DFLASH worker has "
        "torch paths for every step; the rest of its validation still runs",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-rank-thread-binding",
        "sglang.srt.distributed.bootstrap._init_cpu_threads_env",
        "sglang_kimi.cpu.thread_binding:install_rank_thread_binding",
        "upstream gap: SGLang binds each CPU rank to its SGLANG_CPU_OMP_THREADS_BIND cores only on AMX and arm64 "
        "CPUs; elsewhere every rank runs one torch thread per core of the machine, and with --tp/--dp-size/--pp-size "
        "above 1 the ranks' spinning OpenMP threads oversubscribe the cores. Bind the rank's threads to its cores",
        when=CPU_ONLY,
        needs=(
            "sglang.srt.distributed.bootstrap._init_cpu_threads_env",
            "sglang.srt.distributed.bootstrap._is_cpu_amx_available",
            "sglang.srt.distributed.bootstrap._is_cpu_arm64",
            "sglang.srt.distributed.bootstrap.get_parallel",
        ),
    ),
    Entry(
        "cuda-stand-in-silu-and-mul",
        "sglang.kernels.ops.activation.activation.silu_and_mul",
        "sglang_kimi.cuda_stand_in.fixes:install_silu_and_mul",
        "without sgl_kernel on a CUDA device: the fused MoE's silu(gate) * up is a kernel SGLang compiles at run "
        "time, with no fallback; compute it in torch",
        when=CUDA_STAND_IN,
    ),
    Entry(
        "cuda-stand-in-moe-triton",
        "sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod.forward_native",
        "sglang_kimi.cuda_stand_in.fixes:install_moe_on_triton",
        "without sgl_kernel on a CUDA device: SGLANG_FORCE_FUSED_OP_BACKEND=torch (the norms, activations and "
        "rotary without sgl_kernel) also puts the unquantised MoE on its native torch loop, which copies the "
        'per-expert token counts to the host: no CUDA graph captures it ("Cannot copy between CPU and CUDA tensors '
        "during CUDA graph capture\"); run SGLang's CUDA path, the Triton fused MoE, instead",
        when=CUDA_STAND_IN,
        needs=(
            "sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod.forward_native",
            "sglang.srt.layers.quantization.unquant.UnquantizedFusedMoEMethod.forward_cuda",
        ),
    ),
    Entry(
        "cuda-stand-in-router-gemm",
        "sglang.srt.models.deepseek_common.utils.tiny_router_gemm_max_tokens",
        "sglang_kimi.cuda_stand_in.fixes:install_no_tiny_router_gemm",
        "without sgl_kernel on a CUDA device: on Hopper the DeepSeek router's GEMM for up to 16 tokens is a kernel "
        "SGLang compiles at run time; take its F.linear path, as for shapes that kernel does not serve",
        when=CUDA_STAND_IN,
    ),
    Entry(
        "cuda-stand-in-renorm",
        "sglang.srt.speculative.dflash_utils._dflash_top_p_renorm_prob",
        "sglang_kimi.cuda_stand_in.fixes:install_renorm",
        "without FlashInfer on a CUDA device: SGLang's top-k / top-p renormalisation comes from FlashInfer, and the "
        "DFLASH worker runs it at start-up (prewarm_sampling: ModuleNotFoundError: flashinfer); renormalise the "
        "DFLASH worker's in torch",
        when=CUDA_STAND_IN,
        needs=(
            "sglang.srt.speculative.dflash_utils._dflash_top_k_renorm_prob",
            "sglang.srt.speculative.dflash_utils._dflash_top_p_renorm_prob",
            "sglang.srt.layers.sampler.top_p_normalize_probs_torch",
        ),
    ),
    Entry(
        "cuda-stand-in-dual-gemm",
        "sglang.srt.layers.dual_gemm.DualGemm._select_mode",
        "sglang_kimi.cuda_stand_in.fixes:install_no_dual_gemm",
        "without the CuTe DSL (nvidia-cutlass-dsl) on a CUDA device: SGLang's Llama MLP, the EAGLE3 drafter's, "
        "imports its fused dual GEMM at construction (ModuleNotFoundError: cutlass); keep the two GEMMs",
        when=CUDA_STAND_IN,
        since=(0, 5, 22),  # the fused dual GEMM arrived there
    ),
    Entry(
        "cuda-stand-in-tree-build",
        "sglang.kernels.ops.speculative.tree.build_tree_kernel_efficient",
        "sglang_kimi.cuda_stand_in.fixes:install_tree_build",
        "without sgl_kernel on a CUDA device: EAGLE's draft-tree build is a kernel SGLang compiles at run time; "
        "run SGLang's Triton version of it",
        when=CUDA_STAND_IN,
        needs=(
            "sglang.kernels.ops.speculative.tree.build_tree_kernel_efficient",
            "sglang.kernels.ops.speculative.spec_tree.sgl_build_tree_kernel_triton",
        ),
        since=(0, 5, 23),  # SGLang's Triton version of the kernel arrived there
    ),
    Entry(
        "cuda-stand-in-tree-verify",
        "sglang.kernels.ops.speculative.tree.verify_tree_greedy",
        "sglang_kimi.cuda_stand_in.fixes:install_tree_verify",
        "without sgl_kernel on a CUDA device: EAGLE's greedy tree verify is a kernel SGLang compiles at run time; "
        "run SGLang's Triton version of it",
        when=CUDA_STAND_IN,
        needs=(
            "sglang.kernels.ops.speculative.tree.verify_tree_greedy",
            "sglang.kernels.ops.speculative.spec_tree.verify_tree_greedy_triton",
        ),
        since=(0, 5, 23),  # SGLang's Triton version of the kernel arrived there
    ),
    Entry(
        "cpu-dflash-record-stream",
        "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2.forward_batch_generation",
        "sglang_kimi.cpu.fixes:install_dflash_record_stream_guard",
        "upstream bug: DFlashWorkerV2 calls batch.seq_lens.record_stream(current_stream()) unconditionally "
        "(RuntimeError: unknown parameter type on CPU); skip it for non-CUDA tensors while that worker runs on CPU",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-future-map-record-stream",
        "sglang.srt.managers.overlap_utils.FutureMap._resolve_spec_extras",
        "sglang_kimi.cpu.fixes:install_dflash_record_stream_guard",
        "SGLang 0.5.20-0.5.21: the overlap scheduler's FutureMap._resolve_spec_extras calls "
        "indices.record_stream(current_stream()) on CPU too (RuntimeError: unknown parameter type at the first "
        "DFLASH decode); 0.5.22 skips CPU tensors there",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-no-triton",
        "sglang.srt.utils.common.support_triton",
        "sglang_kimi.cpu.fixes:install_no_triton_for_kimi_cpu",
        "SGLang 0.5.20-0.5.21: support_triton(backend) is True for every backend but torch_native and intel_amx, so "
        "with kimi_cpu the KV-index writes (write_req_to_token_pool_triton) launch Triton kernels on CPU "
        "(RuntimeError: 0 active drivers); 0.5.22 added the platform's supports_triton to that check",
        when=CPU_ONLY,
    ),
    Entry(
        "cpu-dflash-draft-rope",
        "sglang.srt.models.dflash.DFlashAttention.__init__",
        "sglang_kimi.cpu.fixes:install_dflash_draft_torch_rope",
        "upstream bug: the DFLASH drafter's attention runs q/k norm and RoPE as a Triton kernel whenever its "
        "activations are bfloat16, also on CPU (RuntimeError: 0 active drivers: a --dtype bfloat16 DFLASH server "
        "ended at its first request); on CPU take SGLang's torch path, as for every other dtype",
        when=CPU_ONLY,
        needs=(
            "sglang.srt.models.dflash.DFlashAttention.__init__",
            "sglang.srt.models.dflash.apply_qk_norm",
        ),
    ),
    Entry(
        "input-embeds-model-dtype",
        "sglang.srt.model_executor.model_runner.ModelRunner._extend_forward_kwargs",
        "sglang_kimi.cpu.fixes:install_input_embeds_dtype",
        "upstream bug: _extend_forward_kwargs casts input_embeds to bfloat16 whatever the model dtype (float32 "
        "servers fail on DFLASH's draft block, float16 ones round through bf16); cast to the model dtype",
    ),
    Entry(
        "lossless-eagle-sampling",
        "sglang.srt.speculative.eagle_utils.eagle_sample",
        "sglang_kimi.workers.eagle_sampling:install_eagle_sampling",
        "upstream bug: eagle_sample verifies sampled batches greedily on CPU and on ROCm without rejection sampling "
        "(tree_speculative_sampling_target_only is CUDA-only), so EAGLE trees there follow the target's argmax, not "
        "its distribution; verify them with the plugin's target-only tree rule (Triton on GPU, torch on CPU). "
        "Also, on every device: eagle_sample adds the step start's penalties to every node and SGLang counts only "
        "each step's last token; in a penalised batch each node gets the penalties of its own output sequence. "
        "eagle_sample applies no custom logit processor: each node's row gets the batch's processors, with the "
        "request seen at the node (its outputs and the drafts on the node's path)",
    ),
    Entry(
        "lossless-dflash-sampling",
        "sglang.srt.speculative.dflash_utils.compute_dflash_sampling_correct_drafts_and_bonus",
        "sglang_kimi.workers.dflash_sampling:install_dflash_sampling",
        "upstream bug: without the CUDA sampling kernel (ROCm, CPU) DFLASH verifies sampled requests greedily, and "
        "on CUDA without FlashInfer (whose headers SGLang builds that kernel from) its start-up warm-up fails; "
        "verify the chain with the plugin's lossless target-only rule",
    ),
    Entry(
        "lossless-dflash-sampling-available",
        "sglang.srt.speculative.dflash_utils.is_dflash_sampling_verify_available",
        "sglang_kimi.workers.dflash_sampling:install_dflash_sampling_available",
        "tells the DFLASH worker that sampled verification is available on ROCm, CPU and CUDA without FlashInfer "
        "(upstream says no and falls back to greedy argmax verification on ROCm and CPU)",
    ),
    Entry(
        "exact-penalties-dflash",
        "sglang.srt.speculative.dflash_utils.apply_dflash_verify_logits_adjustments",
        "sglang_kimi.workers.penalties:install_dflash_chain",
        "upstream bug: DFLASH verify skips frequency / presence / repetition penalties and min_new_tokens under the "
        "overlap scheduler (and applies the step start's additive ones to every position otherwise), so greedy "
        "outputs differ from non-speculative decoding; in a penalised step, each position gets the penalties of "
        "its own output sequence (chains here, trees in the plugin's worker). Custom logit processors are called "
        "with the committed outputs for every position; in a DFLASH step each position's row is processed last, "
        "with the request seen at the position",
        needs=(
            "sglang.srt.speculative.dflash_utils.apply_dflash_verify_logits_adjustments",
            "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2.forward_batch_generation",
            "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2._accept_block",
        ),
    ),
    Entry(
        "exact-penalties-sync",
        "sglang.srt.managers.schedule_batch.ScheduleBatch.grammar_needs_sync",
        "sglang_kimi.workers.penalties:install_penalty_sync",
        "a speculative batch in which a request has a penalty, min_new_tokens or a custom logit processor runs the "
        "scheduler's synchronous path (as grammar-constrained ones do), so its exact per-node penalties and "
        "processors see the previous step's tokens",
    ),
    Entry(
        "deterministic-penalty-order",
        "sglang.srt.sampling.penaltylib.orchestrator.BatchedPenalizerOrchestrator.__init__",
        "sglang_kimi.workers.penalties:install_penalty_order",
        "upstream bug: the synchronous sampler applies its penalizers in a set's iteration order, which differs "
        "between processes, so the repetition penalty came before or after frequency / presence penalties at "
        "random and such requests changed tokens across restarts; additive penalties first, scaling last, as the "
        "overlap sampler and the plugin's speculative verify apply them",
    ),
    Entry(
        "request-validation",
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        "sglang_kimi.request_validation:install_request_validation",
        "upstream gap: SGLang checks neither the prompt's token ids against the vocabulary, nor for an empty prompt, "
        "nor input_embeds' width, nor top_k / sampling_seed against the int32 / int64 tensors the scheduler packs "
        "them in, nor top_logprobs_num against the vocabulary, nor logprob_start_len below -1; each crashes the "
        "scheduler (IndexError / device-side assert in the embedding, a 0-token MoE batch, an overflow, topk out of "
        "range, a failed assertion). Refused with HTTP 400 naming the problem, for /generate and the OpenAI endpoints; "
        "so are an invalid stop_regex and per-prompt lists of the wrong length (SGLang answers HTTP 500), and n "
        "below 1, an empty stop string, stop token ids outside the vocabulary, text and input_ids together, and "
        "/v1/completions' best_of other than n and suffix (served, but not as asked); so are a JSON "
        "positional_embed_overrides (the scheduler dies) and custom_labels outside "
        "--tokenizer-metrics-allowed-custom-labels (the tokenizer manager dies under --enable-metrics), a "
        "custom_logit_processor that does not deserialize (the scheduler dies), and return_routed_experts / "
        "return_indexer_topk without the server flag that computes them (answered without them)",
        needs=(
            "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
            "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments",
            "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._validate_request",
        ),
    ),
    Entry(
        "openai-unread-fields",
        "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.handle_request",
        "sglang_kimi.openai_fields:install_openai_fields",
        "upstream gap: /v1/completions and /v1/chat/completions drop body keys their request models do not read, so "
        "a misspelt option (temprature), another server's (guided_json) or an OpenAI option SGLang does not "
        "implement (functions, audio) was served as if not sent, and a chat message's misspelt key (a system "
        "message's contents) served the message empty; refused with HTTP 400 naming the keys (and the option "
        "meant), as OpenAI refuses them. OpenAI's billing, storage and caching hints are served as before. A "
        "chat_template_kwargs key that is an argument of apply_chat_template itself (tools, add_generation_prompt: "
        "HTTP 500; truncation, tokenize) is refused naming the request field to use",
        needs=(
            "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.handle_request",
            "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.create_error_response",
            "sglang.srt.entrypoints.openai.protocol.CompletionRequest",
            "sglang.srt.entrypoints.openai.protocol.ChatCompletionRequest",
        ),
    ),
    Entry(
        "anthropic-unread-fields",
        "sglang.srt.entrypoints.anthropic.serving.AnthropicServing.handle_messages",
        "sglang_kimi.openai_fields:install_anthropic_fields",
        "upstream gap: /v1/messages and /v1/messages/count_tokens drop body keys their request models do not read "
        "(a misspelt temprature, Anthropic's container or mcp_servers, a message's misspelt key), served as if not "
        "sent; refused with HTTP 400 invalid_request_error naming them, as Anthropic refuses extra inputs",
        needs=(
            "sglang.srt.entrypoints.anthropic.serving.AnthropicServing.handle_messages",
            "sglang.srt.entrypoints.anthropic.serving.AnthropicServing.handle_count_tokens",
            "sglang.srt.entrypoints.anthropic.serving.AnthropicServing._error_response",
            "sglang.srt.entrypoints.anthropic.protocol.AnthropicMessagesRequest",
        ),
    ),
    Entry(
        "responses-unread-fields",
        "sglang.srt.entrypoints.openai.serving_responses.OpenAIServingResponses.create_responses",
        "sglang_kimi.openai_fields:install_openai_fields",
        "upstream gap: /v1/responses drops body keys its request model does not read (a misspelt option, the "
        "Responses API's conversation or prompt), served as if not sent; refused with HTTP 400 as on the other "
        "OpenAI routes",
        needs=(
            "sglang.srt.entrypoints.openai.serving_responses.OpenAIServingResponses.create_responses",
            "sglang.srt.entrypoints.openai.serving_responses.OpenAIServingResponses.create_error_response",
            "sglang.srt.entrypoints.openai.protocol.ResponsesRequest",
        ),
    ),
    Entry(
        "admin-validation",
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.configure_logging",
        "sglang_kimi.admin_validation:install_admin_validation",
        "upstream gap: admin requests end a serving server: the expert distribution endpoints without "
        "--expert-distribution-recorder-mode and /start_profile with an activity the server cannot record (any but "
        "CPU on a CPU server, RPD without rpdTracerControl) end the scheduler; /configure_logging with a "
        "log_requests_level outside 0-3 makes every later request HTTP 500; /slow_down with a sleep time the scheduler "
        "cannot sleep (1e300) ends it at the next batch, and one past the watchdog's timeout ends the server. Refused "
        "with HTTP 400 naming the fix; a failed /start_profile or /stop_profile is a 400 instead of a 500",
        needs=(
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.configure_logging",
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.start_expert_distribution_record",
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.stop_expert_distribution_record",
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.dump_expert_distribution_record",
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.start_profile",
            "sglang.srt.managers.tokenizer_manager.TokenizerManager._execute_profile",
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.slow_down",
        ),
    ),
    Entry(
        "bounded-stop-regex",
        "sglang.srt.managers.schedule_batch.Req._check_str_based_finish",
        "sglang_kimi.stop_regex:install_bounded_stop_regex",
        "upstream gap: the scheduler searches each stop_regex with re.search at every decode step (per accepted "
        "prefix in a speculative step), without a time limit, so a pattern that backtracks exponentially, such as "
        "(a|a)+b, freezes the server for minutes to days; searched with the re-compatible regex module, each search "
        "bounded, and a request whose search runs out of time ends with HTTP 400 naming the pattern",
        needs=(
            "sglang.srt.managers.schedule_batch.Req._check_str_based_finish",
            "sglang.srt.managers.schedule_batch.re",
            "sglang.srt.managers.schedule_batch.FINISH_ABORT",
        ),
    ),
    Entry(
        "route-validation",
        "sglang.srt.function_call.function_call_parser.FunctionCallParser.__init__",
        "sglang_kimi.route_validation:install_route_validation",
        "upstream gap: /parse_function_call with an unknown or missing tool_call_parser, /separate_reasoning with an "
        "unknown reasoning_parser and /vertex_generate with parameters that are not generate request fields raise "
        "in the HTTP server (HTTP 500 with no reason), and /v1/detokenize fails on a negative token id (HTTP 500) and "
        "drops one past the vocabulary silently. Refused with HTTP 400 naming the known parsers, the unknown fields "
        "or the token id",
        needs=(
            "sglang.srt.function_call.function_call_parser.FunctionCallParser.__init__",
            "sglang.srt.function_call.function_call_parser.FunctionCallParser.ToolCallParserEnum",
            "sglang.srt.parser.reasoning_parser.ReasoningParser.__init__",
            "sglang.srt.parser.reasoning_parser.ReasoningParser.DetectorMap",
            "sglang.srt.managers.io_struct.GenerateReqInput.__init__",
            "sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingDetokenize._validate_request",
        ),
    ),
    Entry(
        "vertex-contract",
        "sglang.srt.entrypoints.http_server.generate_request",
        "sglang_kimi.route_validation:install_vertex_contract",
        "upstream gap: /vertex_generate skips the API contract /generate checks its body against, so a "
        "sampling_params key that does not exist or a value of the wrong type fails in the tokenizer manager "
        "(HTTP 500). The request Vertex built is checked against /generate's contract: HTTP 400 with its message",
        needs=(
            "sglang.srt.entrypoints.http_server.generate_request",
            "sglang.srt.entrypoints.api_contract.generate_contract_error",
        ),
        since=(0, 5, 22),  # SGLang's /generate API contract arrived there
    ),
    Entry(
        "generate-body-keys",
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request",
        "sglang_kimi.route_validation:install_generate_body_check",
        "upstream gap: /generate drops body keys GenerateReqInput does not have (a sampling option outside "
        "sampling_params, a misspelt sampling_parms: served with the default sampling; SGLang's API contract, from "
        "0.5.22 on, checks sampling_params only), and before 0.5.22 a sampling_params key SamplingParams does not "
        "take was HTTP 500; both refused with HTTP 400 naming the keys",
        needs=(
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request",
            "sglang.srt.managers.io_struct.GenerateReqInput",
            "sglang.srt.sampling.sampling_params.SamplingParams",
        ),
    ),
    Entry(
        "schema-error-messages",
        "sglang.srt.entrypoints.http_server.validation_exception_handler",
        "sglang_kimi.schema_errors:install_schema_error_messages",
        "upstream gap: a body that fails its route's schema is answered with each pydantic error printed twice, the "
        "input echoed with it (a missing field echoes the whole body, prompt included), every union member's "
        "failure, and the server's source file and line. The 400 names each field and its problem in one line "
        "(OpenAI routes and /v1/responses, in SGLang's shapes; /v1/messages and /v1/systemone keep SGLang's answer)",
        needs=(
            "sglang.srt.entrypoints.http_server.validation_exception_handler",
            "sglang.srt.entrypoints.http_server.app",
            "sglang.srt.entrypoints.openai.protocol.ErrorResponse",
        ),
    ),
    Entry(
        "memory-occupation",
        "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.release_memory_occupation",
        "sglang_kimi.memory_occupation:install_memory_occupation_checks",
        "upstream bug: /release_memory_occupation while requests run fails an assertion in the scheduler, and "
        "/resume_memory_occupation of a region not released raises KeyError there; either ends the server. A "
        "release with requests in flight (generation not paused) and unknown tags are refused with HTTP 400; a "
        "release that still finds requests running releases nothing, a resume resumes only what was released",
        needs=(
            "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.release_memory_occupation",
            "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager.resume_memory_occupation",
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.release_memory_occupation",
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.resume_memory_occupation",
            "sglang.srt.managers.io_struct.ReleaseMemoryOccupationReqOutput",
            "sglang.srt.managers.io_struct.ResumeMemoryOccupationReqOutput",
            "sglang.srt.constants.GPU_MEMORY_ALL_TYPES",
        ),
    ),
    Entry(
        "session-timeout",
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.open_session",
        "sglang_kimi.sessions:install_session_timeout_check",
        "upstream gap: /open_session with a timeout of 0 or less answers the session's id and closes the session at "
        "the scheduler's next pass, so every request naming it fails; refused with HTTP 400",
    ),
    Entry(
        "session-restart",
        "sglang.srt.session.session_controller.Session.create_req",
        "sglang_kimi.sessions:install_session_restart",
        "upstream bug: a session request with replace true and no rid (start the session over) iterates the "
        "session's request dict while clearing it: RuntimeError in the scheduler, which ends the server, on any "
        "session that has served a request. The session is cleared first, as SGLang's own clear would, and the "
        "request served with no history",
        needs=(
            "sglang.srt.session.session_controller.Session.create_req",
            "sglang.srt.session.session_controller.SessionReqNode.abort",
        ),
    ),
    Entry(
        "ollama-routes",
        "sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_chat",
        "sglang_kimi.ollama_routes:install_ollama_routes",
        "upstream gaps: Ollama's /api/chat and /api/generate answer every request check's error (num_predict -5, "
        "top_k 0, a prompt beyond the context, no messages) with HTTP 500, or a stream cut after its headers; any "
        "request with the seed option is HTTP 500 (passed on as a keyword SamplingParams lacks); repeat_penalty, "
        "min_p, misspelt options, format, think, images, suffix, template and context are dropped without a word; a "
        "stream drops its last output's text and ends without token counts, and done_reason says stop when "
        "num_predict ended it. "
        'Errors answer HTTP 400 ({"error": ...}); seed, repeat_penalty, min_p and format are served; what cannot '
        "be is refused, naming it",
        needs=(
            "sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_chat",
            "sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_generate",
            "sglang.srt.entrypoints.ollama.serving.OllamaServing._convert_options_to_sampling_params",
            "sglang.srt.entrypoints.ollama.serving.OllamaServing._stream_chat_response",
            "sglang.srt.entrypoints.ollama.serving.OllamaServing._stream_generate_response",
            "sglang.srt.entrypoints.ollama.serving.OllamaServing._generate_chat_response",
            "sglang.srt.entrypoints.ollama.serving.OllamaServing._generate_generate_response",
            "sglang.srt.entrypoints.ollama.protocol.OllamaChatStreamResponse",
            "sglang.srt.entrypoints.ollama.protocol.OllamaGenerateStreamResponse",
            "sglang.srt.entrypoints.ollama.protocol.OllamaChatResponse",
            "sglang.srt.entrypoints.ollama.protocol.OllamaGenerateResponse",
        ),
    ),
    Entry(
        "streaming-session-last-token",
        "sglang.srt.session.streaming_session.StreamingSession.try_cache_finished_req",
        "sglang_kimi.sessions:install_streaming_session_commit",
        "upstream bug: a streaming session (--enable-streaming-session) on a speculative server counts the KV of a "
        "finished turn's last output token as computed, but that token is often the step's bonus token, whose slot "
        "holds a rejected draft token's KV: the next turn attends to it and its greedy output differs from the "
        "autoregressive server's. The next turn prefills that token again, as autoregressively",
    ),
    Entry(
        "gc-freeze-wait",
        "sglang.srt.entrypoints.http_server._freeze_gc_after_server_warmup",
        "sglang_kimi.gc_freeze:install_gc_freeze_wait",
        "upstream race: with --skip-server-warmup (a CPU default of `sglang-kimi serve`) SGLang posts /freeze_gc to "
        "itself before its HTTP server listens, logs the refused connection's traceback on every start and never "
        "freezes the collector. The post waits until the server's port accepts connections",
    ),
    Entry(
        "weight-update-rollback",
        "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater.update_weights_from_disk",
        "sglang_kimi.weight_update:install_weight_update_rollback",
        "upstream bug: /update_weights_from_disk records the new path before loading, so when the load fails "
        "partway (another model's checkpoint, a drafter's say) its rollback reads the new path again and the "
        "error ends the scheduler with part of the new weights loaded. The served checkpoint is loaded again and "
        "the update answered as failed, with its error",
    ),
    Entry(
        "weight-update-waits-for-idle",
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._wait_for_model_update_from_disk",
        "sglang_kimi.weight_update:install_weight_update_idle_wait",
        "upstream race: /update_weights_from_disk sent right after the last request finished reaches the scheduler "
        "while it still holds that finished batch; the flush after loading is refused (0.5.22+: HTTP 400, new "
        "weights served with the old prefix cache; 0.5.20: an assert ends the scheduler). The update waits "
        "for SGLang's waiting flush first, inside the tokenizer's model-update lock",
        needs=(
            "sglang.srt.managers.tokenizer_manager.TokenizerManager._wait_for_model_update_from_disk",
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.flush_cache",
        ),
    ),
    Entry(
        "dp-controller-waits",
        "sglang.srt.managers.data_parallel_controller.DataParallelController.event_loop",
        "sglang_kimi.dp_controller:install_blocking_dp_controller",
        "upstream busy loop: with --dp-size above 1 the data-parallel controller polls the tokenizer's socket without "
        "ever waiting and holds a CPU core at 100% while the server is idle, a core the ranks lose (on CPU, half "
        "their compute on two cores). It blocks on the socket instead, as the detokenizer does",
        needs=(
            "sglang.srt.managers.data_parallel_controller.DataParallelController.event_loop",
            "sglang.srt.managers.io_struct.sock_recv",
            "sglang.srt.utils.watchdog.Watchdog.disable",
        ),
    ),
    Entry(
        "speculative-row-headroom",
        "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len",
        "sglang_kimi.req_to_token:install_speculative_row_headroom",
        "upstream bug: speculative decoding reserves 2 x max(steps x topk, draft tokens) of KV past each request's "
        "committed length per decode step, but its req_to_token row has only 4 + draft tokens of headroom past the "
        "context (widened for UNO and pages > 1 only): a request decoding near the context's end writes past its "
        "row and the scheduler dies (DFLASH with any tree budget above ~4 and chains at the last tokens, EAGLE "
        "trees such as 3 steps of top-4). Widen the row to the reserve for every algorithm",
        needs=(
            "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len",
            "sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode",
            "sglang.srt.mem_cache.allocation_sizing.get_alloc_page_size",
            "sglang.srt.runtime_context.get_spec",
        ),
    ),
    Entry(
        "speculative-output-budget",
        "sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens",
        "sglang_kimi.kv_budget:install_speculative_output_budget",
        "upstream gap: a request's max_new_tokens is clipped to the KV pool counting one slot per decode step, but a "
        "speculative step reserves 2 x draft tokens: a request within that reserve of the pool's capacity is aborted "
        "with HTTP 500 where the autoregressive server answers it (finish_reason length). The clip counts the "
        "reserve, so the request ends with length, its tokens those of the autoregressive output",
        needs=(
            "sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens",
            "sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode",
        ),
    ),
    Entry(
        "kimi-language-model-only",
        "sglang.srt.server_args.ServerArgs.LANGUAGE_MODEL_ONLY_ARCHITECTURES",
        "sglang_kimi.models.install:install_language_model_only_arch",
        "lets --language-model-only (text-only serving, no multimodal processor) accept Kimi-K2.5/K2.6",
    ),
    Entry(
        "kimi-text-only-model",
        "sglang.srt.model_loader.utils.get_model_architecture",
        "sglang_kimi.models.install:install_text_only_kimi_class",
        "with --language-model-only, Kimi-K2.5/K2.6 is built without its MoonViT tower and its weights are skipped "
        "(SGLang 0.5.23 always builds and loads the tower); the text-only class also takes input_embeds prompts "
        "(SGLang's Kimi forward takes token ids only: an input_embeds request ended the scheduler)",
    ),
    Entry(
        "kimi-quant-dequant-fallback",
        "sglang.srt.layers.quantization.QUANTIZATION_METHODS['compressed-tensors', 'quark'] "
        "(and CPU_QUANTIZATION_METHODS)",
        "sglang_kimi.models.quant.fallback:install_dequant_fallbacks",
        "Kimi-K2.6 INT4 (compressed-tensors) and MXFP4 (Quark) checkpoints load where SGLang has no kernel for them "
        "(CPU; CUDA < sm80 for INT4; everything but ROCm gfx95x + AITER for MXFP4): those layers are dequantized "
        "at load time to the model dtype and run SGLang's unquantized layers. Where SGLang has the kernel (Marlin / "
        "Triton WNA16, AITER MXFP4) its own method is kept. Existing keys are overridden because ROCm's "
        "_verify_quantization refuses new names",
        needs=(
            "sglang.srt.layers.quantization.QUANTIZATION_METHODS",
            "sglang.srt.layers.quantization.CPU_QUANTIZATION_METHODS",
            "sglang.srt.layers.quantization.compressed_tensors.compressed_tensors.CompressedTensorsConfig",
            "sglang.srt.layers.quantization.quark.quark.QuarkConfig",
        ),
    ),
    Entry(
        "kimi-fp8-kv-scales",
        "sglang.srt.model_executor.model_runner_components.load_model_utils.load_kv_cache_scales",
        "sglang_kimi.models.kv_scales:install_kv_scales",
        "FP8 KV cache for Kimi, whose checkpoints have no KV scales (scale 1.0 clips latent values above 448): "
        "per-layer scales for the target's and the drafter's attention layers, from SGLANG_KIMI_KV_SCALES "
        "(a `sglang-kimi calibrate-kv` file; `dynamic`: running max of the first requests, then frozen; `observe`)",
    ),
    Entry(
        "kimi-kv-observe-mla",
        "sglang.srt.mem_cache.memory_pool.MLATokenToKVPool.set_kv_buffer",
        "sglang_kimi.models.kv_scales:install_mla_observer",
        "running max of the MLA latent rows (576 values per token) written to the KV cache, for dynamic FP8 KV "
        "scales and calibrate-kv; inert unless FP8 KV or SGLANG_KIMI_KV_SCALES=observe",
    ),
    Entry(
        "kimi-kv-observe-mha",
        "sglang.srt.mem_cache.memory_pool.MHATokenToKVPool.set_kv_buffer",
        "sglang_kimi.models.kv_scales:install_mha_observer",
        "running max of K and V written to MHA pools (the DFlash drafter's), so drafter layers get FP8 KV scales "
        "too (they are otherwise left at 1.0); inert unless FP8 KV or SGLANG_KIMI_KV_SCALES=observe",
    ),
    Entry(
        "plugin-flags",
        "sglang.srt.server_args.ServerArgs.add_cli_args",
        "sglang_kimi.flags:install_flag_help",
        "adds the plugin's server flags (--speculative-dflash-tree-budget) to `sglang.launch_server --help`",
    ),
    Entry(
        "plugin-flags-parse",
        "sglang.srt.server_args.ServerArgs.from_cli_args",
        "sglang_kimi.flags:install_flag_parse",
        "keeps the plugin flags' values on the server args (as bookkeeping SGLang pickles into its subprocesses)",
    ),
    Entry(
        "speculative-validation",
        "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding",
        "sglang_kimi.validation:install_validation",
        "checks drafter vs target, draft path, tree budget and attention backend before weights load (SGLang only "
        "warns on a block-size mismatch and swallows drafter-config errors), and the drafter of SGLang's other "
        "algorithms (EAGLE / NEXTN without MTP layers, STANDALONE, a DFLASH or EAGLE3 drafter given to another "
        "algorithm); sizes the DDTree verify window",
    ),
    Entry(
        "startup-errors",
        "sys.excepthook",
        "sglang_kimi.validation:install_startup_error_printer",
        "a start-up refused by the plugin (speculative-validation) prints its one-line message, not a traceback "
        "ending in it; every other exception prints as before",
        needs=(),  # Python's, not SGLang's
    ),
    Entry(
        "dflash-tree-worker",
        "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker",
        "sglang_kimi.workers.selection:install_worker_selection",
        "DFLASH with --speculative-dflash-tree-budget runs the DDTree worker (SGLang's DFLASH is chain-only)",
    ),
    Entry(
        "dflash-tree-verify-graph-mask",
        "sglang.srt.speculative.dflash_utils.resolve_dflash_verify_mask_policy",
        "sglang_kimi.workers.tree_verify_graphs:install_mask_policy",
        "DFLASH draft trees with CUDA graphs: SGLang captures the DFLASH verify graph without a custom mask on "
        "backends with a causal path (triton, FlashInfer, FlashAttention, TRT-LLM), so a tree verify replaying it "
        "would attend causally; when the tree worker serves, capture with the FULL_MASK tree mask as for EAGLE trees",
    ),
    Entry(
        "eagle-adaptive-policy",
        "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs",
        "sglang_kimi.workers.eagle_adaptive:install_policy",
        "EAGLE3 with --speculative-kimi-adaptive: once SGLang's adaptive runtime built a state per candidate step "
        "count, profiles the whole step in each state (draft, verify, draft extend) and hands SGLang's "
        "AdaptiveController the plugin's cost-aware policy (SGLang's own follows an EMA of the accept length)",
        needs=(
            "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs",
            "sglang.srt.speculative.adaptive_runtime_state.AdaptiveController._activate",
            "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker.draft_forward",
            "sglang.srt.speculative.eagle_info.EagleDraftInput",
            "sglang.srt.speculative.eagle_info.EagleDraftExtendInput",
            "sglang.srt.speculative.eagle_utils.get_draft_input_from_target_hidden_dim",
            "sglang.srt.speculative.eagle_utils.get_draft_recurrent_hidden_state_spec",
            "sglang.srt.speculative.spec_utils.draft_tp_context",
            "sglang.srt.layers.moe.utils.speculative_moe_backend_context",
            "sglang.srt.layers.moe.utils.speculative_moe_a2a_backend_context",
            "sglang.srt.mem_cache.kv_index_translator.KVIndexTranslator.bind_runner_slots",
            "sglang.srt.environ.envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND",
        ),
        since=(0, 5, 22),  # the profile binds its dummy batches with KVIndexTranslator.bind_runner_slots
    ),
    Entry(
        "eagle-adaptive-step-timing",
        "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation",
        "sglang_kimi.workers.eagle_adaptive:install_step_timing",
        "EAGLE3 with --speculative-kimi-adaptive: times each decode step for the policy's cost table",
    ),
    Entry(
        "spec-acceptance-metrics",
        "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
        "._resolve_spec_v2_tokens",
        "sglang_kimi.metrics:install",
        "counts drafted / accepted tokens per draft position and the accept-length histogram, for chains and trees "
        "(/server_info and Prometheus)",
    ),
    Entry(
        "moe-verify-configs",
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config.get_moe_configs",
        "sglang_kimi.kernels.moe_configs:install_moe_overrides",
        "serves the plugin's Triton fused-MoE tables for the verify shapes (M = batch x draft tokens) on matching "
        "devices and shapes; SGLang's own lookup otherwise",
    ),
    Entry(
        "aiter-verify-env",
        "os.environ: AITER_FLYDSL_STAGE2_TILE_K, FLYDSL_MOE_STAGE1_SCHED (read by AITER on ROCm)",
        "sglang_kimi.kernels.aiter_overrides:install_aiter_env",
        "AITER MoE switches published for the verify shape (stage-2 tile_k 256, no stage-1 scheduler hints at M=4); "
        "ROCm only, never over a user's value, off with SGLANG_KIMI_AITER_OVERRIDES=0",
        needs=(),  # environment variables for AITER: nothing in SGLang to resolve
    ),
)

# name -> "ok" | "skipped: <why>" | "failed: <error>"; filled by register_all() in this process.
STATUS: dict[str, str] = {}
_registered = False


def skip_reason(entry: Entry) -> str | None:
    """Why ``entry`` does not apply in this process (None when it does)."""
    if entry.when == CPU_ONLY and os.environ.get("SGLANG_USE_CPU_ENGINE", "0").lower() not in ("1", "true"):
        return f"only when {entry.when}"
    if entry.when == CUDA_STAND_IN and not cuda_without_sgl_kernel():
        return f"only {entry.when}"
    if not installed_sglang_has(entry):
        return f"needs SGLang {'.'.join(map(str, entry.since))} or later"
    return None


def cuda_without_sgl_kernel() -> bool:
    """A CUDA device, with the plugin's ``sgl_kernel`` shim standing in for SGLang's kernels."""
    import torch

    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False
    try:
        import sgl_kernel
    except ImportError:
        return False
    return bool(getattr(sgl_kernel, "SHIM", False))


def installed_sglang_has(entry: Entry) -> bool:
    """Whether the installed SGLang is at least the release ``entry`` needs (``Entry.since``)."""
    return entry.since is None or sglang_at_least(entry.since)[0]


def sglang_at_least(release: tuple[int, int, int]) -> tuple[bool, str]:
    """Whether the installed SGLang is ``release`` or later (release numbers only, as :func:`version_in_range`
    compares them), and its version string."""
    from packaging.version import Version
    from sglang.version import __version__ as sglang_version

    return Version(sglang_version).release[:3] >= release, sglang_version


def _load(dotted: str):
    module_name, _, attr = dotted.partition(":")
    return getattr(importlib.import_module(module_name), attr)


def register_all() -> None:
    """Run every entry of :data:`REGISTRATIONS` once in this process; never raises."""
    global _registered
    if _registered:
        return
    _registered = True
    for entry in REGISTRATIONS:
        skip = skip_reason(entry)
        if skip:
            STATUS[entry.name] = f"skipped: {skip}"
            continue
        try:
            skipped = _load(entry.install)(entry.target)
            STATUS[entry.name] = f"skipped: {skipped}" if skipped else "ok"
        except Exception as exc:  # SGLang swallows plugin errors; record ours so they stay visible
            STATUS[entry.name] = f"failed: {type(exc).__name__}: {exc}"
            if getattr(exc, "names_the_fix", False):  # a setting's error: its message is the whole story
                logger.error("sglang-kimi: registration %r failed: %s", entry.name, exc)
            else:
                logger.error("sglang-kimi: registration %r failed:\n%s", entry.name, traceback.format_exc())
    failed = [name for name, state in STATUS.items() if state.startswith("failed")]
    logger.info(
        "sglang-kimi %s registered %d entries%s",
        _version(),
        len(STATUS) - len(failed),
        f"; FAILED: {', '.join(failed)}" if failed else "",
    )


def _version() -> str:
    from sglang_kimi.version import __version__

    return __version__


def registration_state() -> dict:
    """The plugin's registrations in this process, as reported in /server_info and by `doctor`: each entry's
    outcome, with "ok" hooks that SGLang then failed to apply reported as failed."""
    from sglang_kimi.hooks import hook_applied, registered_targets
    from sglang_kimi.version import SUPPORTED_SGLANG

    status = dict(STATUS)
    hooked = registered_targets()
    for entry in REGISTRATIONS:
        if status.get(entry.name) == "ok" and entry.target in hooked and not hook_applied(entry.target):
            status[entry.name] = "failed: SGLang did not apply the hook (see the server log)"
    return {
        "version": _version(),
        "pid": os.getpid(),
        "supported_sglang": list(SUPPORTED_SGLANG),
        "registrations": status,
        "failed": sorted(name for name, state in status.items() if state.startswith("failed")),
    }


# ---------------------------------------------------------------------------------------------------------------
# The entry that belongs to the plugin itself.


def version_in_range(version: str, supported: tuple[str, str]) -> bool:
    """Compare release numbers only: 0.5.23.post1 and 0.5.23+rocm count as 0.5.23."""
    from packaging.version import Version

    def release(v: str) -> tuple[int, ...]:
        return Version(v).release[:3]

    return release(supported[0]) <= release(version) <= release(supported[1])


def check_sglang_version(target: str):
    from sglang.version import __version__ as sglang_version

    from sglang_kimi.version import SUPPORTED_SGLANG

    if not version_in_range(sglang_version, SUPPORTED_SGLANG):
        lo, hi = SUPPORTED_SGLANG
        tested = lo if lo == hi else f"{lo} to {hi}"
        logger.warning(
            "sglang-kimi %s is tested with sglang %s; the installed sglang is %s: its hooks may not apply",
            _version(),
            tested,
            sglang_version,
        )
        return f"sglang {sglang_version} is outside the tested range {tested}"
    return None
