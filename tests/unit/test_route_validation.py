"""Side-route validation (``sglang_kimi/hardening/route_validation.py``): unknown parser names and Vertex parameters
that are
not generate request fields, or break ``/generate``'s contract, are HTTP 400s that are still the exception SGLang
raised; valid ones reach SGLang unchanged."""

import asyncio
import dataclasses
import json
import re
from types import SimpleNamespace

import pytest
from fastapi import HTTPException

from sglang_kimi.hardening.route_validation import (
    check_detokenize_tokens,
    check_generate_body,
    check_generate_contract,
    check_generate_fields,
    check_reasoning_parser,
    check_tool_call_parser,
)

TOOL_PARSERS = SimpleNamespace(ToolCallParserEnum={"kimi_k2": object, "deepseekv3": object})
REASONING_PARSERS = SimpleNamespace(DetectorMap={"kimi": object, "deepseek-r1": object})


def refused(call, *args, kind=ValueError, **kwargs) -> str:
    with pytest.raises(HTTPException) as info:
        call(*args, **kwargs)
    assert info.value.status_code == 400
    assert isinstance(info.value, kind)  # callers that catch SGLang's own exception still catch it
    return info.value.detail


def test_unknown_or_missing_tool_call_parser_is_refused_with_the_known_names():
    assert "unknown tool_call_parser 'nope'" in refused(check_tool_call_parser, TOOL_PARSERS, [], "nope")
    message = refused(check_tool_call_parser, TOOL_PARSERS, tools=[], tool_call_parser=None)
    assert message.startswith("no tool_call_parser") and "['deepseekv3', 'kimi_k2']" in message
    assert check_tool_call_parser(TOOL_PARSERS, [], "kimi_k2") is None


def test_reasoning_parser_names_match_case_insensitively_as_in_sglang():
    assert check_reasoning_parser(REASONING_PARSERS, "KIMI") is None
    assert check_reasoning_parser(REASONING_PARSERS, model_type="deepseek-r1") is None
    assert "unknown reasoning_parser 'qwen9'" in refused(check_reasoning_parser, REASONING_PARSERS, "qwen9")
    assert refused(check_reasoning_parser, REASONING_PARSERS, "").startswith("no reasoning_parser")
    assert refused(check_reasoning_parser, REASONING_PARSERS, None).startswith("no reasoning_parser")


@dataclasses.dataclass
class Request:  # the shape of GenerateReqInput: fields with defaults and default factories
    text: object = None
    input_ids: object = None
    sampling_params: dict = dataclasses.field(default_factory=dict)
    return_logprob: bool = False
    logprob_start_len: object = None
    top_logprobs_num: object = None
    token_ids_logprob: object = None
    return_text_in_logprobs: bool = False


def test_generate_request_keywords_must_be_fields():
    message = refused(check_generate_fields, Request, kind=TypeError, text=["x"], max_new_tokens=4)
    assert "not a generate request field: 'max_new_tokens'" in message and "sampling_params" in message
    message = refused(check_generate_fields, Request, kind=TypeError, text="x", b=1, a=2)
    assert "not generate request fields: 'a', 'b'" in message
    assert check_generate_fields(Request, text="x", sampling_params={}, return_logprob=True) is None


def vertex(request):
    async def original(obj, raw_request):
        return ("served", obj)

    return asyncio.run(check_generate_contract(original, request, None))


def test_vertex_requests_meet_the_generate_contract():
    ok = Request(text=["a", "b"], sampling_params={"max_new_tokens": 4, "temperature": 0}, return_logprob=True)
    assert vertex(ok) == ("served", ok)
    assert vertex(Request(input_ids=[[1, 2]])) == ("served", Request(input_ids=[[1, 2]]))
    with pytest.raises(HTTPException) as info:
        vertex(Request(text=["a"], sampling_params={"max_new_tokens": 4, "temprature": 0}))
    assert info.value.status_code == 400 and "unknown field `temprature`" in info.value.detail
    with pytest.raises(HTTPException) as info:
        vertex(Request(text=["a"], sampling_params={"temperature": "low"}))
    assert "expected f64" in info.value.detail


def raw_generate(body, path="/generate", json_content_type=True, root_path=""):
    """A FastAPI request as ``TokenizerManager.generate_request`` receives it: Starlette kept the body's bytes and,
    for a JSON content type, the JSON FastAPI parsed from them."""
    request = SimpleNamespace(
        url=SimpleNamespace(path=root_path + path), scope={"root_path": root_path}, _body=json.dumps(body).encode()
    )
    if json_content_type:
        request._json = body
    return request


