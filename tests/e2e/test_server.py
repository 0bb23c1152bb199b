"""Real SGLang on CPU with the plugin: registration seen from the scheduler, endpoints, determinism, shutdown."""

import json
import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from support.processes import busy_while_idle, tagged
from support.served_logprobs import compare_logprobs
from support.spec_e2e import TINY

from sglang_kimi.launcher.server import fetch_plugin_state
from sglang_kimi.plugin import CUDA_STAND_IN, REGISTRATIONS

pytestmark = pytest.mark.e2e
SERVERS = [TINY]

DEMO_TAG = "SGLANG_KIMI_TEST_DEMO"  # an environment variable marking the processes of one demo run
GPU_ONLY_ENTRIES = {"moe-verify-configs", "aiter-verify-env"} | {
    e.name for e in REGISTRATIONS if e.when == CUDA_STAND_IN
}  # skipped on this CPU, with the reason

PROMPT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:"
)


def generate(base_url: str, text: str, max_new_tokens: int = 24, **extra) -> dict:
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0}, **extra}
    response = requests.post(base_url + "/generate", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


def test_plugin_registered_in_the_scheduler_process(tiny_server):
    state = fetch_plugin_state(tiny_server.base_url)
    assert state["failed"] == []
    assert set(state["registrations"]) == {entry.name for entry in REGISTRATIONS}
    not_ok = {name: outcome for name, outcome in state["registrations"].items() if outcome != "ok"}
    assert set(not_ok) == GPU_ONLY_ENTRIES and all(o.startswith("skipped: ") for o in not_ok.values()), not_ok
    scheduler_pid = state["pid"]
    assert scheduler_pid != tiny_server.proc.pid
    assert Path(f"/proc/{scheduler_pid}/comm").read_text().startswith("sglang::schedul")


def test_generate_and_openai_endpoints_answer(tiny_server):
    url = tiny_server.base_url
    out = generate(url, PROMPT)
    assert out["text"] and len(out["output_ids"]) == out["meta_info"]["completion_tokens"] > 0

    completion = requests.post(
        url + "/v1/completions",
        json={"model": "tiny", "prompt": PROMPT, "max_tokens": 16, "temperature": 0},
        timeout=300,
    ).json()
    assert completion["choices"][0]["text"] == generate(url, PROMPT, 16)["text"]

    chat = requests.post(
        url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "How many eggs?"}], "max_tokens": 16},
        timeout=300,
    ).json()
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] > 0

    # the Responses API renders the same chat prompt: its greedy answer is a prefix of the chat completion's
    model = requests.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    message = "How many eggs?"
    greedy_chat = requests.post(
        url + "/v1/chat/completions",
        json={"model": model, "messages": [{"role": "user", "content": message}], "max_tokens": 16, "temperature": 0},
        timeout=300,
    ).json()["choices"][0]["message"]["content"]
    response = requests.post(
        url + "/v1/responses",
        json={"model": model, "input": message, "max_output_tokens": 16, "temperature": 0},
        timeout=300,
    )
    assert response.status_code == 200, response.text
    texts = [part["text"] for item in response.json()["output"] for part in item.get("content") or []]
    assert texts and texts[0] and greedy_chat.startswith(texts[0]), (texts, greedy_chat)


def test_greedy_is_deterministic_sequential_and_batched(tiny_server):
    url = tiny_server.base_url
    prompts = [
        PROMPT,
        "Question: A robe takes 2 bolts of blue fiber.\nAnswer:",
        "Question: Josh buys a house.\nAnswer:",
    ]
    sequential = [generate(url, p, 32)["output_ids"] for p in prompts]
    assert [generate(url, p, 32)["output_ids"] for p in prompts] == sequential
    with ThreadPoolExecutor(len(prompts)) as pool:
        batched = list(pool.map(lambda p: generate(url, p, 32)["output_ids"], prompts))
    assert batched == sequential


