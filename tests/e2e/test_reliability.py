"""No request can kill a speculative server: a matrix of bad and unusual requests, admin ones included, against a
DFLASH-tree server (each answered 4xx or validly, the server still generating after every one, greedy parity after
all of them), and 200 concurrent mixed greedy / sampled requests with clients dropping their streams midway, against
DFLASH-tree and EAGLE3-tree servers (every greedy output equal to the non-speculative server's); the sampling
support a DFLASH tree reports for its committed tokens against the target's, and prompts given as embeddings. The
tree servers are the session's (``support.spec_e2e.shared_tree_server``: DDTree budget 32, EAGLE3 3 steps / topk 4 / 8
draft tokens)."""

from __future__ import annotations

import json
import math
import random
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor
from support.servers import server_config
from support.spec_e2e import (
    DFLASH_TREE,
    KIMI_CPU,
    TINY,
    TREE_SERVERS,
    generate_all,
    gsm8k_prompts,
    hf_model,
    shared_tree_server,
    spec_metrics,
)

from sglang_kimi.assets import TINY_MODEL

VOCAB = 4096
CONTEXT = 4096  # the tiny model's max_position_embeddings
PROMPT = "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:"
BANNED = 373  # the second greedy token of PROMPT
BAN_PROCESSOR = DisallowedTokensLogitsProcessor.to_str()


@pytest.fixture(scope="module")
def tree_server(request, server_pool):
    return shared_tree_server(server_pool, request, "dflash-tree-32")


def body(max_new_tokens: int = 8, **sampling) -> dict:
    return {"text": PROMPT, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, **sampling}}


def is_digits(out: dict) -> bool:
    return re.fullmatch(r"[0-9]+", out["text"]) is not None


def is_yes_or_no(out: dict) -> bool:
    return out["text"] in ('"yes"', '"no"')


# (name, path, JSON body or raw text, expected: "4xx" or a check of the 200 answer)
OLLAMA_CHAT = {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "stream": False}
OLLAMA_GENERATE = {"model": "m", "prompt": PROMPT, "stream": False, "options": {"num_predict": 4}}

