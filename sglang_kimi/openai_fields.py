"""Fields of an OpenAI request that SGLang would drop without a word, answered with HTTP 400 instead.

SGLang parses ``/v1/completions`` and ``/v1/chat/completions`` bodies into pydantic models that ignore keys they do
not have: a misspelt option (``temprature``), another server's option (vLLM's ``guided_json``) or an OpenAI option
SGLang does not implement (``functions``) was served as if it had not been sent, so the output was not what the
client asked for. OpenAI's own API refuses such a request ("Unrecognized request argument"); so does this hook.

A key is unread when validating the body without it gives the same request: that covers the models' fields and
every key their validators read (``reasoning``, the deprecated ``data_parallel_rank``) in every SGLang release,
without a list of them. OpenAI options that change nothing a server computes (billing, storage and caching hints
such as ``store`` or ``service_tier``, ``prediction``, ``modalities: ["text"]``) are served as before.
"""

from __future__ import annotations

import copy
import difflib
import json

from sglang_kimi.hooks import hook

ROUTES = ("/v1/completions", "/v1/chat/completions")

# OpenAI options with nothing to serve here and no effect on the tokens: accepted as OpenAI accepts them
NO_EFFECT = ("store", "metadata", "service_tier", "prompt_cache_key", "safety_identifier", "prediction", "user")
# OpenAI options SGLang does not implement, with what to send instead
NOT_SERVED = {
    "functions": "send tools instead (functions is OpenAI's deprecated form)",
    "function_call": "send tool_choice (with tools) instead (function_call is OpenAI's deprecated form)",
    "audio": "this server generates text only",
    "modalities": 'this server generates text only (send ["text"] or leave it out)',
    "web_search_options": "this server does not search the web",
    "verbosity": "not served: ask for the length in the prompt, or bound it with max_tokens",
}


def _no_effect(name: str, value) -> bool:
    return name in NO_EFFECT or (name == "modalities" and value in (["text"], None))


def unread_fields(model, body: dict) -> str | None:
    """What is wrong with ``body`` for ``model`` (``CompletionRequest`` / ``ChatCompletionRequest``): the keys
    SGLang would drop, with hints; None when every key is read. ``body`` already validated as ``model``."""
    candidates = [name for name in body if name not in model.model_fields and not _no_effect(name, body[name])]
    if not candidates:
        return None

    def validated(without: str | None) -> dict:  # SGLang's validators edit nested values: each gets its own copy
        return model.model_validate(copy.deepcopy({k: v for k, v in body.items() if k != without})).model_dump()

    reference = validated(None)
    unread = [name for name in candidates if validated(name) == reference]
    if not unread:
        return None
    notes = []
    for name in unread:
        if name in NOT_SERVED:
            notes.append(f"{name!r}: {NOT_SERVED[name]}")
            continue
        close = difflib.get_close_matches(name, model.model_fields, n=1, cutoff=0.8)
        notes.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return (
        f"unrecognized request argument{'s' if len(unread) > 1 else ''} {'; '.join(notes)}: this server would ignore "
        f"{'them' if len(unread) > 1 else 'it'}; fix or drop {'them' if len(unread) > 1 else 'it'}"
    )


async def check_openai_fields(original, serving, request, raw_request, *args, **kwargs):
    """AROUND ``OpenAIServingBase.handle_request(self, request, raw_request)`` for the two OpenAI generation routes
    (other callers pass a ``raw_request`` whose body is another API's)."""
    path = getattr(getattr(raw_request, "url", None), "path", "") or ""
    if path.endswith(ROUTES) and type(request).__name__ in ("CompletionRequest", "ChatCompletionRequest"):
        try:  # the bytes: the parsed body FastAPI keeps was edited by SGLang's validators (reasoning -> effort)
            body = json.loads(await raw_request.body())
        except Exception:  # noqa: BLE001 - a body FastAPI parsed is JSON; anything else is left to SGLang
            body = None
        try:
            problem = unread_fields(type(request), body) if isinstance(body, dict) else None
        except Exception:  # noqa: BLE001 - a body the models will not validate twice is left to SGLang, as before
            problem = None
        if problem is not None:
            return serving.create_error_response(problem)
    return await original(serving, request, raw_request, *args, **kwargs)


def install_openai_fields(target: str):
    hook(target, check_openai_fields, "AROUND")
