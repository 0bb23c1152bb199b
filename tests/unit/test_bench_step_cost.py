"""``bench/bench_step_cost.py``'s bookkeeping (its servers run only when the benchmark runs, and in
``tests/e2e/test_rank_shaped.py``): the flags that fix a width, the step time of the window where every request
decodes, the split from the cost probe's sums, the verify's expert counts and the ``t(B, w)`` table it writes."""

from __future__ import annotations

import json

import pytest
from support.repo_scripts import load_script

from sglang_kimi.models import kimi_shapes as ks
from sglang_kimi.speculative.adaptive.profile import read_step_costs, server_cost_setup


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/bench_step_cost.py")


def test_each_mode_fixes_the_width_of_every_step(bench):
    assert bench.mode_args(bench.parse_mode("ar"), None, None) == []
    chain = bench.mode_args(bench.parse_mode("chain-3"), "D", None)
    assert chain[-2:] == ["--speculative-num-draft-tokens", "4"] and "DFLASH" in chain
    assert bench.mode_args(bench.parse_mode("tree-16"), "D", None)[-2:] == ["--speculative-dflash-tree-budget", "16"]
    eagle = bench.mode_args(bench.parse_mode("eagle3-2"), None, "E")
    assert eagle[eagle.index("--speculative-num-steps") + 1] == "2"
    assert eagle[eagle.index("--speculative-num-draft-tokens") + 1] == "3"
    assert eagle[eagle.index("--speculative-eagle-topk") + 1] == "1"
    assert bench.parse_mode("tree-16").window == 17
    with pytest.raises(bench.BenchError, match="pass --dflash"):
        bench.mode_args(bench.parse_mode("chain-1"), None, "E")
    for bad in ("tree", "tree-0", "chain-x", "medusa-2"):
        with pytest.raises(bench.BenchError, match="use ar, chain-K"):
            bench.parse_mode(bad)


def test_a_running_servers_width_is_read_from_its_settings(bench):
    def info(**fields):
        plugin = fields.pop("plugin", {})
        return {"internal_states": [{"sglang_kimi": {"args": plugin}}], **fields}

    assert bench.mode_of_server(info(speculative_algorithm=None)).name == "ar"
    dflash = info(speculative_algorithm="DFLASH", speculative_num_draft_tokens=8)
    assert bench.mode_of_server(dflash).name == "chain-7"
    tree = info(speculative_algorithm="DFLASH", plugin={"dflash_tree_budget": 16})
    assert bench.mode_of_server(tree).name == "tree-16"
    eagle = info(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=1)
    assert bench.mode_of_server(eagle).name == "eagle3-3"
    with pytest.raises(bench.BenchError, match="chooses its widths"):
        bench.mode_of_server(info(speculative_algorithm="DFLASH", plugin={"adaptive": True}))
    with pytest.raises(bench.BenchError, match="no single width"):
        bench.mode_of_server(info(speculative_algorithm="EAGLE3", speculative_num_steps=3, speculative_eagle_topk=4))


def test_step_time_is_taken_where_every_request_decodes(bench):
    # three requests, 0.1 s a step; they start decoding at 1.0, 1.3 and 1.5 s (staggered prefills) and report
    # cumulative verify steps; one chunk of the last merges two steps (a slow reader)
    traces = [
        [(1.0 + 0.1 * i, i) for i in range(20)],
        [(1.3 + 0.1 * i, i) for i in range(20)],
        [(1.5 + 0.1 * i, i) for i in range(20) if i != 7],
    ]
    assert bench.step_seconds(traces) == pytest.approx(0.1)
    with pytest.raises(bench.BenchError, match="raise --output-len"):
        bench.step_seconds([[(0.0, 0), (1.0, 1)], [(2.0, 0), (3.0, 1)]])


def _snapshot(target_verify, draft, rows):
    return {
        "forwards": {
            "target": {"extend": {"count": 1, "seconds": 5.0}, "target_verify": target_verify},
            "draft": {"extend": {"count": 1, "seconds": 7.0}, "target_verify": draft},
        },
        "experts": {"routed_experts": 384, "top_k": 8, "by_rows": rows},
    }


