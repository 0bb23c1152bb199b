"""Tensor, data and pipeline parallelism 2 on CPU: the launcher gives each of the dp x tp x pp ranks its own group
of cores (``SGLANG_CPU_OMP_THREADS_BIND``) and every rank's scheduler process runs on its group alone, and
the greedy output of autoregressive decoding, DFLASH trees (the worker's cross-rank top-K merge) and EAGLE3 trees at
TP 2 equals TP 1's, EAGLE3 and DFLASH trees' also with attention data parallelism (``--dp-size 2
--enable-dp-attention``: SGLang pads each rank's verify batch to the ranks' common size; a group without requests
runs an empty verify; on CPU SGLang refuses its own DFLASH chains with it); sampled DFLASH trees at TP 2 follow the
target distribution.

The DFLASH tree server is adaptive (``--speculative-kimi-adaptive``, tree budgets 0..16) with a policy forced to
switch widths every other step: both ranks must run rank 0's width at every step (their timings differ), and the
output must not depend on which widths ran. Its budgets 1 and 2 are chains of one and two drafts, and budget 0 is
the plain verify of the bonus token.

Two nodes on this machine (``--nnodes 2``, gloo, each node one TP rank on its own cores): SGLang's multi-node tensor
parallelism serves the adaptive DFLASH tree and EAGLE3 trees with the same greedy output as TP 1 (and so as one
node at TP 2).

At DP 2 each rank is a scheduler process serving its own requests with its own plugin counters: the DFLASH tree's
greedy output equals TP 1's, and the plugin's report read from ``/server_info``
(``sglang_kimi.launcher.dp_reports``) counts the steps of both ranks. At PP 2 (SGLang's DFLASH needs PP 1) the
autoregressive greedy output equals TP 1's: the plugin's Kimi class keeps SGLang's pipeline-parallel forward."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from support.processes import idle_core_share, titled
from support.servers import launch_nodes, server_config
from support.spec_e2e import (
    EAGLE3_TREE,
    KIMI_CPU,
    TINY,
    generate,
    generate_all,
    gsm8k_prompts,
    sampled_pit_pvalue,
)

from sglang_kimi.assets import TINY_DFLASH
from sglang_kimi.launcher.dp_reports import reports
from sglang_kimi.launcher.server import fetch_plugin_state, group_members
from sglang_kimi.settings import ACCEPTANCE_TRACE_ENV

TP2 = ["--tp", "2"]
PROMPTS = 3
TOKENS = 32
DFLASH = ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(TINY_DFLASH)]
CONFIGS = {
    "autoregressive": [],
    "dflash-chain": DFLASH,  # SGLang's own DFLASH worker
    "dflash-tree-adaptive": DFLASH + ["--speculative-dflash-tree-budget", "16", "--speculative-kimi-adaptive"],
    "eagle3-tree": EAGLE3_TREE,
    # attention data parallelism: two attention groups inside the TP group, batches padded to a common size
    "eagle3-tree-dp-attention": EAGLE3_TREE + ["--dp-size", "2", "--enable-dp-attention"],
    # the tree worker's DP-attention path: each group drafts, ranks (the head split over the group) and verifies its
    # own requests; a group with none joins the collectives with an empty verify of the tree's window
    "dflash-tree-dp-attention": DFLASH + ["--speculative-dflash-tree-budget", "8", "--dp-size", "2",
                                          "--enable-dp-attention", "--enable-dp-lm-head"],
}  # fmt: skip


@pytest.fixture(scope="module")
def tp1_outputs(tiny_server):
    prompts = gsm8k_prompts(PROMPTS)
    return prompts, [o["output_ids"] for o in generate_all(tiny_server.base_url, prompts, 1, max_new_tokens=TOKENS)]


# widths switch every other step: every due exploration runs (explore_budget 1: no limit on its cost)
FORCED = {"explore_every": 2, "explore_budget": 1, "hysteresis": 0.0, "buckets": [1, 2]}
ADAPTIVE_FILES = ["--speculative-kimi-adaptive-config", "{dir}/policy.json",
                  "--speculative-kimi-adaptive-profile", "{dir}/profile.json"]  # fmt: skip
# the DP-attention tree records its accepted paths: the first rank of each attention group writes its own requests'
TRACE = {"dflash-tree-dp-attention": {ACCEPTANCE_TRACE_ENV: "{dir}/paths.jsonl"}}
TP2_SERVERS = {
    name: server_config(
        f"tp2_{name}",
        KIMI_CPU + TP2 + args + (ADAPTIVE_FILES if "--speculative-kimi-adaptive" in args else []),
        env=TRACE.get(name),
        files={"policy.json": json.dumps(FORCED)} if "--speculative-kimi-adaptive" in args else None,
    )
    for name, args in CONFIGS.items()
}
DP2 = server_config(
    "dp2_dflash_tree", KIMI_CPU + ["--dp-size", "2"] + DFLASH + ["--speculative-dflash-tree-budget", "16"]
)
PP2 = server_config("pp2_autoregressive", KIMI_CPU + ["--pp-size", "2"])
SERVERS = [TINY, *TP2_SERVERS.values(), DP2, PP2]


@pytest.fixture(scope="module", params=list(CONFIGS))
def tp2_server(request, server_pool):
    server = server_pool.get(TP2_SERVERS[request.param], request)
    server.config = request.param
    yield server
    server_pool.stop(TP2_SERVERS[request.param])


def test_tp2_greedy_equals_tp1(tp2_server, tp1_outputs):
    prompts, expected = tp1_outputs
    # three in flight at attention DP 2: one group verifies two requests, the other one padded to two
    concurrency = 3 if "dp-attention" in tp2_server.config else 2
    outputs = [o["output_ids"] for o in generate_all(tp2_server.base_url, prompts, concurrency, max_new_tokens=TOKENS)]
    for i, (got, ref) in enumerate(zip(outputs, expected)):
        assert got == ref, f"{tp2_server.config} at TP 2: prompt {i} differs from TP 1"
    if "dp-attention" in tp2_server.config:  # one request: the other attention group idles through every step
        (alone,) = generate_all(tp2_server.base_url, prompts[:1], 1, max_new_tokens=TOKENS)
        assert alone["output_ids"] == expected[0], f"{tp2_server.config}: prompt 0 alone differs from TP 1"
    state = fetch_plugin_state(tp2_server.base_url)
    assert state["failed"] == [], state
    check_ranks_on_their_own_cores(tp2_server)
    if tp2_server.config == "dflash-tree-dp-attention":
        check_dflash_tree_dp_attention(tp2_server, state, prompts[0])
        check_staggered_arrivals(tp2_server, prompts, expected)
    if tp2_server.config == "dflash-tree-adaptive":
        metrics = state["spec_metrics"]
        ran = {w: n for w, n in state["adaptive"]["steps_by_width"].items() if n}
        print(f"adaptive DFLASH tree at TP 2: tau {metrics['tau']:.2f}, steps by width {ran}")
        assert len(ran) >= 3, f"the forced policy ran too few widths: {ran}"
        assert metrics["tau"] > 1.5, "the TP-merged drafts should still be accepted"
        pvalue, greedy_pvalue, outside = sampled_pit_pvalue(tp2_server.base_url, prompts[0], 80, 4, 0.9)
        print(f"sampled DFLASH tree at TP 2: PIT chi-square p-value {pvalue:.3g} (argmax tokens: {greedy_pvalue:.3g})")
        assert outside <= 3 and pvalue > 1e-3 and greedy_pvalue < 1e-6


def check_dflash_tree_dp_attention(server, state, prompt) -> None:
    """Both groups' tree steps are counted and their accepted paths recorded, and sampled requests are drawn from
    the target's top-p support, not its argmax. (No uniformity test of the draws: SGLang seeds every rank alike, so
    under DP attention the two groups draw the same random streams, and requests on different groups repeat each
    other's samples, its autoregressive decoding too.)"""
    metrics = state["spec_metrics"]
    print(f"DFLASH tree under DP attention: tau {metrics['tau']:.2f} over {metrics['steps']} steps")
    assert metrics["tau"] > 1.5, "the group's drafts should be accepted"
    # every request so far (both groups'), each of its steps (and, under the overlap scheduler, the step a finished
    # request rides along in, which the counters leave out)
    trace = [json.loads(line) for line in (server.log_path.parent / "paths.jsonl").read_text().splitlines()]
    assert len({step["rid"] for step in trace}) == PROMPTS + 1, "each group's requests are in the acceptance trace"
    assert len(trace) >= metrics["steps"]
    _, greedy_pvalue, outside = sampled_pit_pvalue(server.base_url, prompt, 40, 4, 0.9)
    assert outside <= 3 and greedy_pvalue < 1e-6, (outside, greedy_pvalue)  # the boundary of top-p in float32


