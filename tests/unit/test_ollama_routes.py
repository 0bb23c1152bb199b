"""Ollama's routes (``sglang_kimi/hardening/ollama_routes.py``): what SGLang's layer would drop is refused naming it,
the request
checks' errors are HTTP 400 (a stream's too, before it starts), and the options it left out or misnamed are served."""

import asyncio
import json
from types import SimpleNamespace

import pytest
from fastapi import HTTPException
from fastapi.responses import StreamingResponse

from sglang_kimi.hardening.ollama_routes import (
    answer,
    answering,
    body_problem,
    options_problem,
    sampling_params,
    streaming,
)


@pytest.mark.parametrize(
    "options, words",
    [
        ({"temprature": 0.2}, ["'temprature' (did you mean 'temperature'?)", "not an Ollama option"]),
        ({"bogus": 1}, ["'bogus', not an Ollama option"]),
        ({"mirostat": 2}, ["mirostat 2: not served"]),
        ({"typical_p": 0.5}, ["typical_p 0.5: not served", "give 1.0"]),
        ({"repeat_penalty": 1.2, "repeat_last_n": 64}, ["repeat_last_n 64 with repeat_penalty on", "give -1"]),
        ({"repeat_penalty": 1.2, "penalize_newline": False}, ["penalize_newline false with repeat_penalty on"]),
        ({"mirostat": 1, "mirostat_tau": 5.0}, ["mirostat 1: not served"]),
    ],
)
def test_options_that_cannot_be_served_are_named(options, words):
    problem = options_problem(options)
    assert problem is not None and all(w in problem for w in words), problem