def test_the_split_comes_from_the_probes_sums_over_the_level(bench):
    before = _snapshot({"count": 10, "seconds": 1.0}, {"count": 10, "seconds": 0.5}, {"72": {"calls": 10,
                       "distinct_sum": 1000, "tokens_sum": 720}})  # fmt: skip
    after = _snapshot(
        {"count": 30, "seconds": 2.0},
        {"count": 30, "seconds": 1.5},
        {"72": {"calls": 70, "distinct_sum": 12400, "tokens_sum": 4320}, "80": {"calls": 5, "distinct_sum": 5,
                                                                                "tokens_sum": 400}},
    )  # fmt: skip
    delta = bench.probe_delta(before, after)
    assert "extend" not in delta["forwards"]["target"]  # unchanged cells drop out
    parts = bench.split(0.2, delta)
    assert parts["steps"] == 20
    assert parts["target_s"] == pytest.approx(0.05) and parts["draft_s"] == pytest.approx(0.05)
    assert parts["rest_s"] == pytest.approx(0.1) and parts["draft_forwards_per_step"] == 1
    experts = bench.verify_experts(delta, tokens=72)
    assert experts["rows"] == 72 and experts["calls"] == 60
    assert experts["mean_distinct"] == pytest.approx(190) and experts["mean_tokens"] == pytest.approx(60)
    assert experts["expected_random"] == pytest.approx(ks.expected_distinct_experts(384, 8, 60))
    assert bench.verify_experts(delta, tokens=200) is None  # no router call that large
    assert bench.split(0.2, bench.probe_delta(after, after)) == {"steps": 0}


def test_the_table_it_writes_is_the_step_costs_format(bench, tmp_path):
    model = tmp_path / "target"
    model.mkdir()
    config = ks.rank_target_config(ks.RankShape(tp=8, layers=6))
    (model / "config.json").write_text(json.dumps(config))
    server = {"model_path": str(model), "tp_size": 1, "ep_size": 1, "moe_a2a_backend": "none", "device": "cpu:x"}

    def row(mode, batch, step):
        m = bench.parse_mode(mode)
        return {"mode": mode, "family": m.family, "width": m.width, "concurrency": batch, "step_s": step}

    result = {
        "servers": {"ar": server, "tree-8": server, "chain-2": server},
        "rows": [row("ar", 1, 0.01), row("ar", 4, 0.02), row("tree-8", 1, 0.03), row("chain-2", 4, 0.05)],
    }
    costs = bench.step_costs(result)
    assert costs.seconds == {
        "tree": {1: {8: 0.03, 0: 0.01}, 4: {0: 0.02}},
        "chain": {4: {2: 0.05, 0: 0.02}, 1: {0: 0.01}},
    }
    assert (costs.tp, costs.shape) == server_cost_setup(config, 1) and costs.device == "cpu:x"
    paths = bench.write_results(result | {"device": "cpu:x"}, tmp_path, "run")
    assert read_step_costs(paths["step_costs"]).seconds == costs.seconds
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("together", [False, True])
def test_servers_start_one_at_a_time_or_together_and_all_stop(bench, tmp_path, monkeypatch, together):
    """Without ``--start-together`` each mode's server starts when its turn comes; with it, every server starts and
    is ready before the first is measured, each is measured in turn, and every one is stopped, a skipped mode's
    included."""
    events = []

    class Server:
        def __init__(self, name):
            self.name, self.base_url = name, f"http://{name}"

        def stop(self):
            events.append(("stop", self.name))

    def launch(mode, opts, log, wait=True):
        events.append(("start", mode.name))
        return Server(mode.name)

    def measure(url, mode, opts):
        events.append(("measure", mode.name))
        if mode.name == "tree-8":  # the deadline passes while this mode is measured
            clock[0] += 1000
        return {"device": "cpu:test"}, []

    clock = [0.0]
    monkeypatch.setattr(bench, "launch", launch)

    def wait_ready(server, opts):
        events.append(("ready", server.name))
        return server

    monkeypatch.setattr(bench, "wait_ready", wait_ready)
    monkeypatch.setattr(bench, "measure_server", measure)
    monkeypatch.setattr(bench, "write_results", lambda *args: None)
    monkeypatch.setattr(bench.time, "monotonic", lambda: clock[0])
    argv = ["--model", "m", "--dflash", "d", "--modes", "ar,tree-8,chain-2", "--deadline-s", "100"]
    _, opts = bench.options(argv + ["--out-dir", str(tmp_path)] + (["--start-together"] if together else []))
    result = bench.run(opts)
    assert [s["mode"] for s in result["skipped"]] == ["chain-2"] and set(result["servers"]) == {"ar", "tree-8"}
    if together:
        # every server ready before the first is measured: none measured while another starts
        assert events == [("start", "ar"), ("start", "tree-8"), ("start", "chain-2"),
                          ("ready", "ar"), ("ready", "tree-8"), ("ready", "chain-2"), ("measure", "ar"),
                          ("stop", "ar"), ("measure", "tree-8"), ("stop", "tree-8"), ("stop", "chain-2")]  # fmt: skip
    else:
        assert events == [("start", "ar"), ("measure", "ar"), ("stop", "ar"),
                          ("start", "tree-8"), ("measure", "tree-8"), ("stop", "tree-8")]  # fmt: skip
