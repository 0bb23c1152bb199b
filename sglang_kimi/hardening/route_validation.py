"""Bad requests to SGLang's routes, answered with HTTP 400 naming the problem instead of HTTP 500 or silence.

In SGLang 0.5.23 these raise an unhandled exception in the HTTP server (the server goes on serving, the client gets
an "Internal Server Error" with no reason), or are served with part of the request dropped:

- ``/parse_function_call`` with a ``tool_call_parser`` SGLang does not have (or none), and ``/separate_reasoning``
  with an unknown ``reasoning_parser``: the parsers' constructors raise ``ValueError``. BEFORE hooks on
  ``FunctionCallParser.__init__`` and ``ReasoningParser.__init__`` refuse the name with the list of known ones. The
  OpenAI routes build the same parsers from ``--tool-call-parser`` / ``--reasoning-parser`` only when those are set,
  and SGLang's argument parser restricts them to known names, so there the check never fires.
- ``/vertex_generate`` (Vertex AI's predict route) builds a ``GenerateReqInput`` from ``parameters``: a key that is
  not a field of it (``max_new_tokens`` at the top level, say) is a ``TypeError`` in the dataclass' constructor, and
  since SGLang 0.5.22, whose ``/generate`` route checks its body against the API contract, a ``sampling_params``
  with an unknown key or a value of the wrong type fails later in the tokenizer manager. A BEFORE hook on
  ``GenerateReqInput.__init__`` refuses unknown fields; an AROUND hook on the module-level ``generate_request``
  applies ``/generate``'s own contract to the request Vertex built. The ``/generate`` route itself holds the
  original function (FastAPI kept it when the route was declared), so the hook is reached only from SGLang's own
  callers of ``generate_request``: ``/vertex_generate``.

- ``/generate`` with keys that are not ``GenerateReqInput`` fields: FastAPI parses the body into that dataclass and
  drops every other key, so ``{"text": ..., "max_new_tokens": 8}`` (a sampling option outside ``sampling_params``)
  or a misspelt ``sampling_parms`` was served with the default sampling. SGLang's API contract for ``/generate``
  (0.5.22 and later) checks ``sampling_params`` only; before it, a ``sampling_params`` key ``SamplingParams`` does
  not take was a ``TypeError`` in the tokenizer manager (HTTP 500). A BEFORE hook on
  ``TokenizerManager.generate_request`` reads the bytes Starlette kept and refuses both, naming the keys (an error
  event on a streaming request). The same hook refuses ``/generate``'s log-probability options
  (``top_logprobs_num``, ``token_ids_logprob``, ``logprob_start_len``, ``return_text_in_logprobs``) given without
  ``return_logprob`` true for any prompt: the scheduler resets them and answers without log-probabilities.

- ``/v1/detokenize`` with a token id outside the tokenizer's vocabulary: a negative id fails in the tokenizer
  (HTTP 500), one past its end is dropped from the text without a word. An AFTER hook on the route's
  ``_validate_request`` (whose message SGLang answers with 400) names the id and the valid range.

Each refusal is an exception that is both a ``fastapi.HTTPException`` (status 400, answered as an error object by
SGLang's HTTP server) and the exception SGLang would have raised (``ValueError`` / ``TypeError``), so code that
catches those behaves as before.
"""

from __future__ import annotations

import dataclasses
import functools
import json

from sglang_kimi.hardening.http_errors import BadValue, UnknownField
from sglang_kimi.hardening.openai_fields import carries_nothing, named
from sglang_kimi.hooks import hook


def check_tool_call_parser(parser, tools=None, tool_call_parser=None, *args, **kwargs):
    """BEFORE ``FunctionCallParser.__init__(self, tools, tool_call_parser, ...)``."""
    known = parser.ToolCallParserEnum
    if tool_call_parser not in known:
        given = "no tool_call_parser" if tool_call_parser is None else f"unknown tool_call_parser {tool_call_parser!r}"
        raise BadValue(f"{given}: choose one of {sorted(known)}")


def check_reasoning_parser(parser, model_type=None, *args, **kwargs):
    """BEFORE ``ReasoningParser.__init__(self, model_type, ...)``; SGLang matches the name case-insensitively."""
    known = parser.DetectorMap
    if not isinstance(model_type, str) or model_type.lower() not in known:
        given = "no reasoning_parser" if not model_type else f"unknown reasoning_parser {model_type!r}"
        raise BadValue(f"{given}: choose one of {sorted(known)}")


def check_generate_fields(request, *args, **kwargs):
    """BEFORE ``GenerateReqInput.__init__``: every keyword is one of its fields."""
    unknown = sorted(set(kwargs) - {field.name for field in dataclasses.fields(request)})
    if unknown:
        hint = " (sampling options go in sampling_params)" if "sampling_params" not in unknown else ""
        names = ", ".join(repr(name) for name in unknown)
        raise UnknownField(
            f"not {'a generate request field' if len(unknown) == 1 else 'generate request fields'}: {names}{hint}"
        )


def _given_fields(request) -> dict:
    """The fields of a ``GenerateReqInput`` that differ from their defaults: the request as a ``/generate`` body."""
    body = {}
    for field in dataclasses.fields(request):
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = dataclasses.MISSING
        value = getattr(request, field.name)
        if default is dataclasses.MISSING or value != default:
            body[field.name] = value
    return body


async def check_generate_contract(original, request, raw_request, *args, **kwargs):
    """AROUND ``http_server.generate_request(obj, request)`` as Vertex's route calls it."""
    from sglang.srt.entrypoints.api_contract import generate_contract_error

    error = generate_contract_error(_given_fields(request))
    if error is not None:
        raise BadValue(error)
    return await original(request, raw_request, *args, **kwargs)


