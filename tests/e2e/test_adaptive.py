"""Adaptive speculation (``--speculative-kimi-adaptive``) served for real on CPU: the width changes, the output
does not.

The policy is forced to switch often (one step in two explores another width, no hysteresis), so a request runs
many widths, 0 (no draft) included. DFLASH chains here, DFLASH trees in ``test_tensor_parallel.py`` (adaptive at
TP 2: greedy equal to TP 1, sampled tokens exact samples of the target):
- greedy: every token equals the non-speculative server's at concurrency 1 and 8, and the log-probabilities the
  server reports for them (from verify windows of changing widths) equal transformers';
- sampled (temperature 1, top-p 0.9): every token is an exact sample of the target (the PIT test of
  ``test_cpu_spec_decoding.py``);
- the switches are real: ``/server_info`` counts steps at several widths, each change of a bucket's width is one log
  line, and Prometheus carries the chosen widths;
- the cost profile: a file made for another setup is logged as such and replaced by a fresh profile keyed to this
  server (reuse on a restart: ``tests/unit/test_adaptive_serving.py``).
"""

from __future__ import annotations

import json
import re

import pytest
import requests
from spec_common import (
    KIMI_CPU,
    TRAINED_DFLASH,
    check_greedy_parity,
    generate_all,
    gsm8k_prompts,
    hf_logprobs,
    sampled_pit_pvalue,
)
from support.servers import launch

from sglang_kimi.server import group_alive

pytestmark = pytest.mark.e2e

NUM_PROMPTS = 6
FORCED_SWITCHING = {"explore_every": 2, "hysteresis": 0.0, "buckets": [1, 4, 8]}
DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(TRAINED_DFLASH)]
MODES = {"chain": []}


@pytest.fixture(scope="module")
def prompts():
    return gsm8k_prompts(NUM_PROMPTS)


@pytest.fixture(scope="module")
def reference(tiny_server, prompts):
    outputs = [o["output_ids"] for o in generate_all(tiny_server.base_url, prompts, 1)]
    return outputs, hf_logprobs(prompts, outputs)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("adaptive")
    config = root / "policy.json"
    config.write_text(json.dumps(FORCED_SWITCHING))
    return root, config


def adaptive_args(mode: str, files) -> list[str]:
    root, config = files
    return KIMI_CPU + ["--enable-metrics"] + DFLASH + MODES[mode] + [
        "--speculative-kimi-adaptive",
        "--speculative-kimi-adaptive-config", str(config),
        "--speculative-kimi-adaptive-profile", str(root / f"profile-{mode}.json"),
    ]  # fmt: skip


def _start(mode: str, tmp_path_factory, files):
    root, _ = files
    # a profile left by another setup (another GPU, TP 8): must be reported and replaced, never used
    stale = {"format": "sglang-kimi-cost-profile/1", "key": {"device": "cuda:NVIDIA H200", "tp_size": 8},
             "created": "2026-01-01T00:00:00Z", "seconds": {"1": {"0": 1e-9}}}  # fmt: skip
    (root / f"profile-{mode}.json").write_text(json.dumps(stale))
    server = launch(tmp_path_factory, f"adaptive-{mode}", adaptive_args(mode, files))
    server.mode = mode
    return server


def _stop(server):
    server.stop()
    assert not group_alive(server.pgid), "the server left processes behind"


@pytest.fixture(scope="module")
def chain_server(tmp_path_factory, files):
    server = _start("chain", tmp_path_factory, files)
    yield server
    _stop(server)


def adaptive_state(url: str) -> dict:
    info = requests.get(url + "/server_info", timeout=60).json()
    return info["internal_states"][0]["sglang_kimi"]["adaptive"]


@pytest.mark.parametrize("mode", list(MODES))
def test_greedy_output_is_unchanged_while_the_width_switches(request, mode, prompts, reference):
    adaptive_server = request.getfixturevalue(f"{mode}_server")
    url = adaptive_server.base_url
    outputs, logprobs = reference
    for concurrency in (1, 8):
        stats = check_greedy_parity(url, prompts, outputs, logprobs, concurrency)
        print(adaptive_server.mode, concurrency, stats)

    state = adaptive_state(url)
    print(json.dumps(state)[:2000])
    ran = {int(w): n for w, n in state["steps_by_width"].items() if n}
    assert len(ran) >= 3 and 0 in ran, f"the forced policy ran too few widths: {ran}"
    switches = sum(b["switches"] for b in state["buckets"].values())
    assert switches >= 2
    log = adaptive_server.log_path.read_text()
    assert len(re.findall(r"batch bucket <= \d+ now runs width \d+", log)) == switches  # one line per change

    # the stale profile was reported, measured afresh and rewritten for this server's setup
    assert "was made for another setup" in log and "cuda:NVIDIA H200" in log
    assert state["profile"]["measured_at_start"] is True
    saved = json.loads(open(state["profile"]["file"]).read())
    assert saved["key"] == state["profile"]["key"] and saved["key"]["device"].startswith("cpu:")
    assert set(saved["seconds"]) == {"1", "4", "8"}

    metrics = requests.get(url + "/metrics", timeout=60).text
    assert re.search(r'^sglang_kimi:adaptive_width\{[^}]*bucket="1"[^}]*\} \d', metrics, re.M), "no chosen widths"
    assert "sglang_kimi:adaptive_steps_total" in metrics


TOP_P = 0.9
SAMPLED_REQUESTS = 80
SAMPLED_TOKENS = 4


def test_sampling_follows_the_target_distribution_while_the_width_switches(chain_server, prompts):
    adaptive_server = chain_server
    pvalue, greedy_pvalue, outside = sampled_pit_pvalue(
        adaptive_server.base_url, prompts[0], SAMPLED_REQUESTS, SAMPLED_TOKENS, TOP_P
    )
    print(f"sampled adaptive chain: PIT chi-square p-value {pvalue:.3g} (argmax tokens: {greedy_pvalue:.3g})")
    assert outside <= max(1, SAMPLED_REQUESTS * SAMPLED_TOKENS // 100), f"{outside} tokens outside the support"
    assert pvalue > 1e-3, f"sampled tokens do not follow the target distribution (p = {pvalue:.3g})"
    assert greedy_pvalue < 1e-6
    ran = [w for w, n in adaptive_state(adaptive_server.base_url)["steps_by_width"].items() if n]
    assert len(ran) >= 3