MATRIX = [
    ("prompt longer than the context", "/generate", {"input_ids": [5] * 5000}, "4xx"),
    ("token id above the vocabulary", "/generate", {"input_ids": [1, 2, 10_000_000]}, "4xx"),
    ("token id at the vocabulary size", "/generate", {"input_ids": [1, VOCAB]}, "4xx"),
    ("negative token id", "/generate", {"input_ids": [1, -3]}, "4xx"),
    ("non-integer token id", "/generate", {"input_ids": [1.5, 2]}, "4xx"),
    ("a batch with one bad prompt", "/generate", {"input_ids": [[1, 2], [3, 10_000_000]]}, "4xx"),
    ("empty text", "/generate", {"text": ""}, "4xx"),
    ("empty input_ids", "/generate", {"input_ids": []}, "4xx"),
    ("negative temperature", "/generate", body(temperature=-1.0), "4xx"),
    ("NaN temperature", "/generate", '{"text": "hi", "sampling_params": {"temperature": NaN}}', "4xx"),
    ("top_p 0", "/generate", body(temperature=1.0, top_p=0.0), "4xx"),
    ("top_k 0", "/generate", body(temperature=1.0, top_k=0), "4xx"),
    ("top_k beyond int32", "/generate", body(temperature=1.0, top_k=2**31), "4xx"),
    ("sampling seed beyond int64", "/generate", body(temperature=1.0, sampling_seed=2**63), "4xx"),
    (
        "top log-probabilities beyond the vocabulary",
        "/generate",
        {**body(), "return_logprob": True, "top_logprobs_num": VOCAB + 1},
        "4xx",
    ),
    ("logprob_start_len below -1", "/generate", {**body(), "return_logprob": True, "logprob_start_len": -5}, "4xx"),
    (
        "OpenAI completion, top log-probabilities beyond the vocabulary",
        "/v1/completions",
        {"model": "m", "prompt": "hi", "max_tokens": 4, "logprobs": VOCAB + 1},
        "4xx",
    ),
    ("min_p above 1", "/generate", body(temperature=1.0, min_p=2.0), "4xx"),
    ("max_new_tokens beyond the context", "/generate", body(max_new_tokens=10**9), "4xx"),
    ("malformed JSON", "/generate", "{not json", "4xx"),
    ("sampling_params of the wrong type", "/generate", {"text": PROMPT, "sampling_params": "abc"}, "4xx"),
    ("max_new_tokens of the wrong type", "/generate", body(max_new_tokens="ten"), "4xx"),
    ("logit_bias outside the vocabulary", "/generate", body(logit_bias={str(10**8): 5.0}), "4xx"),
    (
        "OpenAI completion, bad token id",
        "/v1/completions",
        {"model": "m", "prompt": [1, 10**8], "max_tokens": 4},
        "4xx",
    ),
    ("stop_regex that does not compile", "/generate", body(stop_regex="["), "4xx"),
    # with re, about 2^40 backtracking steps in the scheduler (days) on the forced run of 40 a's
    ("stop_regex that backtracks exponentially", "/generate", body(40, regex="a{40}", stop_regex="(a|a)+b"), "4xx"),
    (
        "a batch with fewer sampling_params than prompts",
        "/generate",
        {"text": [PROMPT, PROMPT], "sampling_params": [{"max_new_tokens": 4}]},
        "4xx",
    ),
    ("a list of rids for one prompt", "/generate", {**body(), "rid": ["a", "b"]}, "4xx"),
    ("OpenAI completion, empty prompt", "/v1/completions", {"model": "m", "prompt": "", "max_tokens": 4}, "4xx"),
    ("OpenAI chat, no messages", "/v1/chat/completions", {"model": "m", "messages": [], "max_tokens": 4}, "4xx"),
    ("n 0", "/generate", body(temperature=0.8, n=0), "4xx"),
    (
        "OpenAI completion, best_of",
        "/v1/completions",
        {"model": "m", "prompt": "hi", "max_tokens": 4, "best_of": 3},
        "4xx",
    ),
    (
        "OpenAI completion, suffix",
        "/v1/completions",
        {"model": "m", "prompt": "hi", "max_tokens": 4, "suffix": "!"},
        "4xx",
    ),
    # keys SGLang's OpenAI request models drop: a typo, another server's option, an OpenAI option it does not serve
    ("OpenAI completion, misspelt option", "/v1/completions", {"model": "m", "prompt": "hi", "temprature": 1.5}, "4xx"),
    (
        "OpenAI chat, another server's option",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "guided_json": {"type": "object"}},
        "4xx",
    ),
    (
        "OpenAI chat, functions",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f", "parameters": {}}]},
        "4xx",
    ),
    (  # a misspelt content: the system message was served without its text
        "OpenAI chat, a message key it would drop",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "system", "contents": "Be terse."}, {"role": "user", "content": "hi"}]},
        "4xx",
    ),
    (
        "OpenAI responses, misspelt option",
        "/v1/responses",
        {"model": str(TINY_MODEL), "input": "hi", "max_output_tokns": 4},
        "4xx",
    ),
    ("an empty stop string", "/generate", body(stop=["=", ""]), "4xx"),
    ("stop token id outside the vocabulary", "/generate", body(stop_token_ids=[13, VOCAB]), "4xx"),
    # fields a JSON body can carry that ended the scheduler or the tokenizer manager (the server has --enable-metrics)
    ("positional_embed_overrides from JSON", "/generate", {**body(), "positional_embed_overrides": [1, 2]}, "4xx"),
    ("custom_labels the server does not allow", "/generate", {**body(), "custom_labels": {"tenant": "a"}}, "4xx"),
    ("text and input_ids together", "/generate", {**body(), "input_ids": [1, 2]}, "4xx"),
    ("detokenize, negative token id", "/v1/detokenize", {"model": "m", "tokens": [1, -5]}, "4xx"),
    ("detokenize, token id past the vocabulary", "/v1/detokenize", {"model": "m", "tokens": [[1], [VOCAB]]}, "4xx"),
    # the tree server allows custom logit processors (--enable-custom-logit-processor)
    (
        "custom_logit_processor that does not deserialize",
        "/generate",
        {**body(), "custom_logit_processor": "{x"},
        "4xx",
    ),
    (
        "custom_logit_processor banning a token",
        "/generate",
        {**body(8, custom_params={"token_ids": [BANNED]}), "custom_logit_processor": BAN_PROCESSOR},
        lambda o: len(o["output_ids"]) == 8 and BANNED not in o["output_ids"],
    ),
    (
        "routed experts from a server without their capture",
        "/generate",
        {**body(), "return_routed_experts": True},
        "4xx",
    ),
    # admin requests that ended the scheduler, or failed every later request
    ("expert distribution without its recorder", "/start_expert_distribution_record", {}, "4xx"),
    ("expert distribution dump without its recorder", "/dump_expert_distribution_record", {}, "4xx"),
    ("profiling the GPU on a CPU server", "/start_profile", {"activities": ["GPU"]}, "4xx"),
    ("profiling memory on a CPU server", "/start_profile", {"activities": ["CPU", "MEM"]}, "4xx"),
    ("stopping a profile that is not running", "/stop_profile", {}, "4xx"),
    ("request logging at level 5", "/configure_logging", {"log_requests": True, "log_requests_level": 5}, "4xx"),
    ("a sleep the scheduler cannot take", "/slow_down", {"forward_sleep_time": 1e300}, "4xx"),
    ("a session that times out at once", "/open_session", {"capacity_of_str_len": 100, "timeout": 0}, "4xx"),
    ("memory released under an unknown tag", "/release_memory_occupation", {"tags": ["kv"]}, "4xx"),
    ("memory resumed that was never released", "/resume_memory_occupation", {}, lambda o: o is None),
    (
        "a chat template kwarg that is the template call's own argument",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "chat_template_kwargs": {"tools": 7}},
        "4xx",
    ),
    # side routes that answered HTTP 500
    ("unknown tool-call parser", "/parse_function_call", {"text": "x", "tool_call_parser": "nope", "tools": []}, "4xx"),
    ("no tool-call parser", "/parse_function_call", {"text": "x", "tools": []}, "4xx"),
    ("unknown reasoning parser", "/separate_reasoning", {"text": "x", "reasoning_parser": "nope"}, "4xx"),
    (
        "Vertex parameters that are not request fields",
        "/vertex_generate",
        {"instances": [{"text": PROMPT}], "parameters": {"max_new_tokens": 4}},
        "4xx",
    ),
    # /generate keys GenerateReqInput drops: served with the default sampling (SGLang's contract checks sampling_params)
    ("a sampling option outside sampling_params", "/generate", {"text": PROMPT, "max_new_tokens": 4}, "4xx"),
    ("a misspelt sampling_params", "/generate", {"text": PROMPT, "sampling_parms": {"max_new_tokens": 4}}, "4xx"),
    # log-probability options without the switch that returns them: served without log-probabilities
    ("top log-probabilities without return_logprob", "/generate", {"text": PROMPT, "top_logprobs_num": 2}, "4xx"),
    (
        "chat top_logprobs without logprobs",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4, "top_logprobs": 2},
        "4xx",
    ),
    # Ollama's routes: request checks' errors were HTTP 500 (a stream cut after its headers), any seed a 500, and
    # /api/generate refused every request; options and fields SGLang's layer drops are refused naming them
    (
        "Ollama generate with a seed and the options SGLang left out",
        "/api/generate",
        {**OLLAMA_GENERATE, "options": {"num_predict": 4, "seed": 3, "repeat_penalty": 1.0, "min_p": 0.0}},
        lambda o: o["done"] is True and o["done_reason"] == "length" and o["response"] and o["eval_count"] == 4,
    ),
    ("Ollama chat, num_predict below 0", "/api/chat", {**OLLAMA_CHAT, "options": {"num_predict": -5}}, "4xx"),
    ("Ollama chat streaming, top_k 0", "/api/chat", {**OLLAMA_CHAT, "stream": True, "options": {"top_k": 0}}, "4xx"),
    ("Ollama chat, no messages", "/api/chat", {**OLLAMA_CHAT, "messages": []}, "4xx"),
    ("Ollama chat, a misspelt option", "/api/chat", {**OLLAMA_CHAT, "options": {"temprature": 0}}, "4xx"),
    ("Ollama generate, suffix", "/api/generate", {**OLLAMA_GENERATE, "suffix": "!"}, "4xx"),
    (
        "Ollama generate streaming, a prompt beyond the context",
        "/api/generate",
        {**OLLAMA_GENERATE, "prompt": PROMPT * 400, "stream": True},
        "4xx",
    ),
    (  # Anthropic's models drop unknown keys too; Anthropic refuses them as extra inputs
        "Anthropic messages, misspelt option",
        "/v1/messages",
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": PROMPT}], "temprature": 0},
        "4xx",
    ),
    (
        "Anthropic token count of a whole messages body",
        "/v1/messages/count_tokens",
        {"model": "m", "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": PROMPT}]},
        lambda o: o["input_tokens"] > 0,
    ),
    (
        "completion stream_options without stream",
        "/v1/completions",
        {"model": "m", "prompt": PROMPT, "max_tokens": 4, "stream_options": {"include_usage": True}},
        "4xx",
    ),
    (
        "Vertex sampling_params with an unknown key",
        "/vertex_generate",
        {"instances": [{"text": PROMPT}], "parameters": {"sampling_params": {"max_new_tokens": 4, "temprature": 0}}},
        "4xx",
    ),
    (
        "Vertex sampling_params of the wrong type",
        "/vertex_generate",
        {"instances": [{"text": PROMPT}], "parameters": {"sampling_params": {"temperature": "low"}}},
        "4xx",
    ),
    (
        "Kimi tool-call parsing",
        "/parse_function_call",
        {
            "text": "<|tool_calls_section_begin|><|tool_call_begin|>functions.add:0<|tool_call_argument_begin|>"
            '{"a": 1}<|tool_call_end|><|tool_calls_section_end|>',
            "tool_call_parser": "kimi_k2",
            "tools": [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
        },
        lambda o: [c["name"] for c in o["calls"]] == ["add"] and json.loads(o["calls"][0]["parameters"]) == {"a": 1},
    ),
    (
        "Vertex predictions",
        "/vertex_generate",
        {"instances": [{"text": PROMPT}] * 2, "parameters": {"sampling_params": {"max_new_tokens": 4}}},
        lambda o: [len(p["output_ids"]) for p in o["predictions"]] == [4, 4],
    ),
    (
        "top_k -1 (no top-k)",
        "/generate",
        body(temperature=1.0, top_k=-1, ignore_eos=True),
        lambda o: len(o["output_ids"]) == 8,
    ),
    (
        "top_k at int32's maximum",
        "/generate",
        body(temperature=1.0, top_k=2**31 - 1, ignore_eos=True),
        lambda o: len(o["output_ids"]) == 8,
    ),
    (
        "all top log-probabilities",
        "/generate",
        {**body(max_new_tokens=2), "return_logprob": True, "top_logprobs_num": VOCAB},
        lambda o: all(len(row) == VOCAB for row in o["meta_info"]["output_top_logprobs"]),
    ),
    ("max_new_tokens 0", "/generate", body(max_new_tokens=0), lambda o: o["output_ids"] == []),
    ("huge temperature", "/generate", body(temperature=1e9, ignore_eos=True), lambda o: len(o["output_ids"]) == 8),
    ("n = 2", "/generate", body(n=2, temperature=0.8), lambda o: isinstance(o, list) and len(o) == 2),
    (
        "log-probabilities with top-k",
        "/generate",
        {**body(), "return_logprob": True, "top_logprobs_num": 5},
        lambda o: all(len(row) == 5 for row in o["meta_info"]["output_top_logprobs"]),
    ),
    ("regex constraint", "/generate", body(6, regex="[0-9]+"), is_digits),
    (
        "JSON-schema constraint",
        "/generate",
        body(8, json_schema=json.dumps({"type": "string", "enum": ["yes", "no"]})),
        is_yes_or_no,
    ),
    ("stop string", "/generate", body(40, stop=["="]), lambda o: "=" not in o["text"]),
    ("stop token id", "/generate", body(40, stop_token_ids=[13]), lambda o: o["output_ids"][-1] == 13),
    (
        "penalties",
        "/generate",
        body(temperature=0.7, frequency_penalty=1.5, presence_penalty=1.0, repetition_penalty=1.3, ignore_eos=True),
        lambda o: len(o["output_ids"]) == 8,
    ),
    (
        "sampling seed",
        "/generate",
        body(temperature=1.0, sampling_seed=123, ignore_eos=True),
        lambda o: len(o["output_ids"]) == 8,
    ),
    ("logit bias", "/generate", body(logit_bias={"5": 100.0}), lambda o: o["output_ids"] == [5] * 8),
    ("streaming, bad token id", "/generate", {"input_ids": [1, 10_000_000], "stream": True}, "error-event"),
    (
        "OpenAI completion",
        "/v1/completions",
        # greedy: sampled at temperature 1, an end-of-sequence first token (rare, but it happens) is a right answer
        {"model": "m", "prompt": PROMPT, "max_tokens": 4, "logprobs": 3, "temperature": 0},
        lambda o: o["choices"][0]["text"] and len(o["choices"][0]["logprobs"]["top_logprobs"][0]) == 3,
    ),
    (
        "OpenAI chat",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        lambda o: o["choices"][0]["message"]["content"] is not None,
    ),
    (  # keys the request model's validators read (reasoning), and OpenAI hints with nothing to serve
        "OpenAI chat, reasoning and storage hints",
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "reasoning": {"effort": "low"},
            "store": False,
            "metadata": {"team": "a"},
            "service_tier": "auto",
        },
        lambda o: o["choices"][0]["message"]["content"] is not None,
    ),
    (
        "OpenAI responses",
        "/v1/responses",
        # the Responses route serves only the served model's name (SGLang answers 404 for "m")
        {"model": str(TINY_MODEL), "input": "hi", "max_output_tokens": 4, "store": False, "prompt_cache_key": "k"},
        lambda o: o["output"][0]["content"][0]["text"] is not None,
    ),
    (  # an earlier answer sent back with OpenAI's empty response fields, a content part with a caching hint
        "OpenAI chat, a history with empty response fields",
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "Hello.", "refusal": None, "annotations": [], "audio": None},
                {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}]},
            ],
            "max_tokens": 4,
        },
        lambda o: o["choices"][0]["message"]["content"] is not None,
    ),
]


