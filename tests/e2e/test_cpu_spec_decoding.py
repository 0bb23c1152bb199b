"""SGLang's speculative decoding, served for real on CPU through the plugin: EAGLE3 chains and trees and DFLASH
chains on the ``kimi_cpu`` attention backend, with the tiny Kimi target.

- Greedy: every speculative server's tokens equal the non-speculative server's, token for token (several GSM8K
  prompts, sequential and concurrent), and the log-probabilities it reports for them (computed from its verify
  forwards: chain and tree masks) equal transformers' for the same tokens.
- Sampled (temperature 1, top-p 0.9, EAGLE3 tree): every emitted token is an exact sample of the target. Checked
  with the randomised probability integral transform: under the target's exact conditional distribution p (from
  transformers, filtered as SGLang's sampler filters) ``u = P(rank < r) + V * p(token)``, V ~ U[0, 1), is uniform,
  and successive tokens of a request give independent u's. A chi-square test on 10 bins; the same test rejects
  the outputs greedy verification would have produced.

Drafters: the trained ones in ``sglang_kimi/assets`` when present, else checkpoints of the right formats
(``drafters.py``): a "logit lens" EAGLE3 drafter (it agrees with the target often, so steps accept several tokens)
and a random DFLASH drafter.
"""

from __future__ import annotations

import math
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import torch

from sglang_kimi.server import ASSETS_DIR, free_port, group_alive, plugin_state, start_server

from drafters import write_dflash, write_eagle3

pytestmark = pytest.mark.e2e

START_TIMEOUT = 900.0
MAX_NEW_TOKENS = 64
PROMPTS = [
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:",
    "Question: Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. "
    "How much did she earn?\nAnswer:",
    "Question: Betty is saving money for a new wallet which costs $100. Betty has only half of the money she needs. "
    "Her parents decided to give her $15 for that purpose, and her grandparents twice as much as her parents. "
    "How much more money does Betty need to buy the wallet?\nAnswer:",
]
TRAINED_EAGLE3 = ASSETS_DIR / "tiny-kimi-k2.6-eagle3"
TRAINED_DFLASH = ASSETS_DIR / "tiny-kimi-k2.6-dflash"
KIMI_CPU = ["--attention-backend", "kimi_cpu"]
EAGLE_CHAIN = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
EAGLE_TREE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2", "--speculative-num-draft-tokens", "6"]


@pytest.fixture(scope="module")
def drafter_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec_drafters")
    eagle3 = TRAINED_EAGLE3 if (TRAINED_EAGLE3 / "config.json").exists() else write_eagle3(root / "eagle3", kind="lens")
    dflash = TRAINED_DFLASH if (TRAINED_DFLASH / "config.json").exists() else write_dflash(root / "dflash")
    return {"eagle3": eagle3, "dflash": dflash}


def _spec_server(tmp_path_factory, name: str, args: list[str]):
    log = tmp_path_factory.mktemp(name) / "server.log"
    server = start_server(KIMI_CPU + args, port=free_port(), log_path=log, timeout=START_TIMEOUT)
    return server


@pytest.fixture(scope="module")
def eagle3_chain_server(tmp_path_factory, drafter_paths):
    server = _spec_server(tmp_path_factory, "eagle3_chain", [
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(drafter_paths["eagle3"]),
        *EAGLE_CHAIN])
    yield server
    server.stop()
    assert not group_alive(server.pgid)


@pytest.fixture(scope="module")
def eagle3_tree_server(tmp_path_factory, drafter_paths):
    server = _spec_server(tmp_path_factory, "eagle3_tree", [
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(drafter_paths["eagle3"]),
        *EAGLE_TREE])
    yield server
    server.stop()
    assert not group_alive(server.pgid)


