"""Speculative servers behind SGLang's own router (``sglang-router``, round-robin): the session's DFLASH tree and
EAGLE3 tree servers and its autoregressive reference server are the router's three workers (a mixed fleet).

- A mixed concurrent load through the router (greedy ``/generate``, greedy OpenAI chat, sampled requests) gives
  every greedy request the non-speculative server's output, and both tree workers serve part of it.
- ``sglang-kimi acceptance`` given the router's URL reads every worker it lists: each tree worker's counters equal
  what that worker reports itself, the autoregressive one has none, and the summed row is the trees' sum (tau
  recomputed from the summed histogram); ``fetch_plugin_state`` given the router reads the same sum.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from support.router import router
from support.spec_e2e import TINY, TREE_SERVERS, generate, gsm8k_prompts, shared_tree_server

from sglang_kimi.cli import main as cli
from sglang_kimi.launcher.dp_reports import merged_report
from sglang_kimi.launcher.server import fetch_plugin_state
from sglang_kimi.speculative import acceptance_rates

pytestmark = pytest.mark.e2e
SHARED = ("dflash-tree-32", "eagle3-tree")
SERVERS = [TINY, *(TREE_SERVERS[name] for name in SHARED)]
GREEDY, CHATS, SAMPLED, TOKENS, CONCURRENCY = 18, 6, 6, 32, 8


@pytest.fixture(scope="module")
def workers(request, server_pool, tiny_server):
    """The two tree servers, then the autoregressive one."""
    return [*(shared_tree_server(server_pool, request, name) for name in SHARED), tiny_server]


@pytest.fixture(scope="module")
def router_url(workers, tmp_path_factory):
    with router([w.base_url for w in workers], tmp_path_factory.mktemp("router") / "router.log") as url:
        yield url


def chat(url: str, question: str, **sampling) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": question}], "max_tokens": TOKENS,
            "temperature": 0.0, **sampling}  # fmt: skip
    response = requests.post(url + "/v1/chat/completions", json=body, timeout=600)
    assert response.status_code == 200, response.text[:500]
    return response.json()


def steps(url: str) -> int:
    metrics = merged_report(requests.get(url + "/server_info", timeout=60).json()).get("spec_metrics") or {}
    return int(metrics.get("steps") or 0)


def test_a_mixed_load_through_the_router_is_lossless(router_url, workers, tiny_server):
    prompts = gsm8k_prompts(GREEDY)
    questions = [p.removeprefix("Question: ").removesuffix("\nAnswer:") for p in prompts[:CHATS]]
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        reference = list(pool.map(lambda p: generate(tiny_server.base_url, p, TOKENS)["output_ids"], prompts))
        chat_reference = list(pool.map(lambda q: chat(tiny_server.base_url, q), questions))
    trees = workers[: len(SHARED)]
    before = [steps(w.base_url) for w in trees]

    jobs = [("greedy", i) for i in range(GREEDY)] + [("chat", i) for i in range(CHATS)]
    jobs += [("sampled", i) for i in range(SAMPLED)]
    jobs = [jobs[i] for i in sorted(range(len(jobs)), key=lambda i: (i * 7) % len(jobs))]  # kinds interleaved

    def run(job):
        kind, i = job
        if kind == "greedy":
            return generate(router_url, prompts[i], TOKENS)
        if kind == "chat":
            return chat(router_url, questions[i])
        return generate(router_url, prompts[i], TOKENS, temperature=0.8, top_p=0.9)

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        results = dict(zip(jobs, pool.map(run, jobs)))
    for i in range(GREEDY):
        assert results[("greedy", i)]["output_ids"] == reference[i], f"greedy /generate {i} differs behind the router"
    for i in range(CHATS):
        got, want = results[("chat", i)]["choices"][0], chat_reference[i]["choices"][0]
        assert got["message"]["content"] == want["message"]["content"], f"greedy chat {i} differs behind the router"
    for i in range(SAMPLED):
        out = results[("sampled", i)]
        assert out["meta_info"]["finish_reason"]["type"] in ("length", "stop") and out["output_ids"], out["meta_info"]
    after = [steps(w.base_url) for w in trees]
    assert all(a > b for a, b in zip(after, before)), f"a tree worker served none of the load: {before} -> {after}"


def test_acceptance_of_each_worker_and_summed_through_the_router(router_url, workers, capsys):
    for prompt in gsm8k_prompts(3):  # at least one speculative step on some worker
        generate(router_url, prompt, TOKENS)
    assert cli.main(["acceptance", "--base-url", router_url, "--json"]) == 0
    table = json.loads(capsys.readouterr().out)
    urls = [w.base_url for w in workers[: len(SHARED)]]
    assert sorted(table["workers"]) == sorted(w.base_url for w in workers)
    assert table["workers"][workers[-1].base_url] is None  # the autoregressive worker counts no drafts
    own = {url: merged_report(requests.get(url + "/server_info", timeout=60).json())["spec_metrics"] for url in urls}
    for url in urls:  # idle servers: the counters read through the router are the worker's own
        for key in ("steps", "drafted_per_position", "accepted_per_position", "accept_length_histogram"):
            assert table["workers"][url][key] == own[url][key], (url, key)
    summed = table["all"]
    assert summed["steps"] == sum(own[u]["steps"] for u in urls)
    for key in ("drafted_per_position", "accepted_per_position", "accept_length_histogram"):
        n = max(len(own[u][key]) for u in urls)
        assert summed[key] == [sum(own[u][key][i] for u in urls if i < len(own[u][key])) for i in range(n)], key
    assert summed["tau"] == pytest.approx(acceptance_rates.tau(summed["accept_length_histogram"]))
    # the plugin's state as its own clients read it (the demo, the GPU scripts), given the router: the whole fleet
    fleet = fetch_plugin_state(router_url)["spec_metrics"]
    assert fleet["steps"] == summed["steps"] and fleet["accept_length_histogram"] == summed["accept_length_histogram"]
    assert cli.main(["acceptance", "--base-url", router_url]) == 0
    printed = capsys.readouterr().out
    assert all(w.base_url in printed for w in workers) and "all workers" in printed, printed
    assert "no speculative counters" in printed