def serves(url: str) -> bool:
    """Whether the server still generates: one greedy token (SGLang's /health does the same after sleeping 1 s)."""
    response = requests.post(url + "/generate", json=body(max_new_tokens=1), timeout=60)
    return response.status_code == 200 and len(response.json()["output_ids"]) == 1


def post(url: str, path: str, payload) -> requests.Response:
    if isinstance(payload, str):
        return requests.post(url + path, data=payload, headers={"Content-Type": "application/json"}, timeout=600)
    return requests.post(url + path, json=payload, timeout=600)


def test_bad_and_unusual_requests(tree_server, tiny_server):
    url = tree_server.base_url
    prompts = gsm8k_prompts(4)
    before = [o["output_ids"] for o in generate_all(tiny_server.base_url, prompts, 1, max_new_tokens=24)]
    for name, path, payload, expected in MATRIX:
        response = post(url, path, payload)
        if expected == "4xx":
            assert 400 <= response.status_code < 500, f"{name}: HTTP {response.status_code} {response.text[:300]}"
        elif expected == "error-event":
            assert response.status_code == 200 and '"error"' in response.text and "vocabulary" in response.text, name
        else:
            assert response.status_code == 200, f"{name}: HTTP {response.status_code} {response.text[:300]}"
            assert expected(response.json()), f"{name}: {response.text[:300]}"
        assert serves(url), f"the server does not serve after: {name}"
    after = [o["output_ids"] for o in generate_all(url, prompts, 1, max_new_tokens=24)]
    assert after == before, "greedy output after the matrix differs from the non-speculative server's"


