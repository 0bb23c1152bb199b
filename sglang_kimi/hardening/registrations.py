"""The hardening entries of the registration table: fixes to SGLang's API behaviour that is not about Kimi or
speculative decoding (requests that crashed or froze a server, or were served other than asked).
``SGLANG_KIMI_HARDENING=0`` turns the whole group off. A new entry belongs here only if it keeps a server from
crashing or answering wrong. Data only; ``plugin.py`` runs them. Each module's docstring has the detail."""

from sglang_kimi.hooks import Entry

_HARDENING = "sglang_kimi.hardening"
_TOKENIZER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_OPENAI = "sglang.srt.entrypoints.openai"
_ANTHROPIC = "sglang.srt.entrypoints.anthropic"
_OLLAMA = "sglang.srt.entrypoints.ollama.serving.OllamaServing"
_OLLAMA_PROTOCOL = "sglang.srt.entrypoints.ollama.protocol"
_WEIGHT_UPDATER = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager"
_IO = "sglang.srt.managers.io_struct"

ENTRIES: tuple[Entry, ...] = (
    Entry(
        "request-validation",
        f"{_TOKENIZER}._validate_one_request",
        f"{_HARDENING}.request_validation:install_request_validation",
        "upstream gap: requests that crash the scheduler (token ids outside the vocabulary, an empty prompt, "
        "overflowing top_k or seed, ...) and ones served other than asked are refused with HTTP 400",
        hooks=(
            f"{_OPENAI}.serving_completions.OpenAIServingCompletion._validate_request",
            f"{_IO}.GenerateReqInput.normalize_batch_and_arguments",
        ),
    ),
    Entry(
        "openai-unread-fields",
        f"{_OPENAI}.serving_base.OpenAIServingBase.handle_request",
        f"{_HARDENING}.openai_fields:install_openai_fields",
        "upstream gap: /v1/completions and /v1/chat/completions drop keys they do not read (a misspelt temprature); "
        "refused with HTTP 400 naming them, as OpenAI does",
        reads=(
            f"{_OPENAI}.serving_base.OpenAIServingBase.create_error_response",
            f"{_OPENAI}.protocol.CompletionRequest",
            f"{_OPENAI}.protocol.ChatCompletionRequest",
        ),
    ),
    Entry(
        "anthropic-unread-fields",
        f"{_ANTHROPIC}.serving.AnthropicServing.handle_messages",
        f"{_HARDENING}.openai_fields:install_anthropic_fields",
        "upstream gap: /v1/messages and its token count drop keys they do not read; refused as Anthropic does",
        hooks=(f"{_ANTHROPIC}.serving.AnthropicServing.handle_count_tokens",),
        reads=(
            f"{_ANTHROPIC}.serving.AnthropicServing._error_response",
            f"{_ANTHROPIC}.protocol.AnthropicMessagesRequest",
        ),
    ),
    Entry(
        "responses-unread-fields",
        f"{_OPENAI}.serving_responses.OpenAIServingResponses.create_responses",
        f"{_HARDENING}.openai_fields:install_openai_fields",
        "upstream gap: /v1/responses drops keys it does not read; refused with HTTP 400 as on the other OpenAI routes",
        reads=(
            f"{_OPENAI}.serving_responses.OpenAIServingResponses.create_error_response",
            f"{_OPENAI}.protocol.ResponsesRequest",
        ),
    ),
    Entry(
        "admin-validation",
        f"{_TOKENIZER}.configure_logging",
        f"{_HARDENING}.admin_validation:install_admin_validation",
        "upstream gap: admin requests that end a serving server (expert records, profiles it cannot take, "
        "/slow_down past the watchdog, bad logging levels) are refused with HTTP 400",
        hooks=(
            f"{_TOKENIZER}.start_expert_distribution_record",
            f"{_TOKENIZER}.stop_expert_distribution_record",
            f"{_TOKENIZER}.dump_expert_distribution_record",
            f"{_TOKENIZER}.start_profile",
            f"{_TOKENIZER}._execute_profile",
            f"{_TOKENIZER}.slow_down",
        ),
    ),
    Entry(
        "bounded-stop-regex",
        "sglang.srt.managers.schedule_batch.Req._check_str_based_finish",
        f"{_HARDENING}.stop_regex:install_bounded_stop_regex",
        "upstream gap: a backtracking stop_regex freezes the scheduler; each search is bounded, HTTP 400 past it",
        reads=("sglang.srt.managers.schedule_batch.re", "sglang.srt.managers.schedule_batch.FINISH_ABORT"),
    ),
    Entry(
        "route-validation",
        "sglang.srt.function_call.function_call_parser.FunctionCallParser.__init__",
        f"{_HARDENING}.route_validation:install_route_validation",
        "upstream gap: unknown parsers, unknown /vertex_generate fields and out-of-vocabulary /v1/detokenize ids "
        "are HTTP 500 or silence; refused with HTTP 400 naming them",
        hooks=(
            "sglang.srt.parser.reasoning_parser.ReasoningParser.__init__",
            f"{_IO}.GenerateReqInput.__init__",
            f"{_OPENAI}.serving_tokenize.OpenAIServingDetokenize._validate_request",
        ),
        reads=(
            "sglang.srt.function_call.function_call_parser.FunctionCallParser.ToolCallParserEnum",
            "sglang.srt.parser.reasoning_parser.ReasoningParser.DetectorMap",
        ),
    ),
    Entry(
        "vertex-contract",
        "sglang.srt.entrypoints.http_server.generate_request",
        f"{_HARDENING}.route_validation:install_vertex_contract",
        "upstream gap: /vertex_generate skips /generate's API contract (HTTP 500); checked against it, HTTP 400",
        reads=("sglang.srt.entrypoints.api_contract.generate_contract_error",),
        since=(0, 5, 22),  # SGLang's /generate API contract arrived there
    ),
    Entry(
        "generate-body-keys",
        f"{_TOKENIZER}.generate_request",
        f"{_HARDENING}.route_validation:install_generate_body_check",
        "upstream gap: /generate drops body keys it does not have (a misspelt sampling_parms); HTTP 400 naming them",
        reads=(f"{_IO}.GenerateReqInput", "sglang.srt.sampling.sampling_params.SamplingParams"),
    ),
    Entry(
        "schema-error-messages",
        "sglang.srt.entrypoints.http_server.validation_exception_handler",
        f"{_HARDENING}.schema_errors:install_schema_error_messages",
        "upstream gap: a body failing its schema is answered with pydantic's errors twice, the input echoed and a "
        "source path; the 400 names each field and its problem in one line",
        reads=("sglang.srt.entrypoints.http_server.app", f"{_OPENAI}.protocol.ErrorResponse"),
    ),
    Entry(
        "memory-occupation",
        f"{_TOKENIZER}.release_memory_occupation",
        f"{_HARDENING}.memory_occupation:install_memory_occupation_checks",
        "upstream bug: releasing memory while requests run, or resuming what was not released, ends the server; "
        "refused with HTTP 400, and the scheduler releases nothing while busy",
        hooks=(
            f"{_TOKENIZER}.resume_memory_occupation",
            f"{_WEIGHT_UPDATER}.release_memory_occupation",
            f"{_WEIGHT_UPDATER}.resume_memory_occupation",
        ),
        reads=(
            f"{_IO}.ReleaseMemoryOccupationReqOutput",
            f"{_IO}.ResumeMemoryOccupationReqOutput",
            "sglang.srt.constants.GPU_MEMORY_ALL_TYPES",
        ),
    ),
    Entry(
        "session-timeout",
        f"{_TOKENIZER}.open_session",
        f"{_HARDENING}.sessions:install_session_timeout_check",
        "upstream gap: /open_session with a timeout of 0 or less closes the session at once; HTTP 400",
    ),
    Entry(
        "session-restart",
        "sglang.srt.session.session_controller.Session.create_req",
        f"{_HARDENING}.sessions:install_session_restart",
        "upstream bug: starting a session over (replace, no rid) ends the server; the session is cleared first",
        reads=("sglang.srt.session.session_controller.SessionReqNode.abort",),
    ),
    Entry(
        "ollama-routes",
        f"{_OLLAMA}.handle_chat",
        f"{_HARDENING}.ollama_routes:install_ollama_routes",
        "upstream gaps: Ollama's routes answer request errors with HTTP 500 and drop or break options (seed); errors "
        "are HTTP 400, seed, repeat_penalty, min_p and format served, the rest refused by name",
        hooks=(
            f"{_OLLAMA}.handle_generate",
            f"{_OLLAMA}._convert_options_to_sampling_params",
            f"{_OLLAMA}._stream_chat_response",
            f"{_OLLAMA}._stream_generate_response",
            f"{_OLLAMA}._generate_chat_response",
            f"{_OLLAMA}._generate_generate_response",
        ),
        reads=(
            f"{_OLLAMA_PROTOCOL}.OllamaChatStreamResponse",
            f"{_OLLAMA_PROTOCOL}.OllamaGenerateStreamResponse",
            f"{_OLLAMA_PROTOCOL}.OllamaChatResponse",
            f"{_OLLAMA_PROTOCOL}.OllamaGenerateResponse",
        ),
    ),
    Entry(
        "gc-freeze-wait",
        "sglang.srt.entrypoints.http_server._freeze_gc_after_server_warmup",
        f"{_HARDENING}.gc_freeze:install_gc_freeze_wait",
        "upstream race: with --skip-server-warmup the GC freeze is posted before the server listens; it waits",
    ),
    Entry(
        "weight-update-rollback",
        "sglang.srt.model_executor.model_runner_components.weight_updater.WeightUpdater.update_weights_from_disk",
        f"{_HARDENING}.weight_update:install_weight_update_rollback",
        "upstream bug: a failed /update_weights_from_disk ends the scheduler half-loaded; the served checkpoint is "
        "loaded again and the update answered as failed",
    ),
    Entry(
        "weight-update-waits-for-idle",
        f"{_TOKENIZER}._wait_for_model_update_from_disk",
        f"{_HARDENING}.weight_update:install_weight_update_idle_wait",
        "upstream race: a weight update right after the last request is refused its cache flush; it waits for idle",
        reads=(f"{_TOKENIZER}.flush_cache",),
    ),
    Entry(
        "dp-controller-waits",
        "sglang.srt.managers.data_parallel_controller.DataParallelController.event_loop",
        f"{_HARDENING}.dp_controller:install_blocking_dp_controller",
        "upstream busy loop: with --dp-size above 1 the idle controller holds a core at 100%; it blocks instead",
        reads=(f"{_IO}.sock_recv", "sglang.srt.utils.watchdog.Watchdog.disable"),
    ),
)
