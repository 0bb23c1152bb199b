"""Adaptive speculation (``--speculative-kimi-adaptive``) served for real on CPU: the width changes, the output
does not.

The policy is forced to switch often (one step in two explores another width, no hysteresis), so a request runs
many widths, 0 (no draft) included. DFLASH chains (the plugin's worker; DFlash2's too, whose narrower steps walk its
candidate selector) and EAGLE3 chains (SGLang's adaptive runtime with the plugin's policy) here, DFLASH trees in
``test_parallel.py`` (adaptive at TP 2: greedy equal to TP 1, sampled tokens exact samples of the target):
- greedy: every token equals the non-speculative server's at concurrency 1 and 8, and the log-probabilities the
  server reports for them (from verify windows of changing widths) equal transformers';
- sampled (temperature 1, top-p 0.9): every token is an exact sample of the target (the PIT test of
  ``test_cpu_spec_decoding.py``);
- the switches are real: ``/server_info`` counts steps at several widths, each change of a bucket's width is one log
  line, and Prometheus carries the chosen widths;
- the cost profile: a file made for another setup is logged as such and replaced by a fresh profile keyed to this
  server (reuse on a restart: ``tests/unit/test_adaptive_serving.py``), whose drafting steps, the drafter's share
  included, cost more than width 0's (medians over all buckets: one timing per cell).
"""

from __future__ import annotations

import json
import re

import pytest
import requests
from support.servers import server_config
from support.spec_e2e import KIMI_CPU, TINY, check_greedy_parity, greedy_reference, gsm8k_prompts, sampled_pit_pvalue

from sglang_kimi.assets import TINY_DFLASH, TINY_DFLASH2, TINY_EAGLE3

pytestmark = pytest.mark.e2e

NUM_PROMPTS = 6
# Start narrow, so that each bucket that runs switches at least once, whatever widths this machine's costs favour
# every due exploration runs (explore_budget 1: no limit on what it may cost), every other step
FORCED_SWITCHING = {"explore_every": 2, "explore_budget": 1, "hysteresis": 0.0, "buckets": [1, 4, 8],
                    "initial_width": 1}  # fmt: skip
SPECULATORS = {
    "dflash-chain": ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(TINY_DFLASH)],
    # DFlash2: narrower steps walk the selector's lattice here, the block-wide one is SGLang's DFlash2 chain step
    "dflash2-chain": ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(TINY_DFLASH2)],
    "eagle3-chain": ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(TINY_EAGLE3),
                     "--speculative-num-steps", "4"],
}  # fmt: skip
# a profile left by another setup (another GPU, TP 8): must be reported and replaced, never used
STALE_PROFILE = {"format": "sglang-kimi-cost-profile/1", "key": {"device": "cuda:NVIDIA H200", "tp_size": 8},
                 "created": "2026-01-01T00:00:00Z", "seconds": {"1": {"0": 1e-9}}}  # fmt: skip


@pytest.fixture(scope="module")
def prompts():
    return gsm8k_prompts(NUM_PROMPTS)


@pytest.fixture(scope="module")
def reference(tiny_server, prompts):
    return greedy_reference(tiny_server.base_url, prompts)


# adaptive chains with the forced-switching policy, started over a stale profile file
ADAPTIVE = {
    name: server_config(
        f"adaptive-{name}",
        KIMI_CPU + ["--enable-metrics"] + args + [
            "--speculative-kimi-adaptive",
            "--speculative-kimi-adaptive-config", "{dir}/policy.json",
            "--speculative-kimi-adaptive-profile", "{dir}/profile.json",
        ],
        files={"policy.json": json.dumps(FORCED_SWITCHING), "profile.json": json.dumps(STALE_PROFILE)},
    )
    for name, args in sorted(SPECULATORS.items())
}  # fmt: skip
SERVERS = [TINY, *ADAPTIVE.values()]


@pytest.fixture(scope="module", params=sorted(SPECULATORS))
def adaptive_server(request, server_pool):
    config = ADAPTIVE[request.param]
    yield server_pool.get(config, request)
    server_pool.stop(config)


