"""``bench/replay_adaptive.py``: the replay of recorded acceptance and measured step costs that judges the adaptive
policy. Its environment (traces walked by token position, cost tables, noise, traffic), its two engines, SGLang's
controller driven without a server, and that the replay tells a good policy from a bad one (that the served policy
decides as the replayed one: ``test_replay_served_policy.py``)."""

from __future__ import annotations

import json
import math

import pytest
from support.repo_scripts import load_script

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def replay():
    return load_script("bench/replay_adaptive.py")


@pytest.fixture(scope="module")
def sources(replay):
    return replay.default_sources(seed=1)


@pytest.fixture(scope="module")
def h200(replay):
    return {t.mode: t for t in replay.costs_from_serving()}


def short(replay, levels=(1, 8), per_client=2, tokens=96):
    """A few columns, small enough for a unit test."""
    return lambda top: [replay.constant(c, tokens, per_client) for c in levels if c <= top]


def test_a_chain_trace_answers_every_width_in_recorded_order(replay):
    # one recorded request: its steps accepted 3, 0 and 7 drafts of 7
    chain = replay.ChainTraces("t", [[3, 0, 7], None], max_width=7)
    assert [chain.accepted(0, 0, w) for w in (0, 1, 2, 7)] == [0, 1, 2, 3]  # the depth reached, capped at the width
    assert [chain.accepted(0, k, 7) for k in range(4)] == [3, 0, 7, 3]  # more steps than recorded: wraps around
    assert chain.accepted(5, 1, 7) == 0  # request 5 of a one-request trace is request 0
    # width 7 commits 4 + 1 + 8 tokens in the recorded steps; width 1 commits 2, 1, 2, 2, 1, 2, 2
    assert chain.steps_at(0, 13, 7) == 3 and chain.steps_at(0, 12, 1) == 7


def test_a_tree_budget_is_its_own_recording_and_budget_one_is_the_chains_first_draft(replay):
    chain = replay.ChainTraces("c", [[3, 0, 7]], max_width=7)
    tree = replay.TreeTraces("t", {4: [[2, 2, 4]], 16: [[5, 6]]}, chain)
    assert tree.widths == (0, 1, 4, 16)
    assert [tree.accepted(0, k, 1) for k in range(3)] == [1, 0, 1]
    assert [tree.accepted(0, k, 4) for k in range(3)] == [2, 2, 4] and tree.accepted(0, 3, 16) == 6
    assert tree.accepted(0, 0, 0) == 0
    with pytest.raises(KeyError, match="no recording of budget 8"):
        tree.accepted(0, 0, 8)


def test_a_tree_recorded_with_paths_answers_every_narrower_budget_on_the_same_steps(replay, tmp_path):
    # request 0's steps accepted the nodes [1, 3, 9] and then [2]; request 1 was left out (its paths did not match)
    nested = replay.NestedTreeTraces("t", 16, [[[1, 3, 9], [2]], None], recorded={4: [[2, 0], [1]], 16: [[3, 1], [2]]})
    assert nested.widths == (0, 1, 2, 4, 8, 16)
    assert [nested.accepted(0, 0, w) for w in (0, 1, 2, 4, 8, 16)] == [0, 1, 1, 2, 2, 3]
    assert [nested.accepted(0, 1, w) for w in (1, 2)] == [0, 1]
    assert nested.path(0, 0, 4) == [1, 3] and nested.path(1, 0, 16) == [1, 3, 9]  # request 1 is request 0
    assert nested.agreement() == {4: 0.5}  # budget 4's own first steps: 2 (agrees) and 1 (request 0's gives 2)
    with pytest.raises(KeyError, match="recorded up to budget 16, not 32"):
        nested.accepted(0, 0, 32)
    # the traces file: the widest budget with paths makes the drafter's tree source the paired one
    traces = {
        "format": "sglang-kimi-acceptance-traces/1",
        "traces": {
            "d/dflash-chain": {"family": "chain", "width": 7, "requests": [[3, 1]]},
            "d/dflash-tree-4": {"family": "tree", "width": 4, "requests": [[2, 2]]},
            "d/dflash-tree-16": {"family": "tree", "width": 16, "requests": [[3, 1]], "paths": [[[1, 3, 9], [2]]]},
        },
    }
    path = tmp_path / "traces.json"
    path.write_text(json.dumps(traces))
    source = replay.load_traces(path)["d/dflash-tree"]
    assert isinstance(source, replay.NestedTreeTraces) and source.accepted(0, 0, 4) == 2
    del traces["traces"]["d/dflash-tree-16"]["paths"]
    path.write_text(json.dumps(traces))
    assert isinstance(replay.load_traces(path)["d/dflash-tree"], replay.TreeTraces)


def test_the_served_policy_sees_a_tree_steps_paths(replay):
    profile = {1: {w: 0.01 * (1 + w / 16) for w in replay.TREE_WIDTHS}}
    policy = replay.Policy(replay.plugin_policy("tree", replay.TREE_WIDTHS, (1,), profile), lag=0)
    policy.observe(1, 16, [3], 0.02, [[1, 3, 9]])
    estimate = policy.runtime.policy.acceptance.pooled()
    assert {w: estimate.get(w) for w in (1, 2, 4, 8, 16, 32)} == {1: 2.0, 2: 2.0, 4: 3.0, 8: 3.0, 16: 4.0, 32: None}