def test_a_memory_release_while_a_request_runs_is_refused_and_the_request_finishes(tree_server):
    """SGLang's scheduler asserted that it was idle, which ended the server."""
    url = tree_server.base_url
    payload = {"text": PROMPT, "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}, "stream": True}
    with requests.post(url + "/generate", json=payload, stream=True, timeout=600) as stream:
        lines = (line for line in stream.iter_lines() if line.startswith(b"data: {"))
        next(lines)  # the request is being decoded
        response = post(url, "/release_memory_occupation", {})
        last = json.loads([line for line in lines][-1][len(b"data: ") :])
    assert response.status_code == 400 and "being served" in response.text, response.text[:300]
    assert last["meta_info"]["completion_tokens"] == 300
    assert serves(url)


def test_ollama_generate_serves_the_autoregressive_greedy_output(tree_server, tiny_server):
    options = {"num_predict": 16, "temperature": 0, "seed": 1, "repeat_penalty": 1.0}
    reference = post(tiny_server.base_url, "/generate", {**body(16, temperature=0.0), "text": PROMPT}).json()
    for stream in (False, True):
        response = post(
            tree_server.base_url, "/api/generate", {**OLLAMA_GENERATE, "options": options, "stream": stream}
        )
        assert response.status_code == 200, response.text[:300]
        chunks = [json.loads(line) for line in response.text.splitlines() if line.strip()]
        assert chunks[-1]["done"] is True
        assert "".join(chunk["response"] for chunk in chunks) == reference["text"]
        assert chunks[-1]["eval_count"] == reference["meta_info"]["completion_tokens"], stream
        assert chunks[-1]["prompt_eval_count"] == reference["meta_info"]["prompt_tokens"], stream


def session_turn(
    url: str, session_id: str, text: str, max_new_tokens: int = 8, return_logprob: bool = False, **session_params
) -> dict:
    payload = {**body(max_new_tokens), "text": text, "session_params": {"id": session_id, **session_params}}
    if return_logprob:
        payload["return_logprob"] = True
    response = post(url, "/generate", payload)
    assert response.status_code == 200, response.text[:300]
    return response.json()


def test_a_session_started_over_is_served_as_a_fresh_prompt(tree_server, tiny_server):
    """replace without rid: SGLang's own clearing of the session's history ended the scheduler."""
    url = tree_server.base_url
    session_id = post(url, "/open_session", {"capacity_of_str_len": 4096}).json()
    try:
        first = session_turn(url, session_id, PROMPT)
        session_turn(url, session_id, " And then?", rid=first["meta_info"]["id"])
        restarted = session_turn(url, session_id, PROMPT, replace=True)
        assert serves(url)
        fresh = post(tiny_server.base_url, "/generate", {**body(8, temperature=0.0), "text": PROMPT}).json()
        assert restarted["output_ids"] == fresh["output_ids"] == first["output_ids"]
    finally:
        post(url, "/close_session", {"session_id": session_id})


SCHEMA_ERRORS = [  # (route, body, the 400's message) for bodies that fail the route's request model
    (
        "/v1/completions",
        {"model": "m", "prompt": "hi", "max_tokens": "ten"},
        "max_tokens: Input should be a valid integer",
    ),
    (  # a missing field: SGLang's message echoed the whole body, prompt included, twice
        "/v1/chat/completions",
        {"model": "m", "prompt": PROMPT * 40, "max_tokens": 4},
        "messages: Field required",
    ),
    (  # SGLang's message listed 5 errors, 3 of them about union members the client did not mean
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": 5}]},
        "messages.0.content: Input should be a valid string or Input should be a valid list (got 5)",
    ),
    (
        "/v1/responses",
        {"model": "m", "input": "hi", "temperature": "hot"},
        "temperature: Input should be a valid number",
    ),
]


def test_a_body_failing_its_schema_gets_one_line_naming_the_field(tree_server):
    for route, payload, message in SCHEMA_ERRORS:
        response = post(tree_server.base_url, route, payload)
        assert response.status_code == 400, f"{route}: HTTP {response.status_code} {response.text[:300]}"
        answer = response.json()
        text = answer["error"]["message"] if route == "/v1/responses" else answer["message"]
        assert text.startswith(message), f"{route} {payload}: {text[:500]}"
        assert "File " not in text and "site-packages" not in text and len(text) < 300, text[:500]


SMALL_POOL = 600  # KV tokens: less than the context, so one request can fill the pool


# A DFLASH-tree server with a small KV pool, which also serves streaming sessions (they only act for a session
# opened as one)
SMALL_POOL_TREE = server_config(
    "tree-small-pool",
    DFLASH_TREE + ["--max-total-tokens", str(SMALL_POOL), "--enable-streaming-session", "--disable-overlap-schedule"],
)


@pytest.fixture(scope="module")
def small_pool_tree_server(request, server_pool):
    yield server_pool.get(SMALL_POOL_TREE, request)
    server_pool.stop(SMALL_POOL_TREE)


def test_requests_that_fill_a_small_kv_pool(small_pool_tree_server, tiny_server):
    """A server whose KV pool holds fewer tokens than the context: requests whose prompt and output reach the pool's
    end, alone and among others. SGLang clips max_new_tokens to the pool counting one slot per decode step, and a
    speculative step reserves 2 x its draft tokens, so such a request was aborted with HTTP 500 ("Out of memory even
    after retracting all other requests"). Each is answered 200, ending with ``length`` where the pool ends, its
    tokens a prefix of the non-speculative server's; requests that fit are served whole."""
    url = small_pool_tree_server.base_url
    base = [(11 * i) % (VOCAB - 16) + 5 for i in range(SMALL_POOL)]
    near = [(base[:n], 64) for n in (500, 540, 560, 575, 585, 593)]  # 593: the longest prompt SGLang admits here
    short = [(base[i : i + 40], 24) for i in range(0, 160, 20)]  # fit with room to spare
    requests_ = near + short

    def run(server_url, case):
        ids, max_new = case
        payload = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "temperature": 0.0}}
        response = requests.post(server_url + "/generate", json=payload, timeout=600)
        return response.status_code, response.json()

    refs = [run(tiny_server.base_url, case)[1]["output_ids"] for case in requests_]  # greedy: the same each time
    for concurrency in (1, len(requests_)):  # alone, then all at once (the pool runs dry: retraction)
        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(lambda c: run(url, c), requests_))
        for case, ref, (status, out) in zip(requests_, refs, answers):
            assert status == 200, f"prompt of {len(case[0])} tokens at concurrency {concurrency}: {str(out)[:300]}"
            assert out["output_ids"] == ref[: len(out["output_ids"])], f"prompt of {len(case[0])} tokens"
            if len(out["output_ids"]) < len(ref):
                assert out["meta_info"]["finish_reason"]["type"] == "length"
                assert len(case[0]) + len(out["output_ids"]) > SMALL_POOL - 80, "clipped far from the pool's end"
        for ref, (_, out) in zip(refs[len(near) :], answers[len(near) :]):
            assert out["output_ids"] == ref
    assert serves(url)


