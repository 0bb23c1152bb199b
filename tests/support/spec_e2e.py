"""Shared by the speculative e2e tests: GSM8K prompts, HTTP calls, transformers' log-probabilities, the reference
loop's tau, and the statistics of the sampling tests.

Prompts are lm-eval's zero-shot GSM8K format ``"Question: {q}\\nAnswer:"`` over the first test questions of
``data/gsm8k`` (the data the GSM8K gate runs on).
"""

from __future__ import annotations

import functools
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor

import requests
import torch

from sglang_kimi.assets import TINY_DFLASH, TINY_EAGLE3
from support.data import GSM8K_DIR
from support.paths import scripts_importable
from support.servers import server_config
from support.stats import uniform_pvalue

KIMI_CPU = ["--attention-backend", "kimi_cpu"]
MAX_NEW_TOKENS = 64
# The tree configurations served by several modules, on one server each for the whole session (shared_tree_server)
DFLASH_TREE = [
    "--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(TINY_DFLASH),
    "--speculative-dflash-tree-budget", "32",
    "--enable-custom-logit-processor",  # test_reliability's matrix and test_cpu_spec_decoding send processors
]  # fmt: skip
EAGLE3_TREE = [
    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(TINY_EAGLE3),
    "--speculative-num-steps", "3", "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
    "--enable-custom-logit-processor",
]  # fmt: skip
SHARED_TREES = {"dflash-tree-32": DFLASH_TREE, "eagle3-tree": EAGLE3_TREE}
# The servers several modules share (support.servers.ServerPool): the non-speculative reference and the two trees
TINY = server_config("tiny", ["--disable-overlap-schedule", "--enable-custom-logit-processor"])
TREE_SERVERS = {
    name: server_config(name, KIMI_CPU + ["--enable-metrics"] + args) for name, args in SHARED_TREES.items()
}

scripts_importable()  # _drafter_common: the tau benchmark's cached target


@functools.cache
def gsm8k_prompts(limit: int) -> tuple[str, ...]:
    path = GSM8K_DIR / "test.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the e2e tests read GSM8K from data/gsm8k in the repository")
    with open(path) as f:
        questions = [json.loads(line)["question"] for line in f if line.strip()][:limit]
    return tuple(f"Question: {q}\nAnswer:" for q in questions)


def shared_tree_server(server_pool, request, name: str):
    """The session's server for ``SHARED_TREES[name]`` (with ``--enable-metrics``; the module lists
    ``TREE_SERVERS[name]``); its counters include the requests of every module that used it before."""
    return server_pool.get(TREE_SERVERS[name], request)


def generate(
    url: str,
    prompt,
    max_new_tokens: int = MAX_NEW_TOKENS,
    logprobs: bool = False,
    processor: str | None = None,
    **sampling,
) -> dict:
    """One greedy request (unless ``sampling`` says otherwise); ``processor``: a serialized custom logit processor
    (``support.processors``), its ``custom_params`` among ``sampling``."""
    key = "input_ids" if isinstance(prompt, list) else "text"
    body = {
        key: prompt,
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0,
            **sampling,
        },
    }
    if logprobs:
        body["return_logprob"] = True
    if processor is not None:
        body["custom_logit_processor"] = processor
    response = requests.post(url + "/generate", json=body, timeout=1800)
    response.raise_for_status()
    return response.json()


def generate_all(url: str, prompts, concurrency: int, **kwargs) -> list[dict]:
    """Every prompt through ``/generate``, ``concurrency`` requests in flight (1: one after another)."""
    if concurrency == 1:
        return [generate(url, p, **kwargs) for p in prompts]
    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda p: generate(url, p, **kwargs), prompts))


def greedy_reference(url: str, prompts) -> tuple[list[list[int]], list[torch.Tensor]]:
    """The greedy tokens a (non-speculative) server gives every prompt, all in flight at once (its greedy tokens do
    not depend on the batch: ``test_server.py``), and transformers' log-probabilities of them."""
    outputs = [o["output_ids"] for o in generate_all(url, prompts, len(prompts))]
    return outputs, hf_logprobs(prompts, outputs)


