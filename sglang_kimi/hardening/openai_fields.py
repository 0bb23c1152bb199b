"""Fields of an OpenAI or Anthropic request that SGLang would drop without a word, answered with HTTP 400 instead.

SGLang parses ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/responses`` bodies into pydantic models that
ignore keys they do not have: a misspelt option (``temprature``), another server's option (vLLM's ``guided_json``)
or an OpenAI option SGLang does not implement (``functions``, the Responses API's ``conversation``) was served as if
it had not been sent, so the output was not what the client asked for. OpenAI's own API refuses such a request
("Unrecognized request argument"); so does this hook. The items of a Responses ``input`` are not checked.

A key is unread when validating the body without it gives the same request: that covers the models' fields and
every key their validators read (``reasoning``, the deprecated ``data_parallel_rank``) in every SGLang release,
without a list of them. OpenAI options that change nothing a server computes (billing, storage and caching hints
such as ``store`` or ``service_tier``, ``prediction``, ``modalities: ["text"]``) are served as before.

The keys of each chat message are checked the same way. A message model ignores keys it lacks too, and a misspelt
``content`` on a ``system``, ``developer``, ``assistant`` or ``tool`` message (whose content may be left out) served
the conversation without that message's text. A message key whose value is empty (``null``, ``""``, ``[]``, ``{}``)
carries nothing to drop and is served: clients that send a response's message back in the history add OpenAI's
response fields that way (``"refusal": null``, ``"annotations": []``). Content parts are not checked: their unread
keys are caching hints such as ``cache_control``.

Anthropic's ``/v1/messages`` and ``/v1/messages/count_tokens`` bodies are checked the same way (their models ignore
unknown keys too; Anthropic's API refuses them as extra inputs), and refused in Anthropic's error shape.

Some options are read only together with another: chat's ``top_logprobs`` without ``logprobs: true`` was answered
without log-probabilities, and ``stream_options`` without ``stream: true`` was read by nothing; OpenAI refuses such a
request, and so does this hook.

A chat request's ``chat_template_kwargs`` become variables of the chat template, passed to the tokenizer's
``apply_chat_template`` together with the arguments SGLang gives it itself. A key named like one of that call's own
parameters is not a template variable: ``add_generation_prompt``, ``tools`` or ``messages`` clashed with SGLang's own
argument (HTTP 500, "Internal server error: 'tools'"), and the others (``tokenize``, ``truncation``,
``max_length``, ``return_tensors``, ...) would change how the prompt is rendered or tokenized. They are refused,
naming the request field that serves the purpose. ``chat_template`` (SGLang reads it) and ``documents`` (a template
input) pass.
"""

from __future__ import annotations

import copy
import difflib
import functools
import importlib
import json
import typing

import pydantic

from sglang_kimi.hooks import hook

ROUTES = {  # the routes checked, with the request model each parses its body into
    "/v1/completions": "CompletionRequest",
    "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/responses": "ResponsesRequest",
}
MAX_NAMED = 5  # unread keys named in one answer

# OpenAI options with nothing to serve here and no effect on the tokens: accepted as OpenAI accepts them
# (stream_options is a field of the other routes; on /v1/responses, {"include_obfuscation": ...} pads its events)
NO_EFFECT = (
    "store",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "prediction",
    "user",
    "stream_options",
)
# OpenAI options SGLang does not implement, with what to send instead
NOT_SERVED = {
    "functions": "send tools instead (functions is OpenAI's deprecated form)",
    "function_call": "send tool_choice (with tools) instead (function_call is OpenAI's deprecated form)",
    "audio": "this server generates text only",
    "modalities": 'this server generates text only (send ["text"] or leave it out)',
    "web_search_options": "this server does not search the web",
    "verbosity": "not served: ask for the length in the prompt, or bound it with max_tokens",
}


_TOKENIZED_BY_THE_SERVER = "the server renders the template to text and tokenizes the prompt itself: drop it"
# apply_chat_template's own parameters (transformers), with what to send instead of a chat_template_kwargs key
TEMPLATE_CALL_ARGUMENTS = {
    "conversation": "send the conversation as the request's messages",
    "messages": "send the conversation as the request's messages",
    "tools": "send tools as the request's tools",
    "add_generation_prompt": "the server opens the assistant's turn itself; to continue the last assistant message "
    'instead, send "continue_final_message": true as a request field',
    "continue_final_message": "send continue_final_message as a request field",
    **dict.fromkeys(
        (
            "tokenize",
            "padding",
            "truncation",
            "max_length",
            "return_tensors",
            "return_dict",
            "return_assistant_tokens_mask",
            "tokenizer_kwargs",
        ),
        _TOKENIZED_BY_THE_SERVER,
    ),  # fmt: skip
}


