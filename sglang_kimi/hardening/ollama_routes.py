"""Ollama's routes (``/api/chat``, ``/api/generate``): requests served as asked, or refused with HTTP 400 naming why.

SGLang's Ollama layer (``entrypoints/ollama/serving.py``, 0.5.20 to 0.5.23) has these gaps:

- every ``ValueError`` of the request checks (SGLang's and the plugin's: ``num_predict`` -5, ``temperature`` -1,
  ``top_k`` 0, a prompt beyond the context, an empty ``messages`` list) is an HTTP 500 without a reason; in a
  streaming request the connection is closed after the headers;
- Ollama's ``seed`` option reaches ``SamplingParams`` as ``seed``, a keyword it does not take: every request with a
  seed was an HTTP 500;
- 8 of Ollama's options are read and the rest dropped without a word: ``repeat_penalty`` and ``min_p``, which SGLang
  serves, a misspelt ``temprature``, ``mirostat`` sampling;
- ``format`` (JSON output) is dropped, as are ``think``, message ``images`` and ``/api/generate``'s ``suffix``,
  ``template``, ``context`` and ``images``, and body keys the request models lack (``tools`` on ``/api/chat``);
- a stream drops the text of its last output (the tokens of the last decode step: one token autoregressively, every
  token a speculative step accepted), and its last chunk has no token counts or duration, which Ollama's has;
  streamed or not, ``done_reason`` is "stop" when ``num_predict`` ended it.

AROUND hooks on ``OllamaServing.handle_chat`` / ``handle_generate`` refuse what would be dropped (:func:`body_problem`,
:func:`options_problem`) and answer the request checks' errors with HTTP 400, Ollama's ``{"error": ...}`` shape; a
streaming request's first chunk is awaited before the response starts, so its errors are a 400 too. An AROUND hook on
``_convert_options_to_sampling_params`` maps ``seed`` to ``sampling_seed``, ``repeat_penalty`` to
``repetition_penalty``, ``min_p`` as it is, and ``format`` to a JSON schema (``"json"``: any JSON object, as SGLang
serves OpenAI's ``json_object``). ``/api/generate`` sends the prompt as it is (Ollama's ``raw``); that is left as
SGLang serves it. The stream builders are replaced by one that sends every output's new text, then the final chunk
with "length" or "stop" and the answer's ``total_duration``, ``prompt_eval_count`` and ``eval_count``; the answer
builders by one that gives that ``done_reason`` too.
"""

from __future__ import annotations

import contextvars
import json
import time

from sglang_kimi.hardening.http_errors import ollama_error
from sglang_kimi.hardening.openai_fields import carries_nothing, json_body, named
from sglang_kimi.hooks import hook

# Ollama's options SGLang's layer maps, and those this module maps (Ollama name -> SamplingParams name)
MAPPED = ("temperature", "top_p", "top_k", "num_predict", "stop", "presence_penalty", "frequency_penalty")
ADDED = {"seed": "sampling_seed", "repeat_penalty": "repetition_penalty", "min_p": "min_p"}
# Ollama's options for the runner (memory, threads, context window): the server's own settings hold
RUNNER = (
    "num_ctx",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "use_mmap",
    "use_mlock",
    "num_thread",
    "numa",
    "low_vram",
    "f16_kv",
    "vocab_only",
    "logits_all",
    "embedding_only",
    "num_keep",
)
# Ollama's sampling options SGLang does not have, at the value that changes nothing
NEUTRAL = {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0}
# options that refine another: no effect while that one is off; else served only at the value SGLang's sampling has
# (its repetition penalty covers the whole sequence, newlines included)
REFINES = {
    "mirostat_tau": ("mirostat", None),
    "mirostat_eta": ("mirostat", None),
    "repeat_last_n": ("repeat_penalty", -1),
    "penalize_newline": ("repeat_penalty", True),
}
OPTIONS = frozenset((*MAPPED, *ADDED, *RUNNER, *NEUTRAL, *REFINES))