def spec_metrics(url: str) -> dict:
    """The plugin's per-position acceptance counters from ``/server_info``."""
    info = requests.get(url + "/server_info", timeout=60).json()
    return info["internal_states"][0]["sglang_kimi"]["spec_metrics"] or {"steps": 0}  # None before the first step


# -- transformers' reference ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def hf_model():
    from support.hf_reference import load_hf_reference

    return load_hf_reference()


def hf_logprobs(prompts, outputs: list[list[int]]) -> list[torch.Tensor]:
    """transformers' log-probability of every output token, given the prompt and the tokens before it."""
    model, tokenizer = hf_model()
    result = []
    with torch.no_grad():
        for prompt, out in zip(prompts, outputs):
            ids = tokenizer(prompt)["input_ids"]
            tokens = torch.tensor([ids + out])
            logp = torch.log_softmax(model(tokens).logits.float(), dim=-1)[0]  # [T, V]
            result.append(logp[len(ids) - 1 : -1].gather(1, torch.tensor(out)[:, None])[:, 0])
    return result


def check_greedy_parity(url: str, prompts, reference: list[list[int]], expected_logprobs, concurrency: int) -> dict:
    """The server's greedy outputs equal ``reference`` token for token, and the log-probabilities it reports for
    them (computed from its verify forwards) equal transformers'. Returns throughput figures."""
    started = time.monotonic()
    outputs = generate_all(url, prompts, concurrency, logprobs=True)
    elapsed = time.monotonic() - started
    for i, (out, ref) in enumerate(zip(outputs, reference)):
        got = out["output_ids"]
        if got != ref:
            first = next(
                (j for j, (a, b) in enumerate(zip(got, ref)) if a != b),
                min(len(got), len(ref)),
            )
            raise AssertionError(
                f"prompt {i} at concurrency {concurrency}: speculative greedy output differs from the "
                f"non-speculative one at token {first}: {got[first : first + 5]} vs {ref[first : first + 5]}"
            )
    for i, (out, exp) in enumerate(zip(outputs, expected_logprobs)):
        got = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
        assert got.shape == exp.shape
        error = (got - exp).abs().max().item()
        # float32 SGLang and transformers agree to ~1e-6; one wrong mask cell moves these by ~1e-3
        assert error < 1e-4, f"prompt {i}: verify log-probabilities differ from transformers' by {error}"
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    steps = sum(o["meta_info"]["spec_verify_ct"] for o in outputs)
    return {"tokens": tokens, "verify_steps": steps, "tokens_per_step": tokens / max(steps, 1),
            "tokens_per_s": tokens / elapsed}  # fmt: skip


# -- the reference loop's tau -----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _reference_models():
    from sglang_kimi.models import tiny
    from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3
    from sglang_kimi.speculators.reference.dflash import DFlashDrafter
    from sglang_kimi.speculators.reference.eagle3 import Eagle3Drafter

    target = CompactDeepseekV3.from_pretrained(tiny.TINY_MODEL, dtype=torch.float32)
    dflash = DFlashDrafter.from_pretrained(TINY_DFLASH, dtype=torch.float32)
    dflash.attach_target(target.embed_tokens.weight, target.lm_head.weight)
    eagle = Eagle3Drafter.from_pretrained(TINY_EAGLE3, dtype=torch.float32)
    eagle.attach_target(target.embed_tokens.weight)
    return target, dflash, eagle


