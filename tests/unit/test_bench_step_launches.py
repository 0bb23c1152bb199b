"""``bench/bench_step_launches.py``'s reading of a profiler trace: operators and synchronisations of each decode step
outside the target forward, in the innermost range that holds them, each synchronisation with the Python function it
runs in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.repo_scripts import load_script

bench = load_script("bench/bench_step_launches.py")
REPO = str(bench.REPO)


def span(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def op(name: str, ts: float, dur: float = 1.0, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def call(name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": 1}


def one_step(offset: float) -> list[dict]:
    t = offset
    return [
        span("sglang_kimi.step", t, 100),
        span("sglang_kimi.plan", t + 1, 9),
        op("aten::add", t + 2, 2),
        op("aten::mul", t + 3, 0.5),  # inside aten::add: not a top-level operator
        span("sglang_kimi.draft_forward", t + 10, 20),
        span("step[DRAFT bs=8]", t + 12, 10),  # SGLang's own range, nested
        op("aten::mm", t + 13),
        op("aten::relu", t + 25),  # after SGLang's range: the enclosing plugin phase
        span("sglang_kimi.target_forward", t + 30, 30),
        op("aten::mm", t + 35),  # the target forward: not counted
        op("aten::nonzero", t + 40),
        span("sglang_kimi.verify_accept", t + 60, 20),
        op("aten::argmax", t + 61),
        call(f"{REPO}/sglang_kimi/speculative/workers/dflash_tree.py(185): _tree_decode_step", t + 60, 30),
        call("<built-in method item of Tensor object at 0x1>", t + 64, 2),
        op("aten::item", t + 64, 2),
        op("aten::_local_scalar_dense", t + 65),  # inside aten::item: a synchronisation, not a top-level operator
        op("aten::sub", t + 90),  # in the step, in no phase
        op("aten::add", t + 120),  # after the step
        op("aten::sub", t + 50, tid=2),  # another thread
    ]


def test_a_trace_s_steps_are_split_by_phase_outside_the_target_forward():
    result = bench.step_operators(one_step(0) + one_step(1000))
    assert result["steps"] == 2
    assert result["operators_per_phase"] == {
        "plan": 1,
        "sglang:step[DRAFT]": 1,
        "draft_forward": 1,
        "verify_accept": 2,
        "other": 1,
    }
    assert result["operators_per_step"] == 6
    assert result["operators_outside_forwards"] == 5  # the drafter forward's range (SGLang's step[DRAFT]) left out
    assert result["syncs_per_phase"] == {"verify_accept": 1} and result["syncs_per_step"] == 1
    function = "sglang_kimi/speculative/workers/dflash_tree.py(185): _tree_decode_step"
    assert result["sync_sites"] == {f"verify_accept: aten::_local_scalar_dense in {function}": 1}


def test_a_trace_without_stacks_or_steps():
    events = [e for e in one_step(0) if e["cat"] != "python_function"]
    assert bench.step_operators(events)["sync_sites"] == {"verify_accept: aten::_local_scalar_dense in ?": 1}
    assert bench.step_operators([op("aten::add", 1)]) == {"steps": 0}


@pytest.mark.parametrize(
    ("phases", "met"),
    [({"draft_rank": 0.0, "plan": 3.0}, True), ({"tree_build": 1.0}, False), ({}, True)],
)
def test_the_sync_target_reads_the_tree_worker_s_device_phases(phases, met):
    results = {
        "ratios": {"dflash-tree-32": {1: {"operators": 1.0, "host_ms_per_step": 1.0}}},
        "rows": {"dflash-tree-32": {1: {"profile": {"syncs_per_phase": phases}}}},
    }
    (line,) = bench.targets(results)
    assert line.endswith("met" if met else "MISSED"), line


def test_ratios_compare_each_tree_with_the_chain_at_its_parallelism_and_leave_unmeasured_ones_out():
    def row(ops, ms=None, sampled=None):
        out = {"profile": {"operators_per_step": ops}, "host_ms_per_step": ms}
        if sampled is not None:
            out["profile_sampled"] = {"operators_per_step": sampled}
        return out

    results = {
        "rows": {
            "dflash-chain": {1: row(100, 10.0, 200)},
            "dflash-tree-8": {1: row(125, 11.0, 300)},
            "dflash-chain-tp2": {1: row(50)},
            "dflash-tree-8-tp2": {1: row(60)},
        }
    }
    ratios = bench.ratios(results)
    assert set(ratios) == {"dflash-tree-8", "dflash-tree-8-tp2"}
    assert ratios["dflash-tree-8"][1]["operators"] == 1.25 and ratios["dflash-tree-8"][1]["host_ms_per_step"] == 1.1
    assert ratios["dflash-tree-8"][1]["operators_sampled"] == 1.5
    tp2 = ratios["dflash-tree-8-tp2"][1]
    assert tp2["operators"] == 1.2 and tp2["host_ms_per_step"] is None and tp2["operators_sampled"] is None
    assert bench.budget_of("dflash-tree-16-tp2") == 16 and bench.chain_of("dflash-tree-16-tp2") == "dflash-chain-tp2"
    assert bench.budget_of("adaptive@chain-tp2") is None and bench.chain_of("adaptive@chain-tp2") == "dflash-chain-tp2"


def test_adaptive_held_at_the_full_chain_is_held_to_the_chains_cost():
    results = {
        "ratios": {"adaptive@chain": {1: {"operators": 1.02, "host_ms_per_step": 1.08}}},
        "rows": {"adaptive@chain": {1: {"profile": {"syncs_per_phase": {}}}}},
    }
    assert bench.targets(results) == [
        "adaptive@chain c=1: operators 1.02x the chain's (target <= 1.05x): met",
        "adaptive@chain c=1: host_ms_per_step 1.08x the chain's (target <= 1.05x): MISSED",
    ]


def test_adaptive_at_the_full_chain_has_that_width_only(tmp_path):
    configs = bench.configurations([8], [8], tmp_path)
    assert list(configs) == ["dflash-chain", "dflash-tree-8", "adaptive@chain", "dflash-chain-tp2",
                             "adaptive@chain-tp2", "dflash-tree-8-tp2"]  # fmt: skip
    args = configs["adaptive@chain"]
    settings = json.loads(Path(args[args.index("--speculative-kimi-adaptive-config") + 1]).read_text())
    assert settings == {"widths": [7]}  # the tiny drafter's block of 8: its full chain


def test_what_a_drafter_graph_holds_on_a_gpu_is_left_out_of_the_operators_outside_both_forwards():
    """SGLang's chain argmax (eager here, named by its Python function) and a tree's ranking and build are the
    drafter graph's tail on a GPU; a synchronisation a CPU only makes is told apart from the ones a GPU makes too."""
    fn = "sglang/srt/speculative/dflash_worker_v2.py(1599): _greedy_sample_from_vocab_parallel_head"
    chain = [span("sglang_kimi.step", 0, 100), op("aten::mm", 10), op("aten::argmax", 12), call(fn, 9, 5),
             op("aten::add", 50)]  # fmt: skip
    result = bench.step_operators(chain)
    assert result["operators_per_phase"] == {"sglang:draft_argmax": 2, "other": 1}
    assert result["operators_outside_forwards"] == 1
    tree = [span("sglang_kimi.step", 0, 100), span("sglang_kimi.draft_rank", 1, 20), op("aten::topk", 2),
            span("sglang_kimi.tree_build", 30, 20), op("aten::scatter", 31), op("aten::add", 60)]  # fmt: skip
    assert bench.step_operators(tree)["operators_outside_forwards"] == 1
    profile = {"syncs_per_phase": {"draft_rank": 1, "verify_accept": 1}, "sync_sites": {
        "draft_rank: aten::_local_scalar_dense in speculators/trees.py(232): topk_lowest_index_ties": 1,
        "verify_accept: aten::_local_scalar_dense in x.py(1): walk": 1}}  # fmt: skip
    assert bench.device_phase_syncs(profile) == (1, 1)