@pytest.fixture(scope="module")
def dflash_server(tmp_path_factory, drafter_paths):
    server = _spec_server(tmp_path_factory, "dflash", [
        "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(drafter_paths["dflash"])])
    yield server
    server.stop()
    assert not group_alive(server.pgid)


def generate(url: str, prompt, max_new_tokens: int = MAX_NEW_TOKENS, logprobs: bool = False, **sampling) -> dict:
    key = "input_ids" if isinstance(prompt, list) else "text"
    body = {key: prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, **sampling}}
    if logprobs:
        body["return_logprob"] = True
    response = requests.post(url + "/generate", json=body, timeout=1800)
    response.raise_for_status()
    return response.json()


@pytest.fixture(scope="module")
def reference_outputs(tiny_server):
    """The non-speculative server's greedy tokens for every prompt."""
    return [generate(tiny_server.base_url, p)["output_ids"] for p in PROMPTS]


@pytest.fixture(scope="module")
def hf():
    from sglang_kimi.models.tiny import load_hf_reference

    model, tokenizer = load_hf_reference()
    return model, tokenizer


def hf_logprobs(hf, prompts: list[str], outputs: list[list[int]]) -> list[torch.Tensor]:
    """transformers' log-probability of every output token, given the prompt and the tokens before it."""
    model, tokenizer = hf
    result = []
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs):
            ids = tokenizer(prompt)["input_ids"]
            tokens = torch.tensor([ids + out])
            logp = torch.log_softmax(model(tokens).logits.float(), dim=-1)[0]  # [T, V]
            result.append(logp[len(ids) - 1 : -1].gather(1, torch.tensor(out)[:, None])[:, 0])
    return result


def check_greedy_parity(server, reference_outputs, hf) -> dict:
    """Sequential and concurrent greedy outputs equal the reference; the reported log-probabilities (from the
    verify forwards) equal transformers'. Returns the server's decoding statistics."""
    url = server.base_url
    started = time.monotonic()
    sequential = [generate(url, p, logprobs=True) for p in PROMPTS]
    elapsed = time.monotonic() - started
    for i, (out, ref) in enumerate(zip(sequential, reference_outputs)):
        assert out["output_ids"] == ref, f"prompt {i}: speculative greedy output differs from the non-speculative one"
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        concurrent = list(pool.map(lambda p: generate(url, p)["output_ids"], PROMPTS))
    assert concurrent == reference_outputs
    expected = hf_logprobs(hf, PROMPTS, reference_outputs)
    for out, exp in zip(sequential, expected):
        got = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
        assert got.shape == exp.shape
        error = (got - exp).abs().max().item()
        # float32 SGLang and transformers agree to ~1e-6; one wrong mask cell moves these by ~1e-3
        assert error < 1e-4, f"verify log-probabilities differ from transformers' by {error}"
    tokens = sum(o["meta_info"]["completion_tokens"] for o in sequential)
    steps = sum(o["meta_info"]["spec_verify_ct"] for o in sequential)
    return {"tokens": tokens, "verify_steps": steps, "accept_length": tokens / steps, "tokens_per_s": tokens / elapsed}


def test_plugin_entries_for_cpu_speculative_decoding_are_loaded(eagle3_chain_server):
    state = plugin_state(eagle3_chain_server.base_url)
    for name in ("cpu-attention-backend", "cpu-eagle-draft-backends", "cpu-tree-mask-mode", "cpu-dflash-allowed",
                 "cpu-dflash-record-stream", "input-embeds-model-dtype", "lossless-eagle-sampling",
                 "lossless-dflash-sampling", "lossless-dflash-sampling-available"):
        assert state["registrations"][name] == "ok", (name, state["registrations"][name])


def test_eagle3_chain_greedy_equals_non_speculative(eagle3_chain_server, reference_outputs, hf):
    stats = check_greedy_parity(eagle3_chain_server, reference_outputs, hf)
    print("EAGLE3 chain", stats)
    assert stats["accept_length"] > 1.0, "no verify step accepted a drafted token: multi-token accept not exercised"


def test_eagle3_tree_greedy_equals_non_speculative(eagle3_tree_server, reference_outputs, hf):
    stats = check_greedy_parity(eagle3_tree_server, reference_outputs, hf)
    print("EAGLE3 tree", stats)
    assert stats["accept_length"] > 1.0, "no verify step accepted a drafted token: multi-token accept not exercised"


def test_dflash_chain_greedy_equals_non_speculative(dflash_server, reference_outputs, hf):
    stats = check_greedy_parity(dflash_server, reference_outputs, hf)
    print("DFLASH chain", stats)


# -- sampled decoding ---------------------------------------------------------------------------------------------

TOP_P = 0.9
SAMPLED_REQUESTS = 80
SAMPLED_TOKENS = 4
PIT_BINS = 10