def test_a_recorded_chain_commits_more_per_step_the_wider_it_is(replay, sources):
    for name in ("matched/dflash-chain", "mismatched/dflash-chain", "eagle3/chain"):
        if name in sources:
            tokens = [sources[name].expected_tokens(w) for w in range(8)]
            assert tokens == sorted(tokens) and tokens[0] == 1.0, (name, tokens)
    # at its recorded width a request runs its recorded steps
    recorded = sources["matched/dflash-chain"].requests[0]
    assert sources["matched/dflash-chain"].steps_at(0, sum(1 + a for a in recorded), 7) == len(recorded)


def test_the_published_curve_is_drawn_at_its_rates_and_the_same_for_every_width(replay):
    curve = replay.Curve("k", replay.K25_ON_K26, seed=3)
    depths = [curve.accepted(r, k, 7) for r in range(8) for k in range(500)]
    for d, reach in enumerate(replay.K25_ON_K26[:4], start=1):
        assert sum(x >= d for x in depths) / len(depths) == pytest.approx(reach, abs=0.02)
    assert all(curve.accepted(r, k, 2) == min(curve.accepted(r, k, 7), 2) for r in range(3) for k in range(50))
    assert curve.expected_tokens(7) == pytest.approx(1 + sum(replay.K25_ON_K26), rel=0.03)


def test_the_recorded_traces_are_the_committed_data(replay, sources):
    data = json.loads(replay.TRACES.read_text())
    assert data["format"] == "sglang-kimi-acceptance-traces/1"
    chain = sources["matched/dflash-chain"]
    assert chain.family == "chain" and chain.widths == tuple(range(8)) and len(chain.requests) >= 16
    # the matched drafter accepts more than the mismatched one, at every width
    if "mismatched/dflash-chain" in sources:
        weak = sources["mismatched/dflash-chain"]
        assert all(chain.expected_tokens(w) > weak.expected_tokens(w) for w in (1, 3, 7))
    # greedy and lossless: every configuration served each prompt the same tokens
    digests = [t["output_digests"] for t in data["traces"].values()]
    for i in range(len(digests[0])):
        assert len({d[i] for d in digests if d[i] is not None}) == 1, f"prompt {i} differs between configurations"


def test_cost_tables_interpolate_and_never_fall_beyond_their_last_cell(replay):
    table = replay.StepTimes("t", "d", {1: {0: 1.0, 4: 3.0}, 9: {0: 2.0, 4: 10.0}}, "chain")
    assert table(1, 2) == pytest.approx(2.0) and table(5, 0) == pytest.approx(1.5) and table(5, 4) == 6.5
    assert table(1, 8) == pytest.approx(5.0)  # beyond the widest width: along the last two
    falling = replay.StepTimes("f", "d", {1: {0: 1.0, 4: 3.0}, 2: {0: 1.0, 4: 2.0}}, "chain")
    assert falling(3, 4) == pytest.approx(2.0) and falling.largest_batch() == 2  # a falling slope is not extended
    with pytest.raises(ValueError, match="finite and > 0"):
        replay.StepTimes("bad", "d", {1: {0: 0.0}}, "chain")
    with pytest.raises(ValueError, match="mode"):
        replay.StepTimes("bad", "d", {1: {0: 1.0}}, "beam")


def test_cost_files_in_both_formats(replay, tmp_path):
    from sglang_kimi.speculative.adaptive.profile import StepCosts, write_step_costs

    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"device": "X", "modes": ["tree"], "seconds": {"1": {"0": 0.01, "8": 0.02}}}))
    (table,) = replay.load_costs(plain)
    assert (table.name, table.mode, table.noise, table(1, 4)) == ("plain", "tree", "gpu", pytest.approx(0.015))
    measured = tmp_path / "h200.step_costs.json"
    seconds = {"chain": {1: {0: 0.002, 7: 0.005}}, "eagle3-chain": {1: {0: 0.002, 3: 0.004}}}
    write_step_costs(measured, StepCosts("cuda:NVIDIA H200", 8, {}, seconds, source="a bench"))
    tables = {t.mode: t for t in replay.load_costs(measured)}
    assert set(tables) == {"chain", "eagle3-chain"} and tables["chain"].name == "h200"
    assert tables["chain"](1, 7) == 0.005 and tables["chain"].noise == "gpu"
    for text, words in (("[1, 2]", "not a cost table"), ('{"seconds": {"1": {"0": 1}}, "modes": ["x"]}', "modes")):
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=words):
            replay.load_costs(bad)


