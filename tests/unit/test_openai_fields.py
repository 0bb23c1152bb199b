"""Keys of an OpenAI request body that SGLang's request models would drop: found by validating without each key."""

import copy
import json
import types

import pytest

from sglang_kimi.hardening.openai_fields import template_call_arguments, unread_fields, unused_options

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION = {"model": "m", "prompt": "hi"}
RESPONSES = {"model": "m", "input": "hi"}
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}


@pytest.fixture(scope="module")
def models():
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ResponsesRequest

    return {
        "chat": (ChatCompletionRequest, CHAT),
        "completion": (CompletionRequest, COMPLETION),
        "responses": (ResponsesRequest, RESPONSES),
    }


@pytest.mark.parametrize(
    "kind, extra, words",
    [
        ("completion", {"temprature": 1.5}, ["'temprature' (did you mean 'temperature'?)", "fix or drop it"]),
        ("completion", {"max_tokns": 3}, ["did you mean 'max_tokens'?"]),
        ("chat", {"guided_json": {"type": "object"}}, ["unrecognized request argument 'guided_json'"]),
        ("chat", {"functions": [{"name": "f"}], "function_call": "auto"}, ["send tools instead", "send tool_choice"]),
        ("chat", {"modalities": ["text", "audio"]}, ["generates text only"]),
        ("chat", {"temperature": 0.5, "top_pp": 0.9, "stop_seqs": ["x"]}, ["'top_pp'", "'stop_seqs'", "them"]),
        (  # a system message whose misspelt content was dropped: the conversation was served without it
            "chat",
            {"messages": [{"role": "system", "contents": "Be terse."}, {"role": "user", "content": "hi"}]},
            ["'contents' (did you mean 'content'?) in messages[0]", "fix or drop it"],
        ),
        (  # one message key and one request key: both named; a key repeated in every message named once
            "chat",
            {
                "messages": [{"role": "user", "content": "a", "id": 1}, {"role": "tool", "content": "b", "id": 2}],
                "x": 1,
            },
            ["'x'; 'id' in messages[0]", "them"],
        ),
        ("responses", {"max_output_tokns": 4}, ["did you mean 'max_output_tokens'?"]),
        ("responses", {"conversation": "conv_1", "prompt": {"id": "p"}}, ["'conversation'; 'prompt'"]),
    ],
)
def test_unread_keys_are_named(models, kind, extra, words):
    model, base = models[kind]
    problem = unread_fields(model, {**base, **extra})
    assert problem is not None and all(w in problem for w in words), problem


@pytest.mark.parametrize(
    "kind, extra",
    [
        ("chat", {"temperature": 0.5, "top_k": 5, "max_tokens": 4, "stream_options": {"include_usage": True}}),
        ("chat", {"reasoning": {"effort": "low"}}),  # read by a validator into reasoning_effort
        ("chat", {"data_parallel_rank": 0}),  # SGLang's deprecated spelling of routed_dp_rank
        ("chat", {"store": True, "metadata": {"a": "b"}, "service_tier": "auto", "modalities": ["text"]}),
        ("chat", {"response_format": {"type": "json_schema", "schema": {"type": "object"}}}),
        ("completion", {"echo": True, "logprobs": 2, "user": "u", "prediction": {"type": "content", "content": "x"}}),
        (  # every message field, and a response message sent back with OpenAI's empty response fields
            "chat",
            {
                "messages": [
                    {"role": "system", "content": "s", "name": "rules"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL], "refusal": None, "audio": None},
                    {"role": "tool", "content": "4", "tool_call_id": "c1"},
                    {"role": "assistant", "content": "4.", "reasoning_content": "", "annotations": []},
                ]
            },
        ),
        (  # the Responses API's own options, and OpenAI's hints with nothing to serve
            "responses",
            {
                "instructions": "Be terse.",
                "max_output_tokens": 8,
                "reasoning": {"effort": "low"},
                "text": {"format": {"type": "text"}},
                "store": False,
                "stream_options": {"include_obfuscation": False},
                "prompt_cache_key": "k",
                "safety_identifier": "u1",
            },
        ),
        (  # content parts are not checked: their extra keys are caching hints
            "chat",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"a": 1}}]}]},
        ),
    ],
)
def test_read_keys_and_openai_hints_are_served(models, kind, extra):
    model, base = models[kind]
    body = {**base, **extra}
    before = copy.deepcopy(body)
    assert unread_fields(model, body) is None
    assert body == before  # SGLang's validators edit nested values; the check works on copies


def test_the_hook_is_skipped_where_the_route_s_module_does_not_import(monkeypatch):
    """SGLang imports its Responses API module optionally (it needs openai_harmony) and serves without the route
    where that fails; the plugin then skips its hook with the reason instead of a hook SGLang cannot apply."""
    from sglang_kimi.hardening import openai_fields

    target = "sglang.srt.entrypoints.openai.serving_responses.OpenAIServingResponses.create_responses"
    real_import = openai_fields.importlib.import_module

    def without_harmony(name, *args):
        if name == "sglang.srt.entrypoints.openai.serving_responses":
            raise ModuleNotFoundError("No module named 'openai_harmony'")
        return real_import(name, *args)

    registered = []
    monkeypatch.setattr(openai_fields, "hook", lambda *a: registered.append(a))
    monkeypatch.setattr(openai_fields.importlib, "import_module", without_harmony)
    reason = openai_fields.install_openai_fields(target)
    assert "serving_responses does not import here (No module named 'openai_harmony')" in reason
    assert registered == []
    monkeypatch.setattr(openai_fields.importlib, "import_module", lambda name, *a: types.ModuleType(name))
    assert openai_fields.install_openai_fields(target) is None  # where it imports, the hook is registered
    assert [a[0] for a in registered] == [target]