def test_logprobs_match_transformers_prefill_and_decode(tiny_server):
    """SGLang (float32, CPU, with the plugin's absorbed-MLA fix) computes what transformers' DeepseekV3 computes."""
    import torch
    from support.hf_reference import load_hf_reference

    model, tokenizer = load_hf_reference()
    compared = compare_logprobs(tiny_server.base_url, model, tokenizer, PROMPT)
    prefill_error = compared.error(slice(None, compared.num_prefill))
    decode_error = compared.error(slice(compared.num_prefill, None))
    assert prefill_error < 1e-3 and decode_error < 1e-3, (prefill_error, decode_error)
    greedy = model.generate(torch.tensor([compared.prompt_ids]), max_new_tokens=16, do_sample=False)
    assert greedy[0, len(compared.prompt_ids) :].tolist() == compared.output_ids


def test_demo_prints_answers_and_stops_the_server(tiny_server, tmp_path):
    tag = f"demo-{uuid.uuid4().hex}"  # inherited by the demo's server and its workers
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_kimi.cli.main",
            "demo",
            "--questions",
            "2",
            "--max-new-tokens",
            "32",
            "--modes",
            "autoregressive",
            "--log-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, DEMO_TAG: tag},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    text = out.stdout
    assert text.count("Answer:") == 2 and "tokens/s" in text and "server stopped" in text
    for entry in REGISTRATIONS:
        assert f"{entry.name}" in text
    assert "NOT LOADED" not in text and "failed" not in text
    assert not tagged(DEMO_TAG, tag), "the demo left processes behind"


def test_an_idle_server_waits_instead_of_polling(tiny_server):
    """Once its requests are answered no process of the server spins: an idle server beside the tests (the session
    keeps several) must not take their cores."""
    generate(tiny_server.base_url, PROMPT, max_new_tokens=8)
    busy = busy_while_idle(tiny_server)
    assert not busy, f"idle server processes using a core: {busy}"


def test_drafter_regenerate_writes_the_targets_own_greedy_answers(tiny_server, tmp_path):
    """``sglang-kimi drafter regenerate`` through the real server's chat route (its model id, sampling options and
    ``chat_template_kwargs`` accepted): at temperature 0 each regenerated turn is the target's greedy chat answer."""
    from sglang_kimi.cli import main as cli

    questions = ["How many legs do 3 cats have?", "What is 12 + 30?"]
    source = tmp_path / "prompts.jsonl"
    rows = [{"id": "one", "conversations": [{"from": "human", "value": questions[0]}, {"from": "gpt", "value": "?"},
                                            {"from": "human", "value": "And 4 cats?"}]},
            {"prompt": questions[1]}]  # fmt: skip
    source.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "regen.jsonl"
    args = ["drafter", "regenerate", "--input", str(source), "--output", str(out), "--base-url", tiny_server.base_url,
            "--temperature", "0", "--max-tokens", "16", "--top-k", "1", "--reasoning", "disable"]  # fmt: skip
    assert cli.main(args) == 0
    done = {row["id"]: row["conversations"] for row in map(json.loads, out.read_text().splitlines())}

    def chat(messages):
        body = {"model": "default", "messages": messages, "max_tokens": 16, "temperature": 0}
        response = requests.post(tiny_server.base_url + "/v1/chat/completions", json=body, timeout=300)
        response.raise_for_status()
        return response.json()["choices"][0]["message"]["content"]

    first = chat([{"role": "user", "content": questions[0]}])
    second = chat([{"role": "user", "content": questions[0]}, {"role": "assistant", "content": first},
                   {"role": "user", "content": "And 4 cats?"}])  # fmt: skip
    assert [m["content"] for m in done["one"]] == [questions[0], first, "And 4 cats?", second]
    assert [m["role"] for m in done["one"]] == ["user", "assistant", "user", "assistant"]
    assert done["row-1"][1] == {"role": "assistant", "content": chat([{"role": "user", "content": questions[1]}])}
