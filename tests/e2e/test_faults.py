"""Faults that must lose nothing, on DFLASH-tree servers:

- KV-cache pressure: a KV pool too small for the concurrent requests makes SGLang retract and re-queue requests in
  the middle of speculation; every greedy output still equals the non-speculative server's.
- A drafter that emits NaN logits (a corrupted checkpoint made here), served by ``sglang-kimi serve`` given only the
  speculative flags: the server keeps serving, its outputs equal the non-speculative ones, tau falls towards 1, and
  the plugin counts the non-finite draft positions and logs them.
- SIGTERM to that ``sglang-kimi serve`` with requests in flight, at the end of its life: each gets a complete answer
  or a clean error (the connection closes), nothing hangs, ``serve`` exits 130 as for Ctrl-C, and no process is left
  behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch
from safetensors.torch import load_file, save_file
from support.processes import children
from support.servers import server_config
from support.spec_e2e import KIMI_CPU, TINY, generate_all, gsm8k_prompts, spec_metrics

from sglang_kimi.assets import TINY_DFLASH
from sglang_kimi.launcher.server import ANY_PORT, ServerProcess, group_alive, launch_command

TREE = ["--speculative-algorithm", "DFLASH", "--speculative-dflash-tree-budget", "16"]


def dflash_tree(drafter: Path = TINY_DFLASH) -> list[str]:
    return [*KIMI_CPU, *TREE, "--speculative-draft-model-path", str(drafter)]


# -- KV-cache pressure ---------------------------------------------------------------------------------------------

PRESSURE_PROMPTS = 8
PRESSURE_TOKENS = 32
POOL_TOKENS = 480  # 8 requests of ~60 prompt + 32 new tokens (+ a 17-token verify window) need ~870
# SGLang admits a request when its prompt plus (new-token ratio x max_new_tokens) fits; the ratio starts at
# 0.7 x conservativeness. At 0.05 it admits nearly as many requests as the prompts alone allow, so decoding runs
# out of pages and must retract whatever order the requests arrive in (at 1.0 it may queue them and never retract).
CONSERVATIVENESS = "0.05"
KV_PRESSURE = server_config(
    "kv_pressure",
    dflash_tree() + ["--max-total-tokens", str(POOL_TOKENS), "--schedule-conservativeness", CONSERVATIVENESS],
)
SERVERS = [TINY, KV_PRESSURE]


def test_kv_pressure_retracts_and_keeps_greedy_parity(request, server_pool, tiny_server):
    prompts = gsm8k_prompts(PRESSURE_PROMPTS)
    reference = generate_all(tiny_server.base_url, prompts, len(prompts), max_new_tokens=PRESSURE_TOKENS)
    server = server_pool.get(KV_PRESSURE, request)
    # one batched request: the prompts reach the scheduler together (separate requests arrive spread out on a busy
    # machine, and the first can finish before the last is admitted, leaving no pressure)
    body = {"text": prompts, "sampling_params": {"temperature": 0, "max_new_tokens": PRESSURE_TOKENS}}
    try:
        response = requests.post(server.base_url + "/generate", json=body, timeout=600)
    finally:
        server_pool.stop(KV_PRESSURE)
    assert response.status_code == 200, response.text[:500]
    outputs = response.json()
    retractions = sum(o["meta_info"].get("num_retractions", 0) for o in outputs)
    print(f"KV pool of {POOL_TOKENS} tokens: {retractions} retractions over {PRESSURE_PROMPTS} requests")
    assert retractions > 0, "the pool was large enough: no request was retracted, the test tests nothing"
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        assert out["output_ids"] == ref["output_ids"], f"request {i} (retracted {out['meta_info']}) differs"


# -- a drafter that emits NaN ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nan_drafter(tmp_path_factory) -> Path:
    """The trained DFlash drafter with NaN in its context projection: every draft logit is NaN."""
    path = tmp_path_factory.mktemp("nan_drafter") / "tiny-kimi-k2.6-dflash-nan"
    shutil.copytree(TINY_DFLASH, path)
    weights = load_file(path / "model.safetensors")
    weights["fc.weight"] = torch.full_like(weights["fc.weight"], float("nan"))
    save_file(weights, path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"]
    return path


@pytest.fixture(scope="module")
def nan_serve(tmp_path_factory, nan_drafter):
    """``sglang-kimi serve`` given only the speculative flags and a port: its own CPU defaults (the attention backend
    included), what a newcomer's first speculative server runs on. The SIGTERM test ends it."""
    args = [*TREE, "--speculative-draft-model-path", str(nan_drafter)]
    spec = launch_command(args, port=ANY_PORT)
    spec.argv = [str(Path(sys.executable).parent / "sglang-kimi"), "serve", "--port", str(spec.port), *args]
    server = ServerProcess(spec, tmp_path_factory.mktemp("nan_serve") / "serve.log")
    try:
        server.wait_ready(600)
        yield server
    finally:
        server.stop()