def check_staggered_arrivals(server, prompts, expected, gap_s: float = 0.4) -> None:
    """Requests arriving while others decode: one group prefills while the other verifies trees (SGLang's mixed
    DP rounds, verified eager); every greedy output is still TP 1's (the later ones shorter: a prefix of it)."""
    tokens = [TOKENS] + [TOKENS // 2] * (len(prompts) - 1)
    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = []
        for prompt, n in zip(prompts, tokens):
            futures.append(pool.submit(generate, server.base_url, prompt, n))
            time.sleep(gap_s)
        outputs = [f.result()["output_ids"] for f in futures]
    for i, (got, ref, n) in enumerate(zip(outputs, expected, tokens)):
        assert got == ref[:n], f"staggered prompt {i} differs from TP 1"


def check_ranks_on_their_own_cores(*servers, ranks: int = 2) -> None:
    """Each scheduler process (one per rank, over the servers given: the nodes of one launch) runs on its own
    cores: SGLang binds ranks to their SGLANG_CPU_OMP_THREADS_BIND group only on AMX and arm64 CPUs, the plugin on
    the others (platform/cpu/thread_binding.py)."""
    schedulers = [pid for server in servers for pid in titled(group_members(server.pgid), b"sglang::scheduler")]
    groups = [os.sched_getaffinity(pid) for pid in schedulers]
    assert len(groups) == ranks, f"{len(groups)} scheduler processes for {ranks} ranks"
    assert all(not a & b for i, a in enumerate(groups) for b in groups[i + 1 :]), f"ranks share cores: {groups}"


def idle_controller_cpu(server, wait_s: float = 2.0) -> float:
    """The share of a core SGLang's data-parallel controller process uses over ``wait_s`` seconds of no requests."""
    (pid,) = titled(group_members(server.pgid), b"sglang::data_parallel_controller")
    return idle_core_share([pid], wait_s)[pid]


def test_dp2_dflash_tree_greedy_and_counters_of_both_ranks(request, server_pool, tp1_outputs):
    prompts, expected = tp1_outputs
    server = server_pool.get(DP2, request)
    try:
        # all in flight at once, round-robin over the two ranks: both ranks serve
        outputs = generate_all(server.base_url, prompts, len(prompts), max_new_tokens=TOKENS)
        for i, (out, ref) in enumerate(zip(outputs, expected)):
            assert out["output_ids"] == ref, f"DP 2: prompt {i} differs from TP 1"
        info = requests.get(server.base_url + "/server_info", timeout=30).json()
        per_rank = [r["spec_metrics"] for r in reports(info)]
        assert len(per_rank) == 2 and all(m["steps"] > 0 for m in per_rank), per_rank
        merged = fetch_plugin_state(server.base_url)
        assert merged["failed"] == [] and merged["data_parallel_ranks"] == 2
        check_ranks_on_their_own_cores(server)
        metrics = merged["spec_metrics"]
        assert metrics["steps"] == sum(m["steps"] for m in per_rank) == sum(metrics["accept_length_histogram"])
        assert metrics["drafted_per_position"][0] == metrics["steps"]
        print(f"DFLASH tree at DP 2: steps per rank {[m['steps'] for m in per_rank]}, tau {metrics['tau']:.2f}")
        # SGLang's controller polls its socket in a loop that never waits; the plugin's blocks (dp_controller.py)
        share = idle_controller_cpu(server)
        print(f"idle data-parallel controller: {share:.1%} of a core")
        assert share < 0.2, f"the idle data-parallel controller uses {share:.0%} of a core"
        assert merged["registrations"]["dp-controller-waits"] == "ok"
    finally:
        server_pool.stop(DP2)


def test_pp2_greedy_equals_tp1(request, server_pool, tp1_outputs):
    prompts, expected = tp1_outputs
    server = server_pool.get(PP2, request)
    try:
        outputs = generate_all(server.base_url, prompts[:2], 2, max_new_tokens=TOKENS)
        for i, (out, ref) in enumerate(zip(outputs, expected)):
            assert out["output_ids"] == ref, f"PP 2: prompt {i} differs from TP 1"
        check_ranks_on_their_own_cores(server)
    finally:
        server_pool.stop(PP2)


@pytest.mark.parametrize("config", ["dflash-tree-adaptive", "eagle3-tree"])
def test_two_nodes_greedy_equals_tp1(config, tmp_path, tp1_outputs):
    prompts, expected = tp1_outputs
    args = KIMI_CPU + TP2 + CONFIGS[config]
    if "--speculative-kimi-adaptive" in args:
        (tmp_path / "policy.json").write_text(json.dumps(FORCED))
        args += [a.replace("{dir}", str(tmp_path)) for a in ADAPTIVE_FILES]
    nodes = launch_nodes(tmp_path, args)
    try:
        outputs = generate_all(nodes[0].base_url, prompts, 2, max_new_tokens=TOKENS)
        for i, (out, ref) in enumerate(zip(outputs, expected)):
            assert out["output_ids"] == ref, f"{config} on two nodes: prompt {i} differs from TP 1"
        state = fetch_plugin_state(nodes[0].base_url)
        assert state["failed"] == [] and state["spec_metrics"]["steps"] > 0, state
        check_ranks_on_their_own_cores(*nodes)
        print(f"{config} on two nodes: tau {state['spec_metrics']['tau']:.2f}")
    finally:
        for node in reversed(nodes):
            node.stop()