def reference_proposer(method: dict):
    """(a fresh proposer, capture layers) of the reference loop for one server configuration: ``method`` is
    ``{"dflash_tree_budget": B or None}`` or ``{"eagle": (steps, topk, draft tokens)}``."""
    from sglang_kimi.models import tiny
    from sglang_kimi.speculators.reference.loop import ChainProposer, DDTreeProposer, EagleProposer

    _, dflash, eagle = _reference_models()
    if "eagle" in method:
        steps, topk, tokens = method["eagle"]
        layers = eagle.config.resolve_target_layer_ids(tiny.TEXT_CONFIG["num_hidden_layers"])
        return EagleProposer(
            drafter=eagle.step_drafter(),
            num_steps=steps,
            topk=topk,
            num_draft_tokens=tokens,
        ), layers
    block = dflash.config.block_size
    layers = dflash.config.resolve_target_layer_ids()
    budget = method["dflash_tree_budget"]
    if budget is None:
        return ChainProposer(drafter=dflash.block_drafter(), num_draft_tokens=block - 1), layers
    positions = min(block, budget + 1) - 1
    return DDTreeProposer(drafter=dflash.block_drafter(), num_positions=positions, budget=budget), layers


def reference_tau(method: dict, prompts, max_new_tokens: int = MAX_NEW_TOKENS) -> float:
    """tau (tokens per target forward) of the reference decode loop over the prompts, greedy."""
    import _drafter_common as common

    from sglang_kimi.speculators.reference.loop import generate as reference_generate

    target, _, _ = _reference_models()
    _, tokenizer = hf_model()
    tokens = steps = 0
    with torch.no_grad():
        for prompt in prompts:
            proposer, layers = reference_proposer(method)
            out = reference_generate(common.CachedTarget(target, layers), tokenizer(prompt)["input_ids"],
                                     max_new_tokens, proposer=proposer)  # fmt: skip
            tokens += sum((k + 1) * n for k, n in enumerate(out.accept_histogram))
            steps += sum(out.accept_histogram)
    return tokens / steps


# -- sampling statistics ----------------------------------------------------------------------------------------

PIT_BINS = 10


def sampler_distribution(
    logits: torch.Tensor, top_p: float = 1.0, temperature: float = 1.0, top_k: int = -1, min_p: float = 0.0
) -> torch.Tensor:
    """What SGLang's pytorch sampler draws from: softmax(logits / temperature), its joint top-k / top-p filter over
    the sorted probabilities, then min-p (tokens below ``min_p`` times the most likely one dropped)."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    sorted_probs, idx = probs.sort(dim=-1, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    if top_k > 0:
        sorted_probs[..., top_k:] = 0.0
    sorted_probs[before > top_p] = 0.0
    sorted_probs[sorted_probs < sorted_probs[..., :1] * min_p] = 0.0
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


# Sampled requests of a few tokens each, in flight at once: a batch of 32 serves them about 20% faster than one of 8
# on this CPU (the same prompt, so each prefill is mostly a radix-cache hit).
SAMPLED_CONCURRENCY = 32


def _sampled_with_conditionals(url: str, prompt: str, requests_: int, tokens: int, top_p: float, **sampling):
    """``requests_`` sampled continuations of ``tokens`` tokens (temperature 1, top-p, ``sampling``) and
    transformers' logits of the conditional of each emitted token: (outputs [R][K], logits [R, K, V])."""

    def one(_):
        return generate(url, prompt, tokens, temperature=1.0, top_p=top_p, **sampling)["output_ids"]

    with ThreadPoolExecutor(SAMPLED_CONCURRENCY) as pool:
        results = list(pool.map(one, range(requests_)))
    outputs = [o for o in results if len(o) == tokens]
    assert len(outputs) >= requests_ * 0.9, "too many requests ended early (EOS) for the test"
    return outputs, conditionals(prompt, outputs)


def conditionals(prompt: str, outputs: list[list[int]]) -> torch.Tensor:
    """transformers' logits [R, K, V] of the conditional of each of the ``outputs`` [R][K] after ``prompt``."""
    model, tokenizer = hf_model()
    ids = tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        batch = torch.tensor([ids + o for o in outputs])  # [R, P + K]
        return model(batch).logits.float()[:, len(ids) - 1 : -1]


def pit_pvalue(logits: torch.Tensor, emitted: torch.Tensor, **sampling) -> tuple[float, int]:
    dists = sampler_distribution(logits, **sampling).reshape(-1, logits.shape[-1])
    values, outside = pit_values(dists, emitted.reshape(-1), random.Random(1234))
    return uniform_pvalue(values, PIT_BINS), outside