def test_chat_top_logprobs_need_logprobs(models):
    """Chat's top_logprobs without logprobs true: SGLang answered without log-probabilities (OpenAI refuses it)."""
    model, base = models["chat"]
    for extra in ({"top_logprobs": 3}, {"top_logprobs": 3, "logprobs": False}):
        problem = unused_options(model, {**base, **extra})
        assert problem is not None and "top_logprobs 3 without logprobs true" in problem, problem
    for extra in ({"top_logprobs": 3, "logprobs": True}, {"top_logprobs": 0}, {"logprobs": True}, {}):
        assert unused_options(model, {**base, **extra}) is None, extra
    completion, body = models["completion"]
    assert unused_options(completion, {**body, "logprobs": 3}) is None  # an int there: the count itself


@pytest.mark.parametrize("kind", ["chat", "completion", "responses"])
def test_stream_options_need_stream(models, kind):
    """stream_options without stream true: read by nothing (OpenAI refuses it)."""
    model, base = models[kind]
    for extra in ({"stream_options": {"include_usage": True}}, {"stream_options": {}, "stream": False}):
        problem = unused_options(model, {**base, **extra})
        assert problem is not None and "stream_options without stream true" in problem, problem
    for extra in ({"stream_options": {"include_usage": True}, "stream": True}, {"stream_options": None}, {}):
        assert unused_options(model, {**base, **extra}) is None, extra


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"add_generation_prompt": False}, ["'add_generation_prompt' is an argument", "continue_final_message"]),
        ({"enable_thinking": True, "tools": []}, ["'tools'", "send tools as the request's tools"]),
        ({"messages": 5}, ["'messages'", "request's messages"]),
        ({"truncation": True, "max_length": 8}, ["'truncation'", "tokenizes the prompt itself"]),
        ({"return_tensors": "pt"}, ["'return_tensors'"]),
        ({"continue_final_message": True}, ["as a request field"]),
    ],
)
def test_template_call_arguments_are_not_template_variables(models, kwargs, words):
    """chat_template_kwargs keys that clash with apply_chat_template's own parameters (SGLang answered HTTP 500 for
    the ones it passes itself) are refused, naming the field that serves the purpose."""
    model, base = models["chat"]
    problem = template_call_arguments(model, {**base, "chat_template_kwargs": kwargs})
    assert problem is not None and all(word in problem for word in words), problem


def test_template_variables_pass(models):
    model, base = models["chat"]
    for kwargs in ({"enable_thinking": False}, {"thinking": True, "documents": [], "chat_template": "x"}, {}, None):
        assert template_call_arguments(model, {**base, "chat_template_kwargs": kwargs}) is None, kwargs
    completion, body = models["completion"]  # no chat template on that route
    assert template_call_arguments(completion, {**body, "chat_template_kwargs": {"tools": 1}}) is None


ANTHROPIC = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def anthropic():
    from sglang.srt.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest

    return AnthropicMessagesRequest, AnthropicCountTokensRequest


@pytest.mark.parametrize(
    "extra, words",
    [
        ({"temprature": 0.5}, ["'temprature' (did you mean 'temperature'?)"]),
        ({"container": "c1"}, ["'container'"]),
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "n"}]}, ["'mcp_servers'"]),
        ({"messages": [{"role": "user", "content": "hi", "contents": "x"}]}, ["'contents'", "in messages[0]"]),
    ],
)
def test_anthropic_messages_keys_it_would_drop(anthropic, extra, words):
    messages, _ = anthropic
    problem = unread_fields(messages, {**ANTHROPIC, **extra})
    assert problem is not None and all(w in problem for w in words), problem


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"system": "be brief", "stop_sequences": ["x"], "top_k": 3, "top_p": 0.9, "temperature": 0.5, "stream": True},
        {"metadata": {"user_id": "u"}, "service_tier": "auto"},
        {"thinking": {"type": "enabled", "budget_tokens": 1024}},
        {"tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"}},
    ],
)
def test_anthropic_messages_keys_it_reads(anthropic, extra):
    messages, _ = anthropic
    assert unread_fields(messages, {**ANTHROPIC, **extra}) is None


def test_anthropic_token_count_takes_a_messages_body_whole(anthropic):
    messages, count = anthropic
    harmless = frozenset(messages.model_fields)
    body = {**ANTHROPIC, "temperature": 0.5, "stream": False, "system": "s"}
    assert unread_fields(count, body, harmless) is None
    assert "'sytem'" in unread_fields(count, {**ANTHROPIC, "sytem": "s"}, harmless)


def test_anthropic_refusal_is_in_anthropics_shape(anthropic):
    import asyncio

    from sglang_kimi.hardening.openai_fields import check_anthropic_fields

    messages, _ = anthropic

    class Raw:
        def __init__(self, body):
            self.body_bytes = json.dumps(body).encode()

        async def body(self):
            return self.body_bytes

    class Serving:
        def _error_response(self, status_code, error_type, message):
            return (status_code, error_type, message)

    async def original(serving, request, raw_request):
        return "served"

    def answer(body):
        request = messages.model_validate(body)
        return asyncio.run(check_anthropic_fields(original, Serving(), request, Raw(body)))

    status, kind, message = answer({**ANTHROPIC, "temprature": 0.5})
    assert (status, kind) == (400, "invalid_request_error") and "'temprature'" in message
    assert answer(ANTHROPIC) == "served"
