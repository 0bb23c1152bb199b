"""The speculative entries of the registration table: the workers, lossless verification, the fixes a speculative
server needs to stay up and exact, start-up checks, adaptive speculation, metrics and the verify-shape kernels.
Data only; ``plugin.py`` runs them. Each module's docstring has the detail."""

from sglang_kimi.hooks import Entry

_SPEC = "sglang_kimi.speculative"
_WORKERS = f"{_SPEC}.workers"
_DFLASH_WORKER = "sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2"

ENTRIES: tuple[Entry, ...] = (
    Entry(
        "input-embeds-model-dtype",
        "sglang.srt.model_executor.model_runner.ModelRunner._extend_forward_kwargs",
        f"{_SPEC}.draft_input_embeds:install_input_embeds_dtype",
        "upstream bug: input embeddings (DFLASH's draft block) are cast to bfloat16 whatever the model dtype",
    ),
    Entry(
        "lossless-eagle-sampling",
        "sglang.srt.speculative.eagle_utils.eagle_sample",
        f"{_WORKERS}.eagle_sampling:install_eagle_sampling",
        "upstream bug: sampled EAGLE trees are verified greedily on CPU and ROCm, and penalties and custom logit "
        "processors reach the nodes wrongly; each node's row gets exactly what a non-speculative step applies",
    ),
    Entry(
        "lossless-dflash-sampling",
        "sglang.srt.speculative.dflash_utils.compute_dflash_sampling_correct_drafts_and_bonus",
        f"{_WORKERS}.dflash_sampling:install_dflash_sampling",
        "upstream bug: without the CUDA sampling kernel (ROCm, CPU, no FlashInfer) DFLASH verifies sampled requests "
        "greedily; verify the chain with the lossless target-only rule",
    ),
    Entry(
        "lossless-dflash-sampling-available",
        "sglang.srt.speculative.dflash_utils.is_dflash_sampling_verify_available",
        f"{_WORKERS}.dflash_sampling:install_dflash_sampling_available",
        "tells the DFLASH worker that sampled verification is available on ROCm, CPU and CUDA without FlashInfer",
    ),
    Entry(
        "exact-penalties-dflash",
        "sglang.srt.speculative.dflash_utils.apply_dflash_verify_logits_adjustments",
        f"{_WORKERS}.penalty_hooks:install_dflash_chain",
        "upstream bug: DFLASH verify skips or misplaces penalties, min_new_tokens and custom logit processors; each "
        "position gets those of its own output sequence",
        hooks=(f"{_DFLASH_WORKER}.forward_batch_generation", f"{_DFLASH_WORKER}._accept_block"),
    ),
    Entry(
        "exact-penalties-sync",
        "sglang.srt.managers.schedule_batch.ScheduleBatch.grammar_needs_sync",
        f"{_WORKERS}.penalty_hooks:install_penalty_sync",
        "a speculative batch with penalties or custom logit processors runs the synchronous path, as grammar does",
    ),
    Entry(
        "deterministic-penalty-order",
        "sglang.srt.sampling.penaltylib.orchestrator.BatchedPenalizerOrchestrator.__init__",
        f"{_WORKERS}.penalty_hooks:install_penalty_order",
        "upstream bug: the synchronous sampler's penalizer order differs between processes; additive ones first, "
        "as the speculative verify applies them",
    ),
    Entry(
        "streaming-session-last-token",
        "sglang.srt.session.streaming_session.StreamingSession.try_cache_finished_req",
        f"{_SPEC}.streaming_sessions:install_streaming_session_commit",
        "upstream bug: a streaming session's next turn attends to a rejected draft's KV in the bonus token's slot; "
        "it prefills that token again, as autoregressively",
    ),
    Entry(
        "speculative-row-headroom",
        "sglang.srt.mem_cache.allocation_sizing.get_req_to_token_extra_context_len",
        f"{_SPEC}.req_to_token:install_speculative_row_headroom",
        "upstream bug: a request decoding near the context's end writes past its req_to_token row (the scheduler "
        "dies); the row is widened to the KV a speculative step reserves",
        reads=(
            "sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode",
            "sglang.srt.mem_cache.allocation_sizing.get_alloc_page_size",
            "sglang.srt.runtime_context.get_spec",
        ),
    ),
    Entry(
        "speculative-output-budget",
        "sglang.srt.managers.scheduler.Scheduler.init_req_max_new_tokens",
        f"{_SPEC}.kv_budget:install_speculative_output_budget",
        "upstream gap: max_new_tokens near the KV pool's size aborts with HTTP 500 on a speculative server; the "
        "clip counts a speculative step's reserve, so it ends with length as autoregressively",
        reads=("sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode",),
    ),
    Entry(
        "speculative-validation",
        "sglang.srt.arg_groups.speculative_hook.handle_speculative_decoding",
        f"{_SPEC}.validation:install_validation",
        "checks drafter, draft path, tree budget and attention backend before weights load; sizes the DDTree window",
    ),
    Entry(
        "startup-errors",
        "sys.excepthook",
        f"{_SPEC}.validation:install_startup_error_printer",
        "a start-up the plugin refuses prints its one-line message, not a traceback ending in it",
    ),
    Entry(
        "dflash-tree-worker",
        "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker",
        f"{_WORKERS}.worker_selection:install_worker_selection",
        "DFLASH with --speculative-dflash-tree-budget runs the DDTree worker (SGLang's DFLASH is chain-only)",
    ),
    Entry(
        "dflash-tree-verify-graph-mask",
        "sglang.srt.speculative.dflash_utils.resolve_dflash_verify_mask_policy",
        f"{_WORKERS}.tree_verify_graphs:install_mask_policy",
        "DFLASH trees with CUDA graphs: the verify graph is captured with the tree mask, not causally",
    ),
    Entry(
        "eagle-adaptive-policy",
        "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2.init_cuda_graphs",
        f"{_SPEC}.adaptive.eagle:install_policy",
        "EAGLE3 with --speculative-kimi-adaptive: profiles each step count's state and steers SGLang's "
        "AdaptiveController with the plugin's cost-aware policy",
        reads=(
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
        f"{_SPEC}.adaptive.eagle:install_step_timing",
        "EAGLE3 with --speculative-kimi-adaptive: times each decode step for the policy's cost table",
    ),
    Entry(
        "spec-acceptance-metrics",
        "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
        "._resolve_spec_v2_tokens",
        f"{_SPEC}.metrics:install",
        "drafted / accepted tokens per draft position and the accept-length histogram (/server_info, Prometheus)",
    ),
    Entry(
        "step-phases",
        f"{_DFLASH_WORKER}.forward_batch_generation",
        f"{_SPEC}.step_phases:install_step_phases",
        "each DFLASH decode step's host time, and SGLang's chain step and target forward as named profiler ranges",
        hooks=("sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation",),
    ),
    Entry(
        "moe-verify-configs",
        "sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe_triton_config.get_moe_configs",
        "sglang_kimi.kernels.moe_configs:install_moe_overrides",
        "the plugin's Triton fused-MoE tables for the verify shapes (M = batch x draft tokens) where they match",
    ),
    Entry(
        "aiter-verify-env",
        "os.environ: AITER_FLYDSL_STAGE2_TILE_K, FLYDSL_MOE_STAGE1_SCHED (read by AITER on ROCm)",
        "sglang_kimi.kernels.aiter_overrides:install_aiter_env",
        "AITER MoE switches for the verify shape on ROCm, never over a user's value (SGLANG_KIMI_AITER_OVERRIDES=0)",
    ),
)