REQUEST_FIELDS = {  # the body keys each route reads and uses
    "handle_chat": ("model", "messages", "stream", "format", "options", "keep_alive"),
    "handle_generate": ("model", "prompt", "stream", "system", "format", "options", "keep_alive", "raw"),
}
DROPPED = {  # request fields SGLang's layer reads into its model and never uses, with what to do instead
    "think": "SGLang's Ollama routes do not switch reasoning; use /v1/chat/completions with chat_template_kwargs",
    "suffix": "fill-in-the-middle is not served here",
    "template": "the prompt is sent as given (raw); put the template into the prompt",
    "context": "send the conversation in the prompt, or use /api/chat",
    "images": "this server's Ollama routes take text only",
    "tools": "use /v1/chat/completions for tool calls",
}

_FORMAT: contextvars.ContextVar = contextvars.ContextVar("sglang_kimi_ollama_format", default=None)


def _off(options: dict, name: str) -> bool:
    value = options.get(name)
    return value is None or value == (1.0 if name == "repeat_penalty" else 0)


def options_problem(options) -> str | None:
    """Why Ollama ``options`` cannot be served as asked; None when they can."""
    if not isinstance(options, dict):
        return None  # the request model's own check
    for name, value in options.items():
        if name not in OPTIONS:
            return f"options holds {named(name, OPTIONS)}, not an Ollama option: fix or drop it"
        if name in NEUTRAL and value is not None and value != NEUTRAL[name]:
            return f"options {name} {json.dumps(value)}: not served here; drop it or give {NEUTRAL[name]}"
        if name in REFINES and value is not None:
            refined, served = REFINES[name]
            if not _off(options, refined) and value != served:
                fix = f"give {json.dumps(served)} or drop it" if served is not None else "drop it"
                return f"options {name} {json.dumps(value)} with {refined} on: not served here; {fix}"
    return None


def body_problem(handler: str, request, body) -> str | None:
    """What an Ollama request holds that SGLang's layer would drop; None when nothing."""
    if isinstance(body, dict):
        unknown = [key for key in body if key not in REQUEST_FIELDS[handler] and not carries_nothing(body[key])]
        known = [key for key in unknown if key in DROPPED]
        if known:
            return f"{known[0]!r}: {DROPPED[known[0]]}"
        if unknown:
            return f"unrecognized request argument {named(unknown[0], REQUEST_FIELDS[handler])}: fix or drop it"
    for message in getattr(request, "messages", None) or []:
        if getattr(message, "images", None):
            return f"'images' in messages: {DROPPED['images']}"
    return options_problem(getattr(request, "options", None))


def _message(exc: Exception) -> str:
    detail = getattr(exc, "detail", None)  # the plugin's refusals are HTTPExceptions too
    return str(detail if detail is not None else exc)


async def _started(response):
    """A streaming response whose first chunk has been produced: its request's checks have run."""
    iterator = response.body_iterator
    try:
        first = await iterator.__anext__()
    except StopAsyncIteration:
        return response
    except (ValueError, TypeError) as exc:
        return ollama_error(_message(exc))

    async def chunks():
        yield first
        async for chunk in iterator:
            yield chunk

    response.body_iterator = chunks()
    return response


def answering(handler: str):
    """The AROUND hook on ``OllamaServing.<handler>(self, request, raw_request)``."""

    async def checked(original, serving, request, raw_request, *args, **kwargs):
        problem = body_problem(handler, request, await json_body(raw_request))
        if problem is not None:
            return ollama_error(problem)
        token = _FORMAT.set(getattr(request, "format", None))
        try:
            response = await original(serving, request, raw_request, *args, **kwargs)
        except (ValueError, TypeError) as exc:  # SGLang's request checks and the plugin's
            return ollama_error(_message(exc))
        finally:
            _FORMAT.reset(token)
        if hasattr(response, "body_iterator"):
            return await _started(response)
        return response

    return checked


def sampling_params(original, serving, options=None, *args, **kwargs):
    """AROUND ``OllamaServing._convert_options_to_sampling_params(self, options)``: the options SGLang's mapping
    leaves out or misnames, and the request's ``format``."""
    params = original(serving, options, *args, **kwargs)
    params.pop("seed", None)
    for name, sglang_name in ADDED.items():
        if isinstance(options, dict) and options.get(name) is not None:
            params[sglang_name] = options[name]
    output_format = _FORMAT.get()
    if output_format == "json":
        params["json_schema"] = json.dumps({"type": "object"})
    elif isinstance(output_format, dict):
        params["json_schema"] = json.dumps(output_format)
    return params