def adaptive_state(url: str) -> dict:
    info = requests.get(url + "/server_info", timeout=60).json()
    return info["internal_states"][0]["sglang_kimi"]["adaptive"]


def test_greedy_output_is_unchanged_while_the_width_switches(adaptive_server, prompts, reference):
    url = adaptive_server.base_url
    outputs, logprobs = reference
    for concurrency in (1, 8):
        stats = check_greedy_parity(url, prompts, outputs, logprobs, concurrency)
        print(concurrency, stats)

    state = adaptive_state(url)
    print(json.dumps(state)[:2000])
    ran = {int(w): n for w, n in state["steps_by_width"].items() if n}
    assert len(ran) >= 3 and 0 in ran, f"the forced policy ran too few widths: {ran}"
    if state["mode"] == "DFLASH chain":  # the block's full chain: SGLang's own chain step
        assert max(state["widths"]) in ran, f"the block-wide chain never ran: {ran}"
    info = requests.get(url + "/server_info", timeout=60).json()
    if info["speculative_draft_model_path"] == str(TINY_DFLASH2):  # narrower DFlash2 chains walk its selector
        sources = info["internal_states"][0]["sglang_kimi"]["spec_metrics"]["draft_steps_by_source"]
        assert sources["selector_walk"] > 0 and sources["eager"] == 0, sources
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
    # every cell timed (what a cell runs, the drafter included, is tests/unit/test_adaptive_profile_step.py's: on a
    # busy machine the seconds themselves can order any way)
    assert all(len(row) == len(state["widths"]) and min(row.values()) > 0 for row in saved["seconds"].values())

    metrics = requests.get(url + "/metrics", timeout=60).text
    assert re.search(r'^sglang_kimi:adaptive_width\{[^}]*bucket="1"[^}]*\} \d', metrics, re.M), "no chosen widths"
    assert "sglang_kimi:adaptive_steps_total" in metrics


TOP_P = 0.9
SAMPLED_REQUESTS = 80
SAMPLED_TOKENS = 4
SAMPLED_CHAIN = {"max_new_tokens": 24, "temperature": 1.0, "top_p": TOP_P}


def widths_run_since(before: dict, url: str) -> dict[int, int]:
    """{width: decode steps run at it since ``before``}, the widths that ran."""
    after = adaptive_state(url)["steps_by_width"]
    ran = {int(w): n - before["steps_by_width"].get(w, 0) for w, n in after.items()}
    return {w: n for w, n in ran.items() if n}


def test_sampling_follows_the_target_distribution_while_the_width_switches(adaptive_server, prompts):
    before = adaptive_state(adaptive_server.base_url)
    pvalue, greedy_pvalue, outside = sampled_pit_pvalue(
        adaptive_server.base_url, prompts[0], SAMPLED_REQUESTS, SAMPLED_TOKENS, TOP_P
    )
    print(f"sampled adaptive chain: PIT chi-square p-value {pvalue:.3g} (argmax tokens: {greedy_pvalue:.3g})")
    assert outside <= max(1, SAMPLED_REQUESTS * SAMPLED_TOKENS // 100), f"{outside} tokens outside the support"
    assert pvalue > 1e-3, f"sampled tokens do not follow the target distribution (p = {pvalue:.3g})"
    assert greedy_pvalue < 1e-6
    ran = widths_run_since(before, adaptive_server.base_url)
    assert len(ran) >= 3, ran
    if before["mode"] == "DFLASH chain":  # sampled requests through SGLang's own chain step too (DFlash2: its walk)
        widest, body = max(before["widths"]), {"text": prompts[1], "sampling_params": SAMPLED_CHAIN}
        for _ in range(12):  # the forced policy picks widths at random: sampled steps until the widest has run
            if widest in ran:
                break
            response = requests.post(adaptive_server.base_url + "/generate", json=body, timeout=600)
            assert response.status_code == 200, response.text[:300]
            ran = widths_run_since(before, adaptive_server.base_url)
        assert widest in ran, f"the block-wide chain never ran a sampled request: {ran}"