def sampler_distribution(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """What SGLang's pytorch sampler draws from at temperature 1 with top-p (its joint top-k/top-p filter)."""
    probs = torch.softmax(logits.double(), dim=-1)
    sorted_probs, idx = probs.sort(dim=-1, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[before > top_p] = 0.0
    filtered = torch.zeros_like(probs).scatter_(-1, idx, sorted_probs)
    return filtered / filtered.sum(dim=-1, keepdim=True)


def pit_values(dists: torch.Tensor, tokens: torch.Tensor, rng: random.Random):
    """Randomised PIT of each token under its distribution, ordering the vocabulary by descending probability:
    ``u = P(ranked above) + V * p(token)``. Returns (u values, tokens outside the distribution's support)."""
    values, outside = [], 0
    for dist, token in zip(dists, tokens.tolist()):
        p = float(dist[token])
        if p == 0.0:
            outside += 1
            continue
        above = float(dist[dist > p].sum())
        ranked_before = int((torch.nonzero(dist == p)[:, 0] < token).sum())  # ties broken by token id
        values.append(above + (ranked_before + rng.random()) * p)
    return values, outside


def chi_square_uniform_pvalue(values: list[float], bins: int = PIT_BINS) -> float:
    counts = [0] * bins
    for u in values:
        counts[min(int(u * bins), bins - 1)] += 1
    expected = len(values) / bins
    stat = sum((c - expected) ** 2 / expected for c in counts)
    return chi2_sf(stat, bins - 1)


def chi2_sf(x: float, k: int) -> float:
    """Survival function of the chi-square distribution with k degrees of freedom (regularised upper gamma)."""
    a, z = k / 2.0, x / 2.0
    if z <= 0:
        return 1.0
    if z < a + 1:  # series for the lower gamma
        term = total = 1.0 / a
        n = a
        for _ in range(1000):
            n += 1
            term *= z / n
            total += term
        return max(0.0, 1.0 - total * math.exp(-z + a * math.log(z) - math.lgamma(a)))
    # continued fraction for the upper gamma
    b, c, d = z + 1 - a, 1e300, 1.0 / (z + 1 - a)
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = 1.0 / (an * d + b)
        c = b + an / c
        h *= d * c
    return h * math.exp(-z + a * math.log(z) - math.lgamma(a))


def test_eagle3_tree_sampling_follows_the_target_distribution(eagle3_tree_server, hf):
    model, tokenizer = hf
    prompt = PROMPTS[0]
    ids = tokenizer(prompt)["input_ids"]
    url = eagle3_tree_server.base_url

    def one(_):
        out = generate(url, prompt, SAMPLED_TOKENS, temperature=1.0, top_p=TOP_P)
        return out["output_ids"], out["meta_info"]["spec_verify_ct"]

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(SAMPLED_REQUESTS)))
    outputs = [o for o, _ in results if len(o) == SAMPLED_TOKENS]
    assert len(outputs) >= SAMPLED_REQUESTS * 0.9, "too many requests ended early (EOS) for the test"
    assert sum(steps for _, steps in results) > 0

    with torch.no_grad():
        tokens = torch.tensor([ids + o for o in outputs])  # [R, P + K]
        logits = model(tokens).logits.float()[:, len(ids) - 1 : -1]  # [R, K, V]: the conditional of each output
    dists = sampler_distribution(logits, TOP_P).reshape(-1, logits.shape[-1])
    emitted = torch.tensor(outputs).reshape(-1)
    rng = random.Random(1234)

    values, outside = pit_values(dists, emitted, rng)
    # SGLang's and transformers' float32 logits differ by ~1e-6: a token at the top-p boundary may be in one's
    # support and not the other's. That can happen, rarely; anything more is a real difference.
    assert outside <= max(1, len(emitted) // 100), f"{outside} sampled tokens are outside the target's support"
    pvalue = chi_square_uniform_pvalue(values)
    print(f"sampled EAGLE3 tree: {len(values)} tokens, PIT chi-square p-value {pvalue:.3g}")
    assert pvalue > 1e-3, f"sampled tokens do not follow the target distribution (p = {pvalue:.3g})"

    # The same test rejects what greedy verification emits (the argmax of each conditional).
    greedy_values, _ = pit_values(dists, dists.argmax(dim=-1), random.Random(1234))
    assert chi_square_uniform_pvalue(greedy_values) < 1e-6