def test_the_tables_derived_from_the_measurements(replay, h200):
    cpu = {t.mode: t for t in replay.costs_from_bench_adaptive()}
    assert set(cpu) == {"chain", "tree", "eagle3-chain"}
    assert set(cpu["tree"].seconds) == {1, 2, 4, 8, 16} and set(cpu["tree"].seconds[1]) == {0, 2, 7, 8, 16, 32}
    data = json.loads((replay.RESULTS / "bench_adaptive.json").read_text())["results"]["drafters"]
    none = [next(lv for lv in g["none"] if lv["concurrency"] == 1)["output_throughput"] for g in data.values()]
    assert cpu["chain"](1, 0) == pytest.approx(1 / math.sqrt(none[0] * none[1]))  # c / tok/s, groups averaged
    assert set(h200["chain"].seconds) == {1, 8, 32} and set(h200["chain"].seconds[1]) == {0, 7}
    assert h200["chain"](1, 7) > h200["chain"](1, 0) and h200["tree"].widest() == 8


def test_noise_has_mean_one_and_is_the_same_for_every_contender(replay):
    for noise in replay.NOISE.values():
        a, b = replay.NoiseStream(noise, 1, 0.01), replay.NoiseStream(noise, 1, 0.01)
        factors = [a.factor(k, 0.01 * k) for k in range(20000)]
        assert factors == [b.factor(k, 0.01 * k) for k in range(20000)]
        assert sum(factors) / len(factors) == pytest.approx(1.0, abs=3 * noise.drift / 3 + 0.01)
    quiet, loud = (replay.NoiseStream(replay.NOISE[n], 2, 0.01) for n in ("gpu", "cpu"))
    spread = [max(s.factor(k, 0.01 * k) for k in range(2000)) for s in (quiet, loud)]
    assert spread[0] < 1.2 < spread[1]


def test_the_static_fast_path_is_the_step_by_step_replay(replay, sources, h200):
    source, costs = sources["matched/dflash-chain"], h200["chain"]

    def noise():
        return replay.NoiseStream(replay.NOISE["cpu"], 1, 1e-3)

    for traffic in (replay.constant(4, 80, 3), replay.burst(60, 8), replay.mix(64, 1, 4)):
        for width in (0, 2, 7):
            walked = replay.replay(replay.Static(width), source, costs, noise(), traffic)
            fast = replay.replay_static(width, source, costs, noise(), traffic)
            assert (walked["steps"], walked["tokens"]) == (fast["steps"], fast["tokens"])
            assert walked["seconds"] == pytest.approx(fast["seconds"], rel=1e-12)


def test_the_replay_is_deterministic_under_its_seed(replay, sources, h200):
    scenario = replay.Scenario(sources["matched/dflash-chain"], h200["chain"], replay.NOISE["gpu"], tuple(range(8)))
    runs = [json.dumps(replay.run_scenario(scenario, short(replay), seed=5)) for _ in range(2)]
    assert runs[0] == runs[1]
    other = json.dumps(replay.run_scenario(scenario, short(replay), seed=6))
    assert other != runs[0]


def test_the_policy_meets_the_oracle_and_a_policy_that_never_moves_does_not(replay, sources, h200):
    """Where the cost bends (the H200: a chain of 7 pays at batch 1, costs 6x a plain step at batch 8), the served
    policy stays within the target of the oracle; a policy whose hysteresis never lets it leave the widest width is
    caught by the same judgement."""
    scenario = replay.Scenario(sources["matched/dflash-chain"], h200["chain"], replay.NOISE["gpu"], tuple(range(8)))
    configs = {"policy": {}, "stuck": {"hysteresis": 0.99, "explore_every": 10**6}}
    result = replay.run_scenario(scenario, short(replay, levels=(1, 8), per_client=6), seed=1, configs=configs)
    good, stuck = replay.analyse(result), replay.analyse(result, policy="stuck")
    assert min(good["vs_oracle"].values()) >= 0.97, good["vs_oracle"]
    assert good["targets"][">= 0.97x oracle in every column"]
    assert stuck["vs_oracle"]["c=8"] < 0.95 and not stuck["targets"][">= 0.97x oracle in every column"]
    assert result["oracle_widths"]["1"] > result["oracle_widths"]["8"]  # the cost bends: a narrower width at 8


def test_sglangs_controller_runs_in_the_replay_as_its_worker_drives_it(replay, sources):
    """SGLang's own AdaptiveController and AdaptiveSpeculativeParams, default config: it starts at 3 steps and
    follows the accept length's EMA per batch slot, 0 steps at 64 and more."""
    sglang = replay.SGLangAdaptive()
    assert sglang.choose(1) == 3 and sglang.choose(64) == 0
    for _ in range(40):
        sglang.observe(1, sglang.choose(1), [7], 0.01)
    assert sglang.choose(1) == 7  # every draft accepted: its EMA climbs to the widest candidate
    table = replay.StepTimes("t", "d", {1: {0: 0.01, 7: 0.02}, 64: {0: 0.05, 7: 0.3}}, "eagle3-chain")
    noise = replay.NoiseStream(replay.NOISE["gpu"], 1, 0.01)
    out = replay.replay(replay.SGLangAdaptive(), sources["eagle3/chain"], table, noise, replay.constant(64, 32, 1))
    assert set(out["widths"]) <= {"0", "1", "3", "5", "7"} and out["widths"].get("0", 0) >= out["steps"] - 1