def template_call_arguments(model, body: dict) -> str | None:
    """A chat request's ``chat_template_kwargs`` key that is an argument of the template call, not a variable."""
    kwargs = body.get("chat_template_kwargs")
    if model.__name__ != "ChatCompletionRequest" or not isinstance(kwargs, dict):
        return None
    clash = [key for key in kwargs if key in TEMPLATE_CALL_ARGUMENTS]
    if not clash:
        return None
    return (
        f"chat_template_kwargs {clash[0]!r} is an argument of the chat template call, not a template variable: "
        f"{TEMPLATE_CALL_ARGUMENTS[clash[0]]}"
    )


def _no_effect(name: str, value) -> bool:
    return name in NO_EFFECT or (name == "modalities" and value in (["text"], None))


def _models_in(annotation) -> list[type[pydantic.BaseModel]]:
    """The pydantic models an annotation admits (``List[Union[A, B]]`` -> ``[A, B]``)."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [found for arg in typing.get_args(annotation) for found in _models_in(arg)]


@functools.cache
def _message_fields(model) -> frozenset[str]:
    """Every key some message model of ``model.messages`` has (empty for a request without messages)."""
    field = model.model_fields.get("messages")
    return frozenset(name for m in _models_in(field.annotation) for name in m.model_fields) if field else frozenset()


def carries_nothing(value) -> bool:
    return value is None or (isinstance(value, (str, list, dict)) and not value)


def _without(body: dict, path: tuple) -> dict:
    """A copy of ``body`` without the key at ``path`` (``("top_pp",)`` or ``("messages", 2, "contents")``):
    SGLang's validators edit nested values, so each validation gets its own copy."""
    copied = copy.deepcopy(body)
    parent = copied
    for step in path[:-1]:
        parent = parent[step]
    del parent[path[-1]]
    return copied


def named(name: str, known) -> str:
    """``name`` quoted, with the closest of ``known`` when one is close enough to be what was meant."""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
    return f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def unread_fields(model, body: dict, harmless: frozenset = frozenset()) -> str | None:
    """What is wrong with ``body`` for ``model`` (a request model of ``ROUTES``, or Anthropic's): the keys SGLang
    would drop, with hints; None when every key is read. ``harmless``: more top-level keys whose drop changes nothing
    served. ``body`` already validated as ``model``."""
    candidates = [
        (name,)
        for name in body
        if name not in model.model_fields and name not in harmless and not _no_effect(name, body[name])
    ]
    message_fields = _message_fields(model)
    messages = body.get("messages") if message_fields else None
    for index, message in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(message, dict):
            candidates += [
                ("messages", index, name)
                for name, value in message.items()
                if name not in message_fields and not carries_nothing(value)
            ]
    if not candidates:
        return None

    def validated(without: tuple | None) -> dict:
        request = model.model_validate(copy.deepcopy(body) if without is None else _without(body, without))
        return request.model_dump()

    reference, again = validated(None), validated(None)
    fresh = [name for name in reference if reference[name] != again[name]]  # drawn anew each time (request_id)

    def same(without: tuple) -> bool:
        dumped = validated(without)
        return all(dumped[name] == value for name, value in reference.items() if name not in fresh)

    unread, seen, untested = [], set(), False
    for path in candidates:
        if len(unread) == MAX_NAMED:  # each test validates the whole body: a body of many stray keys stops here
            untested = True
            break
        if (path[0], path[-1]) not in seen and same(path):  # a key found unread once is named once
            seen.add((path[0], path[-1]))
            unread.append(path)
    if not unread:
        return None
    notes = []
    for path in unread:
        if len(path) > 1:
            notes.append(f"{named(path[-1], message_fields)} in messages[{path[1]}]")
        elif path[0] in NOT_SERVED:
            notes.append(f"{path[0]!r}: {NOT_SERVED[path[0]]}")
        else:
            notes.append(named(path[0], model.model_fields))
    if untested:
        notes.append("and possibly more")
    return (
        f"unrecognized request argument{'s' if len(unread) > 1 else ''} {'; '.join(notes)}: this server would ignore "
        f"{'them' if len(unread) > 1 else 'it'}; fix or drop {'them' if len(unread) > 1 else 'it'}"
    )


