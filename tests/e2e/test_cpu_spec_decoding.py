"""SGLang's speculative decoding for the tiny Kimi target, served for real on CPU through the plugin, on the
``kimi_cpu`` attention backend with the embedded trained drafters: DFLASH chain, a DFLASH draft tree (DDTree budget
32; budget 16 is served in the reliability, fault and tensor-parallel tests), EAGLE3 chain and EAGLE3 tree.

- Greedy: for 8 GSM8K prompts x 64 new tokens every configuration's tokens equal the non-speculative server's,
  token for token, at concurrency 1 and 8, and the log-probabilities it reports for them (computed from its verify
  forwards: chain and tree masks) equal transformers'.
- tau read from ``/server_info`` is above a floor from the reference decode loop (``speculators.reference``) for
  the same drafter and configuration; a tree's tau is at least its chain's; the plugin's counters count exactly
  the verify steps SGLang reports per request, and Prometheus (``--enable-metrics``) carries the same counters.
- Penalties (repetition, frequency and presence, min_new_tokens, mixed with a logit bias): every configuration's
  greedy tokens equal those of SGLang's synchronous non-speculative scheduler (the session's reference server),
  requests with different penalties sharing batches.
- Custom logit processors that read the request's output so far (only one token from the 10th on; never the
  previous token): every configuration's greedy tokens equal the non-speculative server's, requests with and
  without processors sharing batches. Without the plugin's per-node processing the DFLASH chain and tree differ on
  15 and 16 of 16 requests, EAGLE3 (which applied no processor) on 9. Sampled, the same processors: the forced
  tokens are the only ones drawn, and no token follows itself.
- Stops met inside a step (stop strings, kept or trimmed, stop tokens and regexes, after min_new_tokens): the text,
  tokens and finish reason equal the non-speculative server's.
- Prefix cache: prompts served from the radix cache, whole or a shared few-shot prefix, give the non-speculative
  greedy tokens, and a prompt served again drafts as well as the first time (tau within 10%; with the drafter's
  KV of cached tokens zeroed, the DFLASH chain's tau fell from 4.00 to 3.05).
- Grammar constraints (regex, JSON schema, EBNF; alone, with penalties, with a processor): every configuration's
  greedy tokens equal the non-speculative server's, constrained and unconstrained requests sharing batches. Sampled
  under a digits-only regex, every token is an exact sample of the target restricted to the all-digit tokens. With
  the DFLASH tree's grammar masks built as if the tree were a chain, both fail (HTTP 500).
- Concurrency beyond 8 (200 mixed requests, streams dropped) is ``test_reliability.py``'s, on the same trees.
- Sampled (temperature 1, top-p 0.9), EAGLE3 tree and DFLASH tree: every emitted token is an exact sample of the
  target. Checked with the randomised probability integral transform: under the target's exact conditional p (from
  transformers, filtered as SGLang's sampler filters) ``u = P(rank < r) + V * p(token)``, V ~ U[0, 1), is uniform,
  and successive tokens of a request give independent u's; a chi-square test on 10 bins. The same test rejects a
  server whose verification is made greedy (``SGLANG_KIMI_DEBUG_GREEDY_VERIFY=1``).
- Sampled in mixed batches, every configuration: requests at temperature 0.5 with top-k 4, at 1.3 with top-p 0.9 and
  min-p 0.1, and at plain temperature 1 share batches; each group's tokens pass the same test against its own
  filtered conditional, and the first two fail it against the plain temperature-1 conditional.
- Sampled with penalties that favour repeating, DFLASH chain and tree, EAGLE3 tree: the same test against the
  conditional under the penalties of each output's own prefix passes, and against the unpenalised conditional
  fails. With the plugin's per-node penalties switched off (SGLang's own handling), it fails on the DFLASH tree
  (PIT p ~ 1e-11) and on the EAGLE3 tree (46 of 640 tokens outside the top-p support).
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from support.processes import busy_while_idle
from support.processors import serialized
from support.servers import server_config
from support.spec_e2e import (
    DFLASH_TREE,
    EAGLE3_TREE,
    KIMI_CPU,
    SAMPLED_CONCURRENCY,
    SHARED_TREES,
    TINY,
    TREE_SERVERS,
    check_greedy_parity,
    conditionals,
    generate,
    generate_all,
    greedy_reference,
    gsm8k_prompts,
    hf_model,
    mixed_sampling_pvalues,
    penalised_pit_pvalues,
    pit_pvalue,
    reference_tau,
    sampled_pit_pvalue,
    shared_tree_server,
    spec_metrics,
)

from sglang_kimi.assets import TINY_DFLASH, TINY_EAGLE3
from sglang_kimi.launcher.server import (
    fetch_plugin_state,
)

pytestmark = pytest.mark.e2e

NUM_PROMPTS = 8
# tau of a server may sit a little below the reference loop's: float32 drafts on another code path can rank two
# near-tied candidates the other way. Anything lower means drafts or acceptance are lost.
TAU_FLOOR = 0.9

DFLASH = [
    "--speculative-algorithm",
    "DFLASH",
    "--speculative-draft-model-path",
    str(TINY_DFLASH),
    "--enable-custom-logit-processor",
]
EAGLE3 = [
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    str(TINY_EAGLE3),
    "--enable-custom-logit-processor",
]


def eagle_args(steps: int, topk: int, tokens: int) -> list[str]:
    return ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(tokens)]  # fmt: skip


# name -> (server arguments, the reference loop's method, the chain configuration a tree must beat)
CONFIGS = {
    "dflash-chain": (DFLASH, {"dflash_tree_budget": None}, None),
    "dflash-tree-32": (DFLASH_TREE, {"dflash_tree_budget": 32}, "dflash-chain"),
    "eagle3-chain": (EAGLE3 + eagle_args(3, 1, 4), {"eagle": (3, 1, 4)}, None),
    "eagle3-tree": (EAGLE3_TREE, {"eagle": (3, 4, 8)}, "eagle3-chain"),
}  # fmt: skip


OWN_SERVERS = {
    name: server_config(name, KIMI_CPU + ["--enable-metrics"] + args)
    for name, (args, _, _) in CONFIGS.items()
    if name not in SHARED_TREES
}
GREEDY_VERIFY = server_config(
    "greedy_verify", KIMI_CPU + ["--enable-metrics"] + DFLASH_TREE, env={"SGLANG_KIMI_DEBUG_GREEDY_VERIFY": "1"}
)
SERVERS = [TINY, *(OWN_SERVERS.get(name) or TREE_SERVERS[name] for name in CONFIGS), GREEDY_VERIFY]


@pytest.fixture(scope="module")
def spec_server(request, server_pool):
    """One speculative server per configuration (the parameter): the session's for a tree, otherwise stopped
    before the next one starts."""
    if request.param in SHARED_TREES:
        server = shared_tree_server(server_pool, request, request.param)
        server.config = request.param
        yield server
        return
    server = server_pool.get(OWN_SERVERS[request.param], request)
    server.config = request.param
    yield server
    server_pool.stop(OWN_SERVERS[request.param])


def in_flight(run, names, prompts) -> dict[str, list]:
    """``{name: [run(name, prompt) for prompt in prompts]}``, the requests all in flight at once: the reference
    server's greedy tokens do not depend on its batch (``test_server.py``), and a batch is served faster."""
    jobs = [(name, prompt) for name in names for prompt in prompts]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = iter(pool.map(lambda job: run(*job), jobs))
    return {name: [next(results) for _ in prompts] for name in names}