# (text, max_new_tokens) of each turn; lengths at which, before the fix, turns 3 and 5 ended on a bonus token
STREAMING_TURNS = [
    (PROMPT, 16),
    (" Then he eats 2.", 3),
    (" How many are left?", 2),
    (" Explain.", 20),
    (" And tomorrow?", 9),
    (" Why?", 6),
]


def test_streaming_session_turns_equal_the_autoregressive_output(small_pool_tree_server, tiny_server):
    """Each turn of a streaming session keeps the KV of the turns before it. A finished turn's last output token is
    often a speculative step's bonus token, whose KV slot held a rejected draft token's: the next turn attended to it,
    so its log-probabilities (and, when that moved an argmax, its tokens) differed from the autoregressive server's
    on the same tokens."""
    url = small_pool_tree_server.base_url
    session_id = post(url, "/open_session", {"capacity_of_str_len": 4096, "streaming": True}).json()
    tokens: list[int] = []
    try:
        for turn, (text, max_new_tokens) in enumerate(STREAMING_TURNS):
            tokens += post(tiny_server.base_url, "/v1/tokenize", {"model": "m", "prompt": text}).json()["tokens"]
            out = session_turn(url, session_id, text, max_new_tokens=max_new_tokens, return_logprob=True)
            assert out["meta_info"]["prompt_tokens"] == len(tokens), f"turn {turn}: the session's history differs"
            sampling = body(max_new_tokens)["sampling_params"]
            reference = post(
                tiny_server.base_url,
                "/generate",
                {"input_ids": tokens, "sampling_params": sampling, "return_logprob": True},
            ).json()
            assert out["output_ids"] == reference["output_ids"], f"turn {turn}"
            got, expected = ([lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]] for o in (out, reference))
            error = max(abs(a - b) for a, b in zip(got, expected))
            # float32 servers agree to ~1e-6 (test_cpu_spec_decoding); one stale KV row moves them by far more
            assert len(got) == len(expected) and error < 1e-4, f"turn {turn}: log-probabilities differ by {error}"
            tokens += out["output_ids"]
    finally:
        post(url, "/close_session", {"session_id": session_id})