def unused_options(model, body: dict) -> str | None:
    """Options read only together with another that the body leaves out (OpenAI refuses such a request):
    chat's ``top_logprobs`` without ``logprobs: true`` (SGLang returns no log-probabilities), and ``stream_options``
    without ``stream: true`` (read only by a streaming answer)."""
    top = body.get("top_logprobs")
    if (
        model.__name__ == "ChatCompletionRequest"
        and isinstance(top, int)
        and top > 0
        and body.get("logprobs") is not True
    ):
        return (
            f"top_logprobs {top} without logprobs true: no log-probabilities would be returned; add "
            '"logprobs": true, or drop top_logprobs'
        )
    if body.get("stream_options") is not None and body.get("stream") is not True:
        return (
            "stream_options without stream true: only a streaming answer reads them (a non-streaming answer "
            'always carries its usage); add "stream": true, or drop stream_options'
        )
    return None


async def json_body(raw_request):
    """The request's JSON body as the client sent it, or None. The bytes, not the body FastAPI parsed: SGLang's
    validators edit that one (reasoning -> effort)."""
    try:
        body = json.loads(await raw_request.body())
    except Exception:  # noqa: BLE001 - a body FastAPI parsed is JSON; anything else is left to SGLang
        return None
    return body if isinstance(body, dict) else None


@functools.cache
def _anthropic_message_fields() -> frozenset[str]:
    from sglang.srt.entrypoints.anthropic.protocol import AnthropicMessagesRequest

    return frozenset(AnthropicMessagesRequest.model_fields)


async def check_anthropic_fields(original, serving, request, raw_request=None, *args, **kwargs):
    """AROUND ``AnthropicServing.handle_messages(self, request, raw_request)`` and ``handle_count_tokens``:
    the body's unread keys answered as Anthropic answers them (HTTP 400, ``invalid_request_error``)."""
    body = await json_body(raw_request) if raw_request is not None else None
    # a token count takes a messages body whole: its sampling options (max_tokens, stream, ...) change no count
    harmless = _anthropic_message_fields() if type(request).__name__ == "AnthropicCountTokensRequest" else frozenset()
    try:
        problem = unread_fields(type(request), body, harmless) if body is not None else None
    except Exception:  # noqa: BLE001 - a body the model will not validate twice is left to SGLang, as before
        problem = None
    if problem is not None:
        return serving._error_response(status_code=400, error_type="invalid_request_error", message=problem)
    return await original(serving, request, raw_request, *args, **kwargs)


async def check_openai_fields(original, serving, request, raw_request=None, *args, **kwargs):
    """AROUND ``OpenAIServingBase.handle_request(self, request, raw_request)`` and
    ``OpenAIServingResponses.create_responses(self, request, raw_request)``, for the routes of ``ROUTES`` (other
    callers pass a ``raw_request`` whose body is another API's, or none)."""
    path = getattr(getattr(raw_request, "url", None), "path", "") or ""
    if any(path.endswith(route) and type(request).__name__ == name for route, name in ROUTES.items()):
        body = await json_body(raw_request)
        try:
            problem = (
                unread_fields(type(request), body)
                or unused_options(type(request), body)
                or template_call_arguments(type(request), body)
                if isinstance(body, dict)
                else None
            )
        except Exception:  # noqa: BLE001 - a body the models will not validate twice is left to SGLang, as before
            problem = None
        if problem is not None:
            return serving.create_error_response(problem)
    return await original(serving, request, raw_request, *args, **kwargs)


def install_openai_fields(target: str) -> str | None:
    """The AROUND hook on ``target``; skipped where its module does not import, as SGLang's server then serves
    without that route (it imports the Responses API's module optionally: it needs ``openai_harmony``)."""
    module = target.rsplit(".", 2)[0]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return f"{module} does not import here ({exc}), so SGLang serves no route through it"
    hook(target, check_openai_fields, "AROUND")
    return None


def install_anthropic_fields(handle_messages: str, handle_count_tokens: str):
    hook(handle_messages, check_anthropic_fields, "AROUND")
    hook(handle_count_tokens, check_anthropic_fields, "AROUND")