@pytest.fixture(scope="module")
def prompts():
    return gsm8k_prompts(NUM_PROMPTS)


@pytest.fixture(scope="module")
def reference(tiny_server, prompts):
    return greedy_reference(tiny_server.base_url, prompts)


_reference_taus: dict[str, float] = {}


def ref_tau(config: str, prompts) -> float:
    if config not in _reference_taus:
        _reference_taus[config] = reference_tau(CONFIGS[config][1], prompts)
    return _reference_taus[config]


@pytest.mark.parametrize("spec_server", list(CONFIGS), indirect=True)
def test_greedy_output_equals_non_speculative_and_tau_meets_the_reference(spec_server, prompts, reference):
    url = spec_server.base_url
    outputs, logprobs = reference
    steps_before = spec_metrics(url)["steps"]
    stats = {c: check_greedy_parity(url, prompts, outputs, logprobs, c) for c in (1, 8)}
    print(spec_server.config, stats)

    metrics = spec_metrics(url)
    info_steps = sum(s["verify_steps"] for s in stats.values())
    assert metrics["steps"] - steps_before == info_steps, "the counters miss verify steps SGLang reports per request"

    tau = metrics["tau"]
    expected = ref_tau(spec_server.config, prompts)
    print(f"{spec_server.config}: server tau {tau:.3f}, reference loop tau {expected:.3f}")
    assert tau >= TAU_FLOOR * expected, f"tau {tau:.3f} below {TAU_FLOOR} x the reference loop's {expected:.3f}"
    chain = CONFIGS[spec_server.config][2]
    if chain is not None:
        chain_tau = ref_tau(chain, prompts)
        assert expected >= chain_tau, f"reference: the tree's tau {expected:.3f} < its chain's {chain_tau:.3f}"
        assert tau >= TAU_FLOOR * chain_tau, f"tree tau {tau:.3f} below its chain's ({chain_tau:.3f})"