def target_top_logprobs(url: str, prompt_ids: list[int], output_ids: list[int], k: int) -> list[dict[int, float]]:
    """The non-speculative server's top-k log-probabilities of every output position (teacher-forced prompt)."""
    payload = {
        "input_ids": prompt_ids + output_ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True,
        "logprob_start_len": len(prompt_ids) - 1,  # its first row predicts nothing, the next ones the outputs
        "top_logprobs_num": k,
    }
    response = requests.post(url + "/generate", json=payload, timeout=600)
    assert response.status_code == 200, response.text[:300]
    rows = response.json()["meta_info"]["input_top_logprobs"][1:]
    return [{token: logprob for logprob, token, _ in row} for row in rows]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_sampling_mask_of_tree_verify_is_the_targets(tree_server, tiny_server, temperature):
    """``return_sampling_mask`` on a DFLASH-tree server: every committed token's support is the target's top-k at that
    position (the accepted path's own row, not the tree node's slot) and its log-probability is the target's,
    renormalised over the support at the request's temperature; greedy requests get the token itself, at 0."""
    _, tokenizer = hf_model()
    k = 3
    for prompt in gsm8k_prompts(3):
        ids = tokenizer(prompt)["input_ids"]
        sampled = {"max_new_tokens": 16, "temperature": temperature, "top_k": k}
        for params in (sampled, {"max_new_tokens": 16, "temperature": 0.0}):
            payload = {"input_ids": ids, "sampling_params": params, "return_sampling_mask": True}
            response = requests.post(tree_server.base_url + "/generate", json=payload, timeout=600)
            assert response.status_code == 200, response.text[:300]
            answer = response.json()
            out, meta = answer["output_ids"], answer["meta_info"]
            support, logprobs = meta["output_token_sampling_mask"], meta["output_token_sampling_logprobs"]
            assert len(support) == len(logprobs) == len(out)
            if params["temperature"] == 0.0:
                assert support == [[token] for token in out] and logprobs == [0.0] * len(out)
                continue
            for j, (token, row, logprob, target) in enumerate(
                zip(out, support, logprobs, target_top_logprobs(tiny_server.base_url, ids, out, k))
            ):
                assert token in row and set(row) == set(target), f"position {j}: support {row}, target top-{k} {target}"
                scaled = {t: lp / temperature for t, lp in target.items()}
                expected = scaled[token] - math.log(sum(math.exp(v) for v in scaled.values()))
                assert logprob == pytest.approx(expected, abs=2e-4), f"position {j}"  # float32 softmaxes
    assert serves(tree_server.base_url)