def sampled_pit_pvalue(url: str, prompt: str, requests_: int, tokens: int, top_p: float) -> tuple[float, float, int]:
    """Sample ``requests_`` continuations of ``tokens`` tokens (temperature 1, top-p) and test every emitted token
    against the target's exact conditional (transformers). Returns (p-value of the outputs, p-value of the
    argmax tokens at the same positions, tokens outside the support)."""
    outputs, logits = _sampled_with_conditionals(url, prompt, requests_, tokens, top_p)
    pvalue, outside = pit_pvalue(logits, torch.tensor(outputs), top_p=top_p)
    greedy_pvalue, _ = pit_pvalue(logits, sampler_distribution(logits, top_p).argmax(dim=-1), top_p=top_p)
    return pvalue, greedy_pvalue, outside


def penalised_logits(logits: torch.Tensor, previous: list[int], frequency: float, presence: float, repetition: float):
    """One conditional's logits [V] after the penalties of the outputs before it, one output token at a time:
    ``frequency * count + presence`` subtracted from every token output so far, then its logit divided by
    ``repetition`` (multiplied when negative)."""
    row = logits.double().clone()
    for token in set(previous):
        row[token] -= frequency * previous.count(token) + presence
        row[token] = row[token] * repetition if row[token] < 0 else row[token] / repetition
    return row


def penalised_pit_pvalues(
    url: str, prompt: str, requests_: int, tokens: int, top_p: float, penalties: dict[str, float]
) -> tuple[float, float, int, int]:
    """Sampled continuations with frequency / presence / repetition ``penalties``, tested against the target's
    conditional with the penalties of each output's own prefix. Returns (p-value, p-value against the unpenalised
    conditional (what a verify that skips penalties samples from), tokens outside the support, outputs repeating an
    earlier output of their request)."""
    outputs, logits = _sampled_with_conditionals(url, prompt, requests_, tokens, top_p, **penalties)
    args = (penalties["frequency_penalty"], penalties["presence_penalty"], penalties["repetition_penalty"])
    exact = torch.stack(
        [torch.stack([penalised_logits(logits[r, k], out[:k], *args) for k in range(tokens)]) for r, out in
         enumerate(outputs)]
    )  # fmt: skip
    pvalue, outside = pit_pvalue(exact, torch.tensor(outputs), top_p=top_p)
    unpenalised_pvalue, _ = pit_pvalue(logits, torch.tensor(outputs), top_p=top_p)
    repeats = sum(1 for out in outputs for k in range(tokens) if out[k] in out[:k])
    return pvalue, unpenalised_pvalue, outside, repeats


def mixed_sampling_pvalues(url: str, prompt: str, groups: list[dict], requests_: int, tokens: int):
    """``requests_`` sampled continuations of ``tokens`` tokens per group of sampling parameters (temperature,
    top_k, top_p, min_p), the groups' requests interleaved so that they share batches, each group's tokens tested
    against its own filtered conditional. Returns, per group, (p-value, tokens outside the support, p-value of the
    same tokens under plain temperature-1 sampling)."""

    def one(i):
        return generate(url, prompt, tokens, **groups[i % len(groups)])["output_ids"]

    with ThreadPoolExecutor(SAMPLED_CONCURRENCY) as pool:
        results = list(pool.map(one, range(requests_ * len(groups))))
    report = []
    for g, params in enumerate(groups):
        outputs = [o for o in results[g :: len(groups)] if len(o) == tokens]
        assert len(outputs) >= requests_ * 0.9, "too many requests ended early (EOS) for the test"
        logits = conditionals(prompt, outputs)
        emitted = torch.tensor(outputs)
        pvalue, outside = pit_pvalue(logits, emitted, **params)
        plain, _ = pit_pvalue(logits, emitted)
        report.append((pvalue, outside, plain))
    return report