# -- penalties ----------------------------------------------------------------------------------------------------

PENALISED_PROMPTS = 4
PENALTIES = {
    "repetition": {"repetition_penalty": 1.3},
    "frequency and presence": {"frequency_penalty": 1.0, "presence_penalty": 0.5},
    "min_new_tokens": {"min_new_tokens": 12, "stop_token_ids": [220, 13]},  # stop tokens the model emits early
    # additive and scaling together: SGLang's synchronous sampler applied them in a per-process order; the plugin
    # pins additive first, scaling last in every process (docs/verification.md)
    "frequency and repetition": {"frequency_penalty": 0.5, "repetition_penalty": 1.3},
    "repetition with logit bias and min_new_tokens": {
        "repetition_penalty": 1.2,
        "logit_bias": {"15": 2.0},
        "min_new_tokens": 6,
        "stop_token_ids": [13],
    },
}


@pytest.fixture(scope="module")
def penalised_reference(tiny_server, prompts):
    """Non-speculative greedy outputs under each penalty (the session's synchronous reference server)."""
    return {
        name: [o["output_ids"] for o in generate_all(tiny_server.base_url, prompts[:PENALISED_PROMPTS], 4, **opts)]
        for name, opts in PENALTIES.items()
    }


@pytest.mark.parametrize("spec_server", list(CONFIGS), indirect=True)
def test_penalised_greedy_output_equals_non_speculative(spec_server, prompts, penalised_reference):
    """Each draft node is scored with the penalties of its own output sequence: the greedy tokens equal the
    non-speculative ones, requests with different penalties (and none) sharing batches."""
    jobs = [(name, i) for name in PENALTIES for i in range(PENALISED_PROMPTS)] + [("none", i) for i in range(4)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outputs = list(
            pool.map(lambda job: generate(spec_server.base_url, prompts[job[1]], **PENALTIES.get(job[0], {})), jobs)
        )
    for (name, i), out in zip(jobs, outputs):
        if name != "none":
            assert out["output_ids"] == penalised_reference[name][i], f"{spec_server.config}, {name}, prompt {i}"


# -- custom logit processors --------------------------------------------------------------------------------------

# name -> (processor, its custom_params): rules that read the request's output so far, as a thinking budget does
PROCESSED = {
    "only token 13 from the 10th on": ("ForceAfter", {"after": 10, "token": 13}),
    "never the previous token": ("NoRepeat", {}),
}


def generate_processed(url: str, prompt, name: str) -> dict:
    processor, params = PROCESSED[name]
    return generate(url, prompt, processor=serialized(processor), custom_params=params)


@pytest.fixture(scope="module")
def processed_reference(tiny_server, prompts):
    """Non-speculative greedy outputs under each processor."""
    return in_flight(
        lambda name, p: generate_processed(tiny_server.base_url, p, name)["output_ids"], PROCESSED, prompts[:4]
    )


@pytest.mark.parametrize("spec_server", list(CONFIGS), indirect=True)
def test_custom_logit_processors_see_each_draft_position_s_own_output(spec_server, prompts, processed_reference):
    """A processor that reads ``req.output_ids`` judges every draft position with the outputs before it: the
    greedy tokens equal the non-speculative ones (SGLang's DFLASH verify showed every position the committed
    outputs only, and EAGLE's applied no processor), requests with and without processors sharing batches."""
    jobs = [(name, i) for name in PROCESSED for i in range(4)] + [(None, i) for i in range(4)]
    url = spec_server.base_url

    def run(job):
        name, i = job
        return generate_processed(url, prompts[i], name) if name else generate(url, prompts[i])

    with ThreadPoolExecutor(len(jobs)) as pool:
        outputs = list(pool.map(run, jobs))
    for (name, i), out in zip(jobs, outputs):
        if name is not None:
            assert out["output_ids"] == processed_reference[name][i], f"{spec_server.config}, {name}, prompt {i}"
    forced = [
        out["output_ids"][10:] for (name, _), out in zip(jobs, outputs) if name == "only token 13 from the 10th on"
    ]
    assert all(tail and set(tail) == {13} for tail in forced), "the forcing processor did not act"

    # sampled (temperature 1): only what the processors allow is drawn, at every draft position
    for i in range(2):
        forced = generate(url, prompts[i], processor=serialized("ForceAfter"), temperature=1.0,
                          custom_params={"after": 10, "token": 13})["output_ids"]  # fmt: skip
        assert forced[10:] and set(forced[10:]) == {13}, f"{spec_server.config}, sampled: {forced}"
        tokens = generate(url, prompts[i], processor=serialized("NoRepeat"), temperature=1.0, custom_params={})
        tokens = tokens["output_ids"]
        repeats = [j for j in range(1, len(tokens)) if tokens[j] == tokens[j - 1]]
        assert not repeats, f"{spec_server.config}, sampled: a token repeated at {repeats}: {tokens}"


# -- stops inside a step ------------------------------------------------------------------------------------------

# A speculative step commits several tokens at once: a stop string, stop token or regex met inside them ends the
# output where non-speculative decoding ends it (the tokens after it dropped), min_new_tokens included.
STOPS = {
    "stop string": {"stop": ["<<"]},
    "two stop strings": {"stop": ["=", "\n"]},
    "stop string kept": {"stop": [" the"], "no_stop_trim": True},
    "stop string after min_new_tokens": {"stop": ["<<"], "min_new_tokens": 20},
    "stop token after min_new_tokens": {"stop_token_ids": [13], "min_new_tokens": 10},
    "stop regex": {"stop_regex": ["[0-9]{2}"]},
}
STOP_PROMPTS = 4


def generate_stopped(url: str, prompt, options: dict) -> tuple:
    out = generate(url, prompt, 80, **options)
    return out["text"], out["output_ids"], out["meta_info"]["finish_reason"]


@pytest.fixture(scope="module")
def stopped_reference(tiny_server, prompts):
    return in_flight(
        lambda name, p: generate_stopped(tiny_server.base_url, p, STOPS[name]), STOPS, prompts[:STOP_PROMPTS]
    )


@pytest.mark.parametrize("spec_server", list(CONFIGS), indirect=True)
def test_stops_met_inside_a_step_end_the_output_where_non_speculative_decoding_does(
    spec_server, prompts, stopped_reference
):
    jobs = [(name, i) for name in STOPS for i in range(STOP_PROMPTS)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outputs = list(
            pool.map(lambda job: generate_stopped(spec_server.base_url, prompts[job[1]], STOPS[job[0]]), jobs)
        )
    for (name, i), out in zip(jobs, outputs):
        assert out == stopped_reference[name][i], f"{spec_server.config}, {name}, prompt {i}"
    matched = [out[2].get("matched") for out in outputs]
    assert sum(m is not None for m in matched) >= len(jobs) // 2, f"few requests met their stop: {matched}"


# -- prefix cache ----------------------------------------------------------------------------------------------

# A prompt seen before is served from the radix cache: the target's KV of the prefix, and the drafter's (DFLASH keeps
# the context K/V of every committed token; EAGLE3 its draft KV), are reused, not recomputed. Requests that share a
# few-shot prefix with different questions reuse part of it.
QUESTIONS = ("What is 17 + 25?", "A cat has 4 legs. How many legs do 3 cats have?")


def _cache_prompts(prompts, config: str) -> list[str]:
    """A few-shot prefix no earlier request used (the configuration's name leads it), alone, then with each
    question; each text twice, the second time from the radix cache."""
    prefix = f"Examples for {config}.\n\n" + "\n\n".join(prompts[:3])
    texts = [prefix] + [f"{prefix}\n\nQuestion: {q}\nAnswer:" for q in QUESTIONS]
    return [t for text in texts for t in (text, text)]


@pytest.fixture(scope="module")
def cache_reference(tiny_server, prompts):
    return {config: [generate(tiny_server.base_url, t)["output_ids"] for t in _cache_prompts(prompts, config)]
            for config in CONFIGS}  # fmt: skip


@pytest.mark.parametrize("spec_server", list(CONFIGS), indirect=True)
def test_prefix_cache_hits_keep_the_output_and_the_acceptance(spec_server, prompts, cache_reference):
    """Greedy outputs of prompts served from the radix cache, whole or a shared prefix, equal the non-speculative
    server's, and a prompt served again from the cache drafts as well as the first time: drafter state of cached
    tokens that were lost or misplaced would leave the output exact but cut the accepted tokens."""
    outputs = [generate(spec_server.base_url, t) for t in _cache_prompts(prompts, spec_server.config)]
    assert [o["output_ids"] for o in outputs] == cache_reference[spec_server.config]
    for first, again in zip(outputs[::2], outputs[1::2]):
        cold, warm = first["meta_info"], again["meta_info"]
        # all but the last token (EAGLE's radix cache keys token pairs: all but the last two)
        assert warm["cached_tokens"] >= warm["prompt_tokens"] - 2, f"no radix hit: {warm}"
        taus = [m["completion_tokens"] / m["spec_verify_ct"] for m in (cold, warm)]
        print(
            f"{spec_server.config}: {cold['prompt_tokens']} prompt tokens, tau cold {taus[0]:.2f}, cached {taus[1]:.2f}"
        )
        assert taus[1] >= 0.9 * taus[0] and taus[0] > 1.5, f"tau {taus[0]:.2f} cold, {taus[1]:.2f} from the cache"
    prefix_tokens = outputs[0]["meta_info"]["prompt_tokens"]
    shared = [o["meta_info"]["cached_tokens"] for o in outputs[2::2]]  # each question's first request
    assert all(c >= prefix_tokens - 2 for c in shared), f"the questions reused little of the prefix: {shared}"


# -- grammar-constrained decoding --------------------------------------------------------------------------------

# name -> constraint: each one's grammar state changes token by token, so a draft node must be masked with the state
# after its own path (SGLang builds those masks; the plugin's verify must apply them at every node)
CONSTRAINTS = {
    "regex": {"regex": r" [0-9]+ [a-z ]+\."},
    "JSON schema": {
        "json_schema": json.dumps(
            {
                "type": "object",
                "properties": {"answer": {"type": "integer"}, "why": {"type": "string", "maxLength": 40}},
                "required": ["answer", "why"],
            }
        )
    },
    "EBNF": {"ebnf": 'root ::= " The answer is " [0-9]+ "."'},
}
# the same requests with a penalty or a processor as well: the grammar mask and the per-node logit processing meet
COMBINED = {
    "JSON schema with penalties": {**CONSTRAINTS["JSON schema"], "repetition_penalty": 1.3, "frequency_penalty": 0.5},
    "regex with a processor": {**CONSTRAINTS["regex"], "processor": serialized("NoRepeat"), "custom_params": {}},
}
GRAMMAR_PROMPTS = 4


@pytest.fixture(scope="module")
def constrained_reference(tiny_server, prompts):
    """Non-speculative greedy outputs under each constraint."""
    options = {**CONSTRAINTS, **COMBINED}
    run = lambda name, p: generate(tiny_server.base_url, p, **options[name])["output_ids"]  # noqa: E731
    return in_flight(run, options, prompts[:GRAMMAR_PROMPTS])


@pytest.mark.parametrize("spec_server", list(CONFIGS), indirect=True)
def test_grammar_constrained_greedy_output_equals_non_speculative(spec_server, prompts, constrained_reference):
    """Regex, JSON-schema and EBNF constraints, alone and with penalties or a processor: the greedy tokens equal the
    non-speculative ones, constrained and unconstrained requests sharing batches."""
    options = {**CONSTRAINTS, **COMBINED}
    jobs = [(name, i) for name in options for i in range(GRAMMAR_PROMPTS)] + [(None, i) for i in range(4)]
    url = spec_server.base_url
    accepted_before = sum(spec_metrics(url).get("accepted_per_position", []))

    def run(job):
        name, i = job
        return generate(url, prompts[i], **options.get(name, {}))

    with ThreadPoolExecutor(len(jobs)) as pool:
        outputs = list(pool.map(run, jobs))
    for (name, i), out in zip(jobs, outputs):
        if name is not None:
            assert out["output_ids"] == constrained_reference[name][i], f"{spec_server.config}, {name}, prompt {i}"
    ebnf = [out["text"] for (name, _), out in zip(jobs, outputs) if name == "EBNF"]
    assert all(re.fullmatch(r" The answer is [0-9]+\.?", text) for text in ebnf), ebnf  # "." unless cut by length
    accepted = sum(spec_metrics(url).get("accepted_per_position", [])) - accepted_before
    assert accepted > 0, f"{spec_server.config}: no draft token accepted, the parity above compared no speculation"


# A constraint that only digits meet, and that cannot end within the request: every conditional is the target's
# restricted to the vocabulary's all-digit tokens, far from the unconstrained one.
DIGITS = {"regex": "[0-9]{60,}"}
DIGIT_REQUESTS = 200
DIGIT_TOKENS = 6


@pytest.mark.parametrize("spec_server", list(CONFIGS), indirect=True)
def test_grammar_constrained_sampling_follows_the_masked_target(spec_server, prompts):
    """Sampled at temperature 1 under a digits-only regex, every token is an exact sample of the target's conditional
    restricted to the tokens the grammar allows (rejected drafts included: the drafters do not see the grammar)."""
    prompt = prompts[2]

    def one(_):
        return generate(spec_server.base_url, prompt, DIGIT_TOKENS, temperature=1.0, **DIGITS)["output_ids"]

    with ThreadPoolExecutor(SAMPLED_CONCURRENCY) as pool:
        outputs = list(pool.map(one, range(DIGIT_REQUESTS)))
    assert all(len(o) == DIGIT_TOKENS for o in outputs), "a digits-only request ended before its max_new_tokens"
    model, tokenizer = hf_model()
    vocab = model.config.vocab_size
    allowed = torch.tensor([re.fullmatch("[0-9]+", tokenizer.decode([t])) is not None for t in range(vocab)])
    logits = conditionals(prompt, outputs)  # [R, K, V]
    emitted = torch.tensor(outputs)  # [R, K]
    pvalue, outside = pit_pvalue(logits.masked_fill(~allowed, float("-inf")), emitted)
    unmasked, _ = pit_pvalue(logits, emitted)
    print(f"digits-only {spec_server.config}: PIT p-value {pvalue:.3g} (unconstrained target: {unmasked:.3g})")
    assert outside == 0, f"{outside} sampled tokens are outside the grammar"
    assert pvalue > 1e-3, f"constrained samples do not follow the masked target (p = {pvalue:.3g})"
    assert unmasked < 1e-6, "the test cannot tell the masked target from the unconstrained one"


PROMETHEUS_LINE = re.compile(r'^sglang_kimi:spec_accepted_per_position_total\{[^}]*position="(\d+)"[^}]*\} (\S+)$')


@pytest.mark.parametrize("spec_server", ["dflash-tree-32", "eagle3-tree"], indirect=True)
def test_prometheus_carries_the_per_position_counters(spec_server, prompts):
    url = spec_server.base_url
    generate_all(url, prompts[:4], 1)
    text = requests.get(url + "/metrics", timeout=60).text
    accepted = {}
    for line in text.splitlines():
        match = PROMETHEUS_LINE.match(line)
        if match:
            accepted[int(match.group(1))] = float(match.group(2))
    assert accepted, "no sglang_kimi:spec_accepted_per_position_total in /metrics"
    snapshot = spec_metrics(url)
    assert [accepted.get(d, 0.0) for d in range(1, snapshot["max_depth"] + 1)] == snapshot["accepted_per_position"]
    assert "sglang_kimi:spec_accept_length_total" in text


# -- sampled decoding ---------------------------------------------------------------------------------------------

TOP_P = 0.9
SAMPLED_REQUESTS = 80
SAMPLED_TOKENS = 4


@pytest.mark.parametrize("spec_server", ["dflash-tree-32", "eagle3-tree"], indirect=True)
def test_sampling_follows_the_target_distribution(spec_server, prompts):
    pvalue, greedy_pvalue, outside = sampled_pit_pvalue(
        spec_server.base_url, prompts[0], SAMPLED_REQUESTS, SAMPLED_TOKENS, TOP_P
    )
    print(f"sampled {spec_server.config}: PIT chi-square p-value {pvalue:.3g} (argmax tokens: {greedy_pvalue:.3g})")
    # SGLang's and transformers' float32 logits differ by ~1e-6: a token at the top-p boundary may be in one's
    # support and not the other's. That can happen, rarely; anything more is a real difference.
    assert outside <= max(1, SAMPLED_REQUESTS * SAMPLED_TOKENS // 100), f"{outside} tokens outside the support"
    assert pvalue > 1e-3, f"sampled tokens do not follow the target distribution (p = {pvalue:.3g})"
    assert greedy_pvalue < 1e-6, "the test cannot tell argmax tokens from samples"


# Three sampling set-ups served in the same batches: a low temperature with top-k, a high one with top-p and min-p,
# and plain temperature 1. Each group's tokens must follow its own filtered conditional; the first two must be far
# from the plain one, which is what a verify that took one request's parameters (or none) for the batch samples from.
MIXED_SAMPLING = [
    {"temperature": 0.5, "top_k": 4},
    {"temperature": 1.3, "top_p": 0.9, "min_p": 0.1},
    {"temperature": 1.0},
]
MIXED_REQUESTS = 60
MIXED_TOKENS = 6


@pytest.mark.parametrize("spec_server", list(CONFIGS), indirect=True)
def test_each_request_samples_with_its_own_temperature_top_k_top_p_and_min_p(spec_server, prompts):
    report = mixed_sampling_pvalues(spec_server.base_url, prompts[1], MIXED_SAMPLING, MIXED_REQUESTS, MIXED_TOKENS)
    for params, (pvalue, outside, plain) in zip(MIXED_SAMPLING, report):
        print(f"sampled {spec_server.config} {params}: PIT p-value {pvalue:.3g} (plain temperature 1: {plain:.3g})")
        assert outside <= max(1, MIXED_REQUESTS * MIXED_TOKENS // 100), (
            f"{params}: {outside} tokens outside the support"
        )
        assert pvalue > 1e-3, f"{params}: sampled tokens do not follow the filtered target (p = {pvalue:.3g})"
        if params != {"temperature": 1.0}:
            assert plain < 1e-6, f"{params}: the test cannot tell these samples from plain temperature-1 ones"


# Penalties that favour repeating (allowed: frequency and presence in [-2, 2], repetition in (0, 2]), so that they
# act on most sampled tokens: with 8 tokens per request about two thirds repeat an earlier one.
SAMPLED_PENALTIES = {"frequency_penalty": -2.0, "presence_penalty": -2.0, "repetition_penalty": 0.5}
PENALISED_TOKENS = 8


@pytest.mark.parametrize("spec_server", ["dflash-chain", "dflash-tree-32", "eagle3-tree"], indirect=True)
def test_penalised_sampling_follows_the_penalised_target_distribution(spec_server, prompts):
    """Every token sampled with penalties is an exact sample of the target's conditional under the penalties of its
    own prefix (applied here one output at a time); the same outputs are far from the unpenalised conditional,
    which is what a verify that drops the penalties (SGLang's DFLASH overlap path) samples from."""
    pvalue, unpenalised, outside, repeats = penalised_pit_pvalues(
        spec_server.base_url, prompts[0], SAMPLED_REQUESTS, PENALISED_TOKENS, TOP_P, SAMPLED_PENALTIES
    )
    print(
        f"penalised {spec_server.config}: PIT p-value {pvalue:.3g} (unpenalised: {unpenalised:.3g}), {repeats} repeats"
    )
    assert outside <= max(1, SAMPLED_REQUESTS * PENALISED_TOKENS // 100), f"{outside} tokens outside the support"
    assert pvalue > 1e-3, f"penalised samples do not follow the penalised target distribution (p = {pvalue:.3g})"
    assert unpenalised < 1e-6, "the test cannot tell penalised samples from unpenalised ones"
    assert repeats >= SAMPLED_REQUESTS * PENALISED_TOKENS // 4, f"only {repeats} outputs repeat an earlier one"


def test_the_sampling_test_fails_when_verification_is_made_greedy(request, server_pool, prompts):
    server = server_pool.get(GREEDY_VERIFY, request)
    try:
        pvalue, _, _ = sampled_pit_pvalue(server.base_url, prompts[0], SAMPLED_REQUESTS, SAMPLED_TOKENS, TOP_P)
    finally:
        server_pool.stop(GREEDY_VERIFY)
    print(f"greedy verify: PIT chi-square p-value {pvalue:.3g}")
    assert pvalue < 1e-3, f"greedily verified samples passed the distribution test (p = {pvalue:.3g})"


def test_plugin_entries_for_cpu_speculative_decoding_are_loaded(tiny_server):
    state = fetch_plugin_state(tiny_server.base_url)
    for name in (
        "cpu-attention-backend",
        "cpu-eagle-draft-backends",
        "cpu-tree-mask-mode",
        "cpu-dflash-allowed",
        "cpu-dflash-record-stream",
        "input-embeds-model-dtype",
        "lossless-eagle-sampling",
        "lossless-dflash-sampling",
        "lossless-dflash-sampling-available",
        "dflash-tree-worker",
    ):
        assert state["registrations"][name] == "ok", (
            name,
            state["registrations"][name],
        )


@pytest.mark.parametrize("spec_server", ["dflash-tree-32", "eagle3-tree"], indirect=True)
def test_an_idle_speculative_server_waits_instead_of_polling(spec_server, prompts):
    """After a speculative step no process of the server spins: the tree servers stay up for the whole session,
    idle between the modules that share them."""
    generate_all(spec_server.base_url, prompts[:2], 2, max_new_tokens=8)
    busy = busy_while_idle(spec_server)
    assert not busy, f"idle server processes using a core: {busy}"