# A DFLASH-tree server that takes input_embeds (SGLang serves them only without the radix cache)
EMBEDS_TREE = server_config("dflash-tree-embeds", KIMI_CPU + DFLASH_TREE + ["--disable-radix-cache"])


@pytest.fixture(scope="module")
def embeds_server(request, server_pool):
    yield server_pool.get(EMBEDS_TREE, request)
    server_pool.stop(EMBEDS_TREE)


SERVERS = [TREE_SERVERS["dflash-tree-32"], TINY, SMALL_POOL_TREE, EMBEDS_TREE, TREE_SERVERS["eagle3-tree"]]


def test_prompts_given_as_embeddings(embeds_server, tiny_server):
    """``input_embeds`` on a DFLASH-tree server (rows of the target's embedding matrix for a prompt's tokens, one
    prompt and a batch of two): the greedy tokens the non-speculative server gives the same prompts as token ids.
    SGLang's Kimi class took no embeddings, and such a request ended the scheduler."""
    model, tokenizer = hf_model()
    embedding = model.get_input_embeddings().weight.detach()  # [vocab, hidden], float32 as the server's
    prompts = [tokenizer(p)["input_ids"] for p in gsm8k_prompts(3)]
    params = {"max_new_tokens": 32, "temperature": 0.0}
    reference = [o["output_ids"] for o in generate_all(tiny_server.base_url, prompts, 1, max_new_tokens=32)]
    single = {"input_embeds": embedding[prompts[0]].tolist(), "sampling_params": params}
    batch = {"input_embeds": [embedding[ids].tolist() for ids in prompts[1:]], "sampling_params": params}
    outputs = []
    for payload in (single, batch):
        response = requests.post(embeds_server.base_url + "/generate", json=payload, timeout=600)
        assert response.status_code == 200, response.text[:300]
        answer = response.json()
        outputs += [o["output_ids"] for o in (answer if isinstance(answer, list) else [answer])]
    assert outputs == reference
    assert serves(embeds_server.base_url)


