"""One rank of Kimi-K2.6 at TP 8, shrunk (``--scale 28``: hidden 256, 14 experts; 5 layers), served on CPU with random
weights in every mode the step-cost benchmark measures: autoregressive, SGLang's DFLASH chain, the plugin's DFLASH
tree and an EAGLE3 chain with the MLA drafter. ``bench/bench_step_cost.py`` starts, measures and stops one server
at a time (four side by side would hold ~10 GB while the other test lane runs its own), with the cost probe and
SGLang's simulated uniform routing; the projection reads its table, and so does the adaptive policy's start-up
profile. Timings are not asserted (the
benchmark reports them); what must hold is that every mode serves, the probe splits its steps and counts the experts
a random router reads, and the tables fit the setup they were measured on and no other."""

from __future__ import annotations

import json

import pytest
from support.repo_scripts import load_script

from sglang_kimi.models import kimi_shapes as ks
from sglang_kimi.speculative.adaptive.profile import StepCostsError, fitting_step_costs, read_step_costs

pytestmark = pytest.mark.e2e

MODES = {"ar": 1, "chain-2": 3, "tree-8": 9, "eagle3-2": 3}  # mode -> tokens per request in the target's forward
CONCURRENCY = (1, 2)
KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": ks.KIMI_K26_TEXT}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rank_shaped")
    model = out / "model"
    assert load_script("scripts/make_rank_shaped.py").main(["--out", str(model), "--layers", "5", "--scale", "28"]) == 0
    bench = load_script("bench/bench_step_cost.py")
    code = bench.main(
        ["--model", str(model / "target"), "--dflash", str(model / "dflash"), "--eagle3", str(model / "eagle3"),
         "--modes", ",".join(MODES), "--concurrency", ",".join(map(str, CONCURRENCY)), "--input-len", "12",
         "--output-len", "6", "--server-args", "--load-format dummy --context-length 2048 --max-total-tokens 16384",
         "--out-dir", str(out), "--name", "rank"]
    )  # fmt: skip
    assert code == 0
    return {"out": out, "model": model, "result": json.loads((out / "rank.json").read_text())}


def test_every_mode_serves_and_its_steps_are_split(run):
    rows = {(r["mode"], r["concurrency"]): r for r in run["result"]["rows"]}
    assert set(rows) == {(m, c) for m in MODES for c in CONCURRENCY}
    assert run["result"]["device"].startswith("cpu:")
    for (mode, batch), row in rows.items():
        assert row["output_tokens"] == 6 * batch, (mode, batch)  # every request answered in full
        assert row["steps"] >= 5 and row["step_s"] > 0 and row["target_s"] > 0, (mode, batch)
        # the probe's forwards all ran while the level's batch was served (step_s, a median over the window in which
        # every request decodes, can miss a slow first decode that the probe's mean includes)
        assert 0 < row["steps"] * (row["target_s"] + row["draft_s"]) <= row["wall_s"], (mode, batch)
        assert row["tokens_per_step"] < 1.2, (mode, batch)  # random drafts are (all but) never accepted
        if mode == "ar":
            assert row["draft_s"] == 0 and row["draft_forwards_per_step"] == 0
        else:
            assert row["draft_s"] > 0, (mode, batch)
        # an EAGLE3 step of 2 drafts: one draft forward and the extend over the window
        assert row["draft_forwards_per_step"] == pytest.approx({"ar": 0, "eagle3-2": 2}.get(mode, 1)), (mode, batch)


def test_each_verify_reads_the_experts_random_routing_reads(run):
    for row in run["result"]["rows"]:
        e = row["experts"]
        tokens = MODES[row["mode"]] * row["concurrency"]
        assert (e["rows"], e["mean_tokens"]) == (tokens, tokens), row["mode"]
        assert (e["routed_experts"], e["top_k"]) == (14, 1)
        # one router call per MoE layer per verify step; a step that ran before every request joined (the requests
        # start together, the scheduler may take them a step apart) verifies fewer rows
        window = MODES[row["mode"]]
        by_rows = {int(k): cell["calls"] for k, cell in row["probe"]["experts"]["by_rows"].items()}
        verify_calls = sum(by_rows.get(window * b, 0) for b in range(1, row["concurrency"] + 1))
        assert verify_calls == 4 * row["steps"] and 0 < e["calls"] <= verify_calls, (row["mode"], by_rows)
        # SGLang's simulated routing: random weights alone would route every token to one expert
        assert e["mean_distinct"] == pytest.approx(e["expected_random"], abs=1.0), row


def test_the_table_fits_its_own_setup_and_no_other(run):
    path = run["out"] / "rank.step_costs.json"
    costs = read_step_costs(path)
    assert set(costs.seconds) == {"chain", "tree", "eagle3-chain"}
    for family, width in (("chain", 2), ("tree", 8), ("eagle3-chain", 2)):
        assert set(costs.seconds[family]) == set(CONCURRENCY)
        assert all(set(row) == {0, width} for row in costs.seconds[family].values())  # width 0: the ar server
    target = json.loads((run["model"] / "target" / "config.json").read_text())

    def fit(config, tp, mode="tree", device=costs.device):
        return fitting_step_costs(path, model_config=config, tp=tp, ep=1, moe_a2a_backend="none", mode=mode,
                                  device=device)  # fmt: skip

    assert fit(target, 1).device == run["result"]["device"]
    with pytest.raises(StepCostsError, match="shape hidden_size: 256 .file. vs 7168"):
        fit(KIMI, 8)


def test_the_projection_reads_the_measured_table(run, capsys):
    pk = load_script("bench/project_kimi.py")
    out = run["out"]
    common = ["--measured", str(out / "rank.json"), "--devices", "H200", "--concurrency", "1,2", "--modes",
              ",".join(MODES), "--out-dir", str(out)]  # fmt: skip
    assert pk.main(common + ["--scale", "28", "--name", "projected", "--step-costs", str(out / "proj.json")]) == 0
    projected = json.loads((out / "projected.json").read_text())
    measured_rows = [r for r in projected["rows"] if r["source"] == "measured"]
    assert {r["mode"] for r in measured_rows} >= {"ar", "chain-2", "tree-8", "eagle3-2"}
    for r in measured_rows:  # the JSON keeps five significant digits of each number: 1e-4 relative for a product
        assert r["depth_ratio"] > 0
        assert r["tok_s_node"] == pytest.approx(r["concurrency"] * r["tok_s_user"], rel=1e-4)
    assert set(read_step_costs(out / "proj.json").seconds) == {"chain", "tree", "eagle3-chain"}
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # the measured CPU twin is not a rank of Kimi-K2.6 at its real widths
        pk.main(common + ["--name", "refused"])
    assert e.value.code == 2 and "another model than one rank of Kimi-K2.6" in capsys.readouterr().err