@pytest.mark.parametrize(
    "options",
    [
        None,
        {},
        {"temperature": 0, "top_k": 5, "top_p": 0.9, "num_predict": 8, "stop": ["\n"], "seed": 3},
        {"repeat_penalty": 1.1, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": 0.5},
        {"num_ctx": 8192, "num_thread": 8, "num_gpu": 1, "use_mmap": True},  # the runner's: the server's settings hold
        {"typical_p": 1.0, "tfs_z": 1.0, "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1},  # changing nothing
        {"repeat_last_n": 64, "penalize_newline": False},  # no repeat penalty for them to refine
        {"repeat_penalty": 1.0, "repeat_last_n": 64},
        {"repeat_penalty": 1.3, "repeat_last_n": -1, "penalize_newline": True},  # as SGLang's penalty works
    ],
)
def test_options_served_as_asked(options):
    assert options_problem(options) is None


def chat(**fields):
    return SimpleNamespace(messages=[SimpleNamespace(role="user", content="hi", images=None)], options=None, **fields)


@pytest.mark.parametrize(
    "handler, body, words",
    [
        ("handle_chat", {"model": "m", "messages": [], "tools": [{"type": "function"}]}, ["'tools'", "/v1/chat"]),
        ("handle_chat", {"model": "m", "messages": [], "think": True}, ["'think'"]),
        ("handle_chat", {"model": "m", "messages": [], "optons": {"seed": 1}}, ["'optons' (did you mean 'options'?)"]),
        ("handle_generate", {"model": "m", "prompt": "x", "suffix": "y"}, ["'suffix': fill-in-the-middle"]),
        ("handle_generate", {"model": "m", "prompt": "x", "template": "{{ .Prompt }}"}, ["'template'"]),
        ("handle_generate", {"model": "m", "prompt": "x", "context": [1, 2]}, ["'context'"]),
        ("handle_generate", {"model": "m", "prompt": "x", "images": ["aGk="]}, ["'images'", "text only"]),
    ],
)
def test_request_fields_that_would_be_dropped_are_named(handler, body, words):
    problem = body_problem(handler, chat(), body)
    assert problem is not None and all(w in problem for w in words), problem


def test_fields_served_or_empty_pass():
    body = {"model": "m", "prompt": "x", "system": "s", "raw": True, "format": "json", "keep_alive": "5m"}
    assert body_problem("handle_generate", chat(), {**body, "images": [], "context": None, "suffix": ""}) is None
    assert body_problem("handle_chat", chat(), {"model": "m", "messages": [], "stream": False, "think": None}) is None


def test_message_images_are_named():
    request = chat()
    request.messages[0].images = ["aGk="]
    assert "'images' in messages" in body_problem("handle_chat", request, {"model": "m", "messages": []})


def sglang_mapping(serving, options=None):
    """SGLang's ``_convert_options_to_sampling_params``: 8 options, ``seed`` passed on under its own name."""
    mapping = {"temperature": "temperature", "num_predict": "max_new_tokens", "seed": "seed"}
    params = {mapping[k]: v for k, v in (options or {}).items() if k in mapping}
    params.setdefault("max_new_tokens", 2048)
    return params


def test_options_sglang_left_out_or_misnamed_are_mapped():
    options = {"temperature": 0.5, "seed": 7, "repeat_penalty": 1.1, "min_p": 0.05}
    params = sampling_params(sglang_mapping, None, options)
    assert params == {
        "temperature": 0.5,
        "max_new_tokens": 2048,
        "sampling_seed": 7,
        "repetition_penalty": 1.1,
        "min_p": 0.05,
    }
    assert sampling_params(sglang_mapping, None, None) == {"max_new_tokens": 2048}


class Raw:
    def __init__(self, body):
        self._bytes = json.dumps(body).encode()

    async def body(self):
        return self._bytes


def run(handler, original, request, body):
    return asyncio.run(answering(handler)(original, None, request, Raw(body)))


def refusal(response) -> str:
    assert response.status_code == 400
    return json.loads(response.body)["error"]


def test_request_check_errors_are_http_400():
    async def value_error(serving, request, raw):
        raise ValueError("max_new_tokens must be at least 0, got -5.")

    async def plugin_refusal(serving, request, raw):
        class Refused(HTTPException, ValueError):
            pass

        raise Refused(status_code=400, detail="token ids must be in [0, 4096)")

    body = {"model": "m", "messages": []}
    assert refusal(run("handle_chat", value_error, chat(), body)) == "max_new_tokens must be at least 0, got -5."
    assert refusal(run("handle_chat", plugin_refusal, chat(), body)) == "token ids must be in [0, 4096)"


def test_a_refused_body_never_reaches_sglang():
    async def original(serving, request, raw):
        pytest.fail("SGLang's handler ran")

    assert "'suffix'" in refusal(run("handle_generate", original, chat(), {"model": "m", "prompt": "x", "suffix": "y"}))


def sglang_stream(first_error=None):
    async def original(serving, request, raw):
        async def chunks():
            if first_error is not None:
                raise first_error
            yield b'{"done": false}\n'
            yield b'{"done": true}\n'

        return StreamingResponse(chunks(), media_type="application/x-ndjson")

    return original


def test_a_streams_first_error_is_http_400_before_it_starts():
    response = run(
        "handle_chat", sglang_stream(ValueError("top_k must be -1 (disable) or at least 1, got 0.")), chat(), {}
    )
    assert refusal(response).startswith("top_k must be")


def test_a_stream_that_starts_keeps_every_chunk():
    async def served():  # one event loop, as in the server: the stream's generator lives in it
        response = await answering("handle_chat")(sglang_stream(), None, chat(), Raw({"model": "m", "messages": []}))
        assert isinstance(response, StreamingResponse)
        return [chunk async for chunk in response.body_iterator]

    assert asyncio.run(served()) == [b'{"done": false}\n', b'{"done": true}\n']


def test_format_reaches_the_sampling_params_as_a_json_schema():
    seen = []

    async def original(serving, request, raw):
        seen.append(sampling_params(sglang_mapping, serving, request.options))
        return "served"

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    for output_format, expected in (("json", {"type": "object"}), (schema, schema), (None, None)):
        assert run("handle_chat", original, chat(format=output_format), {"model": "m", "messages": []}) == "served"
        given = seen[-1].get("json_schema")
        assert (json.loads(given) if given else None) == expected


class Outputs:
    """A tokenizer manager whose ``generate_request`` yields SGLang's cumulative outputs."""

    def __init__(self, texts, finish_reason):
        self.texts, self.finish_reason = texts, finish_reason

    async def generate_request(self, gen_request, raw_request):
        for index, text in enumerate(self.texts):
            last = index == len(self.texts) - 1
            meta = {"finish_reason": self.finish_reason if last else None, "prompt_tokens": 9}
            yield {"text": text, "meta_info": {**meta, "completion_tokens": index + 1}}


@pytest.mark.parametrize("route, field", [("chat", "message"), ("generate", "response")])
@pytest.mark.parametrize(
    "finish_reason, done_reason", [({"type": "length", "length": 6}, "length"), ({"type": "stop"}, "stop")]
)
def test_a_stream_carries_its_last_outputs_text_and_why_it_ended(route, field, finish_reason, done_reason):
    # the last decode step of a speculative server commits several tokens: " 8 apples." here
    serving = SimpleNamespace(
        tokenizer_manager=Outputs(["He", "He has", "He has 8 apples."], finish_reason),
        _get_timestamp=lambda: "2026-01-01T00:00:00.000Z",
    )

    async def served():
        response = await streaming(route)(serving, "gen_request", "raw_request", "m")
        return [json.loads(chunk) async for chunk in response.body_iterator]

    chunks = asyncio.run(served())
    texts = [chunk[field]["content"] if route == "chat" else chunk[field] for chunk in chunks]
    assert "".join(texts) == "He has 8 apples."
    assert [chunk["done"] for chunk in chunks] == [False, False, False, True]
    assert chunks[-1]["done_reason"] == done_reason and texts[-1] == ""
    # the last chunk reports the answer's counts, as Ollama's does; the others none
    assert (chunks[-1]["prompt_eval_count"], chunks[-1]["eval_count"]) == (9, 3)
    assert chunks[-1]["total_duration"] >= 0
    assert not any("eval_count" in chunk for chunk in chunks[:-1])


@pytest.mark.parametrize("route", ["chat", "generate"])
@pytest.mark.parametrize(
    "finish_reason, done_reason", [({"type": "length", "length": 6}, "length"), ({"type": "stop"}, "stop")]
)
def test_an_answer_says_why_it_ended(route, finish_reason, done_reason):
    class Manager:
        async def generate_request(self, gen_request, raw_request):
            yield {
                "text": "He has 8.",
                "meta_info": {"finish_reason": finish_reason, "prompt_tokens": 9, "completion_tokens": 6},
            }

    serving = SimpleNamespace(tokenizer_manager=Manager(), _get_timestamp=lambda: "2026-01-01T00:00:00.000Z")
    response = asyncio.run(answer(route)(serving, "gen_request", "raw_request", "m")).model_dump()
    assert (response["message"]["content"] if route == "chat" else response["response"]) == "He has 8."
    assert response["done"] is True and response["done_reason"] == done_reason
    assert (response["prompt_eval_count"], response["eval_count"], response["model"]) == (9, 6, "m")