# -- 200 concurrent mixed requests, 20 clients dropping their streams --------------------------------------------

CONCURRENT = 200
DROPPED = 20
SAMPLED = 80
TOKENS = 16


def stream_and_drop(url: str, prompt: str) -> int:
    """A streaming request whose client hangs up after the first chunks; returns the chunks read."""
    payload = {"text": prompt, "stream": True, "sampling_params": {"max_new_tokens": 64, "temperature": 0.0}}
    with requests.post(url + "/generate", json=payload, stream=True, timeout=600) as response:
        assert response.status_code == 200
        chunks = 0
        for line in response.iter_lines():
            if line.startswith(b"data:"):
                chunks += 1
            if chunks >= 2:
                break  # the connection closes here, mid-stream
    return chunks


@pytest.fixture(scope="module")
def mixed_prompts():
    return gsm8k_prompts(CONCURRENT - SAMPLED - DROPPED)


@pytest.fixture(scope="module")
def greedy_reference(tiny_server, mixed_prompts):
    return [o["output_ids"] for o in generate_all(tiny_server.base_url, mixed_prompts, 8, max_new_tokens=TOKENS)]


@pytest.fixture(scope="module", params=["dflash-tree-32", "eagle3-tree"])
def spec_server(request, server_pool):
    return shared_tree_server(server_pool, request, request.param)


def test_200_concurrent_mixed_requests_with_dropped_streams(spec_server, mixed_prompts, greedy_reference):
    url = spec_server.base_url
    rng = random.Random(0)
    jobs = [("greedy", i) for i in range(len(mixed_prompts))]
    jobs += [("sampled", i) for i in range(SAMPLED)] + [("dropped", i) for i in range(DROPPED)]
    rng.shuffle(jobs)
    lock = threading.Lock()
    results: dict[tuple[str, int], object] = {}

    def run(job):
        kind, i = job
        if kind == "greedy":
            out = generate_all(url, [mixed_prompts[i]], 1, max_new_tokens=TOKENS)[0]
        elif kind == "sampled":
            prompt = mixed_prompts[i % len(mixed_prompts)]
            out = generate_all(url, [prompt], 1, max_new_tokens=TOKENS, temperature=0.8, top_p=0.9)[0]
        else:
            out = stream_and_drop(url, mixed_prompts[i])
        with lock:
            results[job] = out

    with ThreadPoolExecutor(CONCURRENT) as pool:
        list(pool.map(run, jobs))
    assert len(results) == CONCURRENT
    for i, reference in enumerate(greedy_reference):
        assert results[("greedy", i)]["output_ids"] == reference, f"greedy request {i} differs under load"
    for i in range(SAMPLED):  # complete answers (a sampled answer may end early on an end-of-turn token)
        out = results[("sampled", i)]
        assert out["meta_info"]["finish_reason"]["type"] in ("length", "stop"), out["meta_info"]
        assert 1 <= len(out["output_ids"]) <= TOKENS and all(0 <= t < VOCAB for t in out["output_ids"])
    assert all(results[("dropped", i)] >= 1 for i in range(DROPPED))
    # the dropped requests were aborted, not left running: the server is idle and still serves
    assert requests.get(url + "/health", timeout=60).status_code == 200
    info = requests.get(url + "/server_info", timeout=60).json()
    assert sum(state.get("num_running_reqs", 0) or 0 for state in info.get("internal_states", [])) == 0, info
    assert spec_metrics(url)["steps"] > 0


END_OF_CONTEXT = {
    "input_ids": [(7 * i) % (VOCAB - 16) + 5 for i in range(CONTEXT - 96)],
    "sampling_params": {"temperature": 0.0, "ignore_eos": True},
}  # no max_new_tokens: decoding runs into the end of the context


def end_of_context_output(url: str) -> list[int]:
    response = requests.post(url + "/generate", json=END_OF_CONTEXT, timeout=600)
    assert response.status_code == 200, response.text[:300]
    return response.json()["output_ids"]


@pytest.fixture(scope="module")
def end_of_context_reference(tiny_server) -> list[int]:
    output = end_of_context_output(tiny_server.base_url)
    assert len(END_OF_CONTEXT["input_ids"]) + len(output) >= CONTEXT - 4, "the request should decode to the end"
    return output


def test_decoding_up_to_the_end_of_the_context(spec_server, end_of_context_reference):
    """A request without ``max_new_tokens`` whose decoding runs into the end of the context. Each speculative step
    reserves KV past the committed length beyond the context: 2 x 33 tokens for the DFLASH tree's verify window, 2 x
    steps x topk = 24 for the EAGLE3 tree (whose row had 12 slots of headroom: the scheduler died). Served with the
    non-speculative server's tokens, up to the context's end, and the server goes on serving."""
    assert end_of_context_output(spec_server.base_url) == end_of_context_reference
    assert serves(spec_server.base_url)