def test_a_nan_drafter_costs_acceptance_only(tiny_server, nan_serve):
    prompts = gsm8k_prompts(4)
    reference = generate_all(tiny_server.base_url, prompts, len(prompts), max_new_tokens=24)
    outputs = generate_all(nan_serve.base_url, prompts, 2, max_new_tokens=24)
    metrics = spec_metrics(nan_serve.base_url)
    assert requests.get(nan_serve.base_url + "/health", timeout=60).status_code == 200
    log = nan_serve.log_path.read_text(errors="replace")
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        assert out["output_ids"] == ref["output_ids"], f"request {i} differs with a NaN drafter"
    assert metrics["nonfinite_draft_positions"] > 0 and metrics["nonfinite_draft_steps"] > 0, metrics
    print(f"NaN drafter: tau {metrics['tau']:.2f}, {metrics['nonfinite_draft_positions']} non-finite draft positions")
    assert metrics["tau"] < 1.5, f"tau {metrics['tau']:.2f} with blind drafts"
    assert "the drafter produced non-finite logits" in log


# -- SIGTERM with requests in flight --------------------------------------------------------------------------------

IN_FLIGHT = 6


def stream(url: str, prompt: str, started) -> str:
    """A long streaming request: "complete" (the stream ended with [DONE] after a finish reason) or "closed" (the
    connection ended early, cleanly: a client-side error, not a hang)."""
    payload = {"text": prompt, "stream": True, "sampling_params": {"max_new_tokens": 400, "temperature": 0.0}}
    finished = False
    try:
        with requests.post(url + "/generate", json=payload, stream=True, timeout=120) as response:
            for line in response.iter_lines():
                started()
                if line == b"data: [DONE]":
                    return "complete" if finished else "closed"
                if line.startswith(b"data:") and b'"finish_reason":{' in line:
                    finished = True
    except requests.RequestException:
        return "closed"
    return "closed"


def test_sigterm_with_requests_in_flight(tiny_server, nan_serve):
    """`sglang-kimi serve` serves the non-speculative greedy output, then a SIGTERM with streams in flight: each
    stream complete or cleanly closed, exit code 130 (as for Ctrl-C), no SGLang process left behind."""
    server = nan_serve
    prompts = gsm8k_prompts(IN_FLIGHT)
    try:
        (sglang_group,) = children(server.proc.pid)  # `serve` runs SGLang in a process group of its own
        served = generate_all(server.base_url, prompts[:1], 1, max_new_tokens=32)[0]["output_ids"]
        assert served == generate_all(tiny_server.base_url, prompts[:1], 1, max_new_tokens=32)[0]["output_ids"]
        first_chunks = []
        with ThreadPoolExecutor(IN_FLIGHT) as pool:
            futures = [pool.submit(stream, server.base_url, p, lambda: first_chunks.append(1)) for p in prompts]
            deadline = time.monotonic() + 300
            while len(first_chunks) < IN_FLIGHT and time.monotonic() < deadline:
                time.sleep(0.2)
            assert first_chunks, "no request started streaming"
            os.kill(server.proc.pid, signal.SIGTERM)  # what an operator or an orchestrator sends
            outcomes = [f.result(timeout=180) for f in futures]
        code = server.proc.wait(timeout=120)
    finally:
        server.stop()
    print(f"SIGTERM with {IN_FLIGHT} streams in flight: {sorted(outcomes)}, exit code {code}")
    assert set(outcomes) <= {"complete", "closed"}, outcomes
    assert code == 130, server.log_path.read_text(errors="replace")[-3000:]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and group_alive(sglang_group):
        time.sleep(0.5)
    assert not group_alive(sglang_group), "SGLang's processes outlived the SIGTERM"
    assert not group_alive(server.pgid)