@pytest.mark.parametrize(
    "body, words",
    [
        (
            {"text": "2+2=", "max_new_tokens": 8},
            ["'max_new_tokens' (a sampling option: send it in sampling_params)", "fix or drop it"],
        ),
        ({"text": "hi", "sampling_parms": {"temperature": 0}}, ["'sampling_parms' (did you mean 'sampling_params'?)"]),
        ({"text": "hi", "model": "kimi-k2.6"}, ["unrecognized request argument 'model'"]),  # a name would be dropped
        ({"text": "hi", "sampling_params": {"temprature": 0}}, ["'temprature' (did you mean 'temperature'?)"]),
        (
            {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 2}, {"top_kk": 3}], "x": 1},
            ["argument 'x'", "sampling_params[1] holds 'top_kk'", "fix or drop them"],
        ),
        # log-probability options without return_logprob: the scheduler returns none and resets logprob_start_len
        ({"text": "hi", "top_logprobs_num": 3}, ["top_logprobs_num 3 without return_logprob", "drop it"]),
        (
            {"text": "hi", "return_logprob": False, "logprob_start_len": 0, "token_ids_logprob": [5]},
            [
                "token_ids_logprob [5]",
                "logprob_start_len 0",
                "without return_logprob",
                '"return_logprob": true',
                "them",
            ],
        ),
        ({"text": ["a", "b"], "return_logprob": [False, False], "top_logprobs_num": [0, 2]}, ["[0, 2]"]),
        ({"text": "hi", "return_text_in_logprobs": True}, ["return_text_in_logprobs true without return_logprob"]),
    ],
)
def test_generate_bodies_name_what_would_be_dropped(body, words):
    for json_content_type, root_path in ((True, ""), (False, ""), (True, "/llm")):
        request = raw_generate(body, json_content_type=json_content_type, root_path=root_path)
        with pytest.raises(ValueError) as info:  # SGLang's /generate answers a ValueError with HTTP 400
            check_generate_body(None, Request(), request)
        assert all(w in str(info.value) for w in words), str(info.value)


def test_generate_bodies_with_known_keys_and_other_routes_pass():
    body = {"text": ["a"], "sampling_params": [{"max_new_tokens": 4, "temperature": 0.5, "top_k": 3}]}
    assert check_generate_body(None, Request(), raw_generate(body)) is None
    assert check_generate_body(None, Request(), raw_generate({"text": "hi", "return_logprob": True})) is None
    # the options at their defaults (as SGLang's benchmark client sends them), or with log-probabilities asked for
    for body in (
        {"text": "hi", "return_logprob": False, "logprob_start_len": -1, "top_logprobs_num": 0},
        {"text": "hi", "token_ids_logprob": [], "return_text_in_logprobs": False},
        {"text": "hi", "return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0},
        {"text": ["a", "b"], "return_logprob": [True, False], "top_logprobs_num": 2},
        {"text": "hi", "model": None},  # as sglang-router forwards every /generate
    ):
        assert check_generate_body(None, Request(), raw_generate(body)) is None, body
    # the OpenAI routes hand their own request over: its body is another API's
    assert check_generate_body(None, Request(), raw_generate({"prompt": "hi"}, "/v1/completions")) is None
    # so does Ollama's /api/generate (every request to it was refused as unrecognized arguments, HTTP 500 there)
    ollama = {"model": "m", "prompt": "hi", "stream": False, "options": {"num_predict": 4}}
    assert check_generate_body(None, Request(), raw_generate(ollama, "/api/generate")) is None
    assert check_generate_body(None, Request(), None) is None  # called from Python: no HTTP body


def detokenize_serving(size: int):
    return SimpleNamespace(tokenizer_manager=SimpleNamespace(tokenizer=[None] * size))


@pytest.mark.parametrize(
    "tokens, message",
    [
        ([1, -5], r"tokens holds -5, outside the tokenizer's vocabulary: give ids in \[0, 10\)"),
        ([1, 10], "tokens holds 10, outside"),
        ([[1, 2], [3, 10**8]], "tokens holds 100000000, outside"),
    ],
)
def test_detokenize_ids_outside_the_vocabulary_are_refused(tokens, message):
    refusal = check_detokenize_tokens(None, detokenize_serving(10), SimpleNamespace(tokens=tokens))
    assert refusal is not None and re.search(message, refusal), refusal


@pytest.mark.parametrize("tokens", [[0, 9], [[1], [2, 3]], [], [[]]])
def test_detokenize_ids_inside_the_vocabulary_pass(tokens):
    assert check_detokenize_tokens(None, detokenize_serving(10), SimpleNamespace(tokens=tokens)) is None
    assert check_detokenize_tokens("earlier refusal", detokenize_serving(10), SimpleNamespace(tokens=tokens)) == (
        "earlier refusal"
    )