# /generate's log-probability options with their defaults: read only for a prompt with return_logprob true (the
# scheduler resets logprob_start_len to -1 without it, and returns no log-probabilities)
LOGPROB_OPTIONS = {"top_logprobs_num": 0, "token_ids_logprob": None, "logprob_start_len": -1}


def _logprob_options_unread(body: dict) -> list[str]:
    """The log-probability options a ``/generate`` body sets while asking for no log-probabilities at all."""
    asked = body.get("return_logprob")
    if asked is True or (isinstance(asked, list) and any(asked)):
        return []
    given = []
    for name, default in LOGPROB_OPTIONS.items():
        value = body.get(name)
        values = value if isinstance(value, list) and name != "token_ids_logprob" else [value]
        if any(v is not None and v != default and v != [] for v in values):
            given.append(f"{name} {json.dumps(value)}")
    if body.get("return_text_in_logprobs"):
        given.append("return_text_in_logprobs true")
    return given


def generate_body_problem(body, fields, sampling_options) -> str | None:
    """What a ``/generate`` JSON ``body`` holds that ``GenerateReqInput`` (``fields``) or ``SamplingParams``
    (``sampling_options``) would not read; None when nothing."""
    if not isinstance(body, dict):
        return None
    logprob_options = _logprob_options_unread(body)
    if logprob_options:
        them = "them" if len(logprob_options) > 1 else "it"
        return (
            f"{', '.join(logprob_options)} without return_logprob true: no log-probabilities would be returned; add "
            f'"return_logprob": true, or drop {them}'
        )
    problems = []
    # a key that carries nothing loses nothing: sglang-router forwards /generate with "model": null added
    unknown = [key for key in body if key not in fields and not carries_nothing(body[key])]
    count = len(unknown)
    if unknown:
        names = [
            f"{key!r} (a sampling option: send it in sampling_params)"
            if key in sampling_options
            else named(key, fields)
            for key in unknown
        ]
        problems.append(f"unrecognized request argument{'s' if len(unknown) > 1 else ''} {', '.join(names)}")
    given = body.get("sampling_params")
    for index, options in enumerate(given if isinstance(given, list) else [given]):
        stray = [key for key in options if key not in sampling_options] if isinstance(options, dict) else []
        if stray:
            count += len(stray)
            where = f"sampling_params[{index}]" if isinstance(given, list) else "sampling_params"
            problems.append(
                f"{where} holds {', '.join(named(key, sampling_options) for key in stray)}: not a sampling option"
            )
            break
    return f"{'; '.join(problems)}: fix or drop {'them' if count > 1 else 'it'}" if problems else None


@functools.cache
def _generate_keys(request_type: type) -> tuple[frozenset, frozenset]:
    """The keys a ``/generate`` body may hold: the fields of ``request_type`` (``GenerateReqInput``), and the
    sampling options ``SamplingParams`` takes (a msgspec Struct: its fields are its constructor's keywords)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    fields = frozenset(field.name for field in dataclasses.fields(request_type))
    return fields, frozenset(SamplingParams.__struct_fields__)


def route_path(request) -> str:
    """The route a request reached: its URL path less the app's root path (as SGLang's own handlers read it)."""
    path = getattr(getattr(request, "url", None), "path", "") or ""
    scope = getattr(request, "scope", None)
    root = scope.get("root_path", "") if isinstance(scope, dict) else ""
    return path.removeprefix(root) if root else path


def check_generate_body(manager, obj, request=None, *args, **kwargs):
    """BEFORE ``TokenizerManager.generate_request(self, obj, request)``, for the ``/generate`` route (the OpenAI routes
    pass their own request, whose body is another API's)."""
    if route_path(request) != "/generate":  # not /api/generate (Ollama's), whose body is another API's
        return
    body = getattr(request, "_json", None)  # the JSON FastAPI parsed the body from, kept by Starlette
    if body is None:  # a body FastAPI did not read as JSON (no JSON content type): its bytes, if any
        try:
            body = json.loads(getattr(request, "_body", None) or "null")
        except ValueError:
            return
    problem = generate_body_problem(body, *_generate_keys(type(obj)))
    if problem is not None:
        raise ValueError(problem)  # SGLang's /generate answers a ValueError with HTTP 400 and its message


def check_detokenize_tokens(result, serving, request, *args, **kwargs):
    """AFTER ``OpenAIServingDetokenize._validate_request(self, request)``: every token id is one of the tokenizer's."""
    if result:
        return result
    tokens = getattr(request, "tokens", None)
    rows = tokens if tokens and isinstance(tokens[0], list) else [tokens or []]
    size = len(serving.tokenizer_manager.tokenizer)
    for row in rows:
        for token in row:
            if isinstance(token, int) and not 0 <= token < size:
                return f"tokens holds {token}, outside the tokenizer's vocabulary: give ids in [0, {size})"
    return None


def install_route_validation(tool_call_parser: str, reasoning_parser: str, generate_input: str, detokenize: str):
    hook(tool_call_parser, check_tool_call_parser, "BEFORE")
    hook(reasoning_parser, check_reasoning_parser, "BEFORE")
    hook(generate_input, check_generate_fields, "BEFORE")
    hook(detokenize, check_detokenize_tokens, "AFTER")


def install_vertex_contract(target: str):
    hook(target, check_generate_contract, "AROUND")


def install_generate_body_check(target: str):
    hook(target, check_generate_body, "BEFORE")