def _stream_chunk(
    serving, route: str, model_name: str, text: str, done_reason: str | None, counts: dict | None = None
) -> bytes:
    """One line of an Ollama stream, in SGLang's response models; the last one (``done``) with ``counts``, the
    answer's duration and token counts, as Ollama ends a stream (SGLang's stream models have no such fields)."""
    import orjson
    from sglang.srt.entrypoints.ollama import protocol

    done = done_reason is not None
    fields = {"model": model_name, "created_at": serving._get_timestamp(), "done": done, "done_reason": done_reason}
    if route == "chat":
        response = protocol.OllamaChatStreamResponse(
            message=protocol.OllamaMessage(role="assistant", content=text), **fields
        )
    else:
        response = protocol.OllamaGenerateStreamResponse(response=text, **fields)
    return orjson.dumps({**response.model_dump(), **(counts or {})}) + b"\n"


def _counts(meta: dict, start_ns: int) -> dict:
    """What Ollama reports when an answer is done: its duration (ns) and the prompt's and the output's tokens."""
    return {
        "total_duration": time.time_ns() - start_ns,
        "prompt_eval_count": meta.get("prompt_tokens"),
        "eval_count": meta.get("completion_tokens"),
    }


def _done_reason(finish_reason) -> str:
    kind = finish_reason.get("type") if isinstance(finish_reason, dict) else None
    return "length" if kind == "length" else "stop"


def streaming(route: str):
    """REPLACE for ``OllamaServing._stream_<route>_response(self, gen_request, raw_request, model_name)``."""

    async def replaced(serving, gen_request, raw_request, model_name, *args, **kwargs):
        from fastapi.responses import StreamingResponse

        async def chunks():
            sent, start = "", time.time_ns()
            async for output in serving.tokenizer_manager.generate_request(gen_request, raw_request):
                text = output.get("text", "")
                meta = output.get("meta_info") or {}
                if len(text) > len(sent):  # the last output's text too (SGLang's stream dropped it)
                    yield _stream_chunk(serving, route, model_name, text[len(sent) :], None)
                    sent = text
                if meta.get("finish_reason") is not None:
                    done_reason = _done_reason(meta["finish_reason"])
                    yield _stream_chunk(serving, route, model_name, "", done_reason, _counts(meta, start))

        return StreamingResponse(chunks(), media_type="application/x-ndjson")

    return replaced


def answer(route: str):
    """REPLACE for ``OllamaServing._generate_<route>_response(self, gen_request, raw_request, model_name)``: SGLang's
    answer, with the ``done_reason`` of the output (SGLang's said "stop" when ``num_predict`` ended it)."""

    async def replaced(serving, gen_request, raw_request, model_name, *args, **kwargs):
        from sglang.srt.entrypoints.ollama import protocol

        start = time.time_ns()
        output = await serving.tokenizer_manager.generate_request(gen_request, raw_request).__anext__()
        meta = output.get("meta_info") or {}
        fields = {
            "model": model_name,
            "created_at": serving._get_timestamp(),
            "done": True,
            "done_reason": _done_reason(meta.get("finish_reason")),
            **_counts(meta, start),
        }
        text = output.get("text", "")
        if route == "chat":
            return protocol.OllamaChatResponse(message=protocol.OllamaMessage(role="assistant", content=text), **fields)
        return protocol.OllamaGenerateResponse(response=text, **fields)

    return replaced


def install_ollama_routes(
    handle_chat: str,
    handle_generate: str,
    convert_options: str,
    stream_chat: str,
    stream_generate: str,
    chat_response: str,
    generate_response: str,
):
    hook(handle_chat, answering("handle_chat"), "AROUND")
    hook(handle_generate, answering("handle_generate"), "AROUND")
    hook(convert_options, sampling_params, "AROUND")
    hook(stream_chat, streaming("chat"), "REPLACE")
    hook(stream_generate, streaming("generate"), "REPLACE")
    hook(chat_response, answer("chat"), "REPLACE")
    hook(generate_response, answer("generate"), "REPLACE")
