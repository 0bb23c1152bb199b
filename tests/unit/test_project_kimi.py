"""``bench/project_kimi.py``: the roofline of one Kimi-K2.6 rank at TP 8 (bytes, FLOPs, collectives), the projection
with acceptance curves, the check against the seeds, measured tables scaled to the deployment (and a table of another
model refused), and the step costs it writes for the adaptive policy."""

from __future__ import annotations

import json

import pytest
from support.repo_scripts import load_script

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.models import kimi_shapes as ks
from sglang_kimi.speculative.adaptive.profile import fitting_step_costs, step_costs_table, write_step_costs

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": ks.KIMI_K26_TEXT}


@pytest.fixture(scope="module")
def pk():
    return load_script("bench/project_kimi.py")


def test_a_tp_rank_reads_its_share_of_kimi_and_ep_reads_the_same_expected_bytes(pk):
    fmt = pk.FORMATS["bf16"]
    full = pk.RankModel.from_text_config(ks.KIMI_K26_TEXT)
    rank = pk.deployment_model(8, ks.MOE_TP)
    ep = pk.deployment_model(8, ks.MOE_EP)
    # every expert read (a huge batch, no KV): a rank reads 1/8 of the experts' bytes
    big = 10**6

    def expert_bytes(m):
        return pk.target_forward(m, fmt, big, 1, 0, 0).bytes - dense_bytes(m, fmt)

    assert expert_bytes(rank) * 8 == pytest.approx(expert_bytes(full), rel=1e-9)
    # under either split a rank reads the same expected expert bytes
    for batch in (1, 8, 64):
        assert rank.distinct_experts(batch) * rank.moe_inter == pytest.approx(ep.distinct_experts(batch) * ep.moe_inter)
    assert rank.vocab * 8 == full.vocab and ep.router_experts == full.router_experts


def dense_bytes(m, fmt):
    """What a forward reads besides the routed experts (no KV: context and KV bytes 0)."""
    h = m.hidden
    return (
        m.layers * m.attention_params * fmt.linear_bytes
        + m.dense_layers * 3 * h * m.dense_inter * fmt.linear_bytes
        + m.moe_layers * (3 * h * m.shared_inter * fmt.linear_bytes + m.router_experts * h * 2)
        + m.vocab * h * fmt.head_bytes
    )


def test_int4_group_32_is_four_and_a_half_bits_per_expert_weight(pk):
    assert pk.FORMATS["int4"].expert_bytes * 8 == 4.5
    m = pk.deployment_model(8, ks.MOE_TP)
    int4 = pk.target_forward(m, pk.FORMATS["int4"], 1, 1, 0, 0).bytes
    bf16 = pk.target_forward(m, pk.FORMATS["bf16"], 1, 1, 0, 0).bytes
    experts = m.moe_layers * 8 * 3 * m.hidden * m.moe_inter
    assert bf16 - int4 == pytest.approx(experts * (2 - 0.5625), rel=1e-6)


def test_the_bound_grows_with_the_batch_and_the_window_and_saturates_with_the_experts(pk):
    device, setup = pk.DEVICES["H200"], pk.Setup()
    ar = [pk.step_time(pk.parse_mode("ar"), b, device, setup)["step_s"] for b in (1, 2, 8, 32, 64)]
    assert ar == sorted(ar)
    tree = pk.step_time(pk.parse_mode("tree-16"), 8, device, setup)
    chain = pk.step_time(pk.parse_mode("chain-1"), 8, device, setup)
    assert tree["target_s"] > chain["target_s"] > pk.step_time(pk.parse_mode("ar"), 8, device, setup)["target_s"]
    m = pk.deployment_model(8, ks.MOE_TP)
    assert m.distinct_experts(8 * 17) > 0.9 * m.held_experts  # 136 tokens read nearly every expert
    assert tree["comm_s"] > 0 and tree["target_bound"] == "memory"


def test_faster_memory_means_a_faster_bound(pk):
    setup, mode = pk.Setup(), pk.parse_mode("chain-3")
    times = {d: pk.step_time(mode, 8, pk.DEVICES[d], setup)["step_s"] for d in pk.DEVICES}
    assert times["MI355X"] < times["MI325X"] < times["MI300X"]
    assert times["MI300X"] < times["H200"]


def test_tokens_per_step_from_the_curves(pk):
    curves = pk.curves()
    seed = curves["seed-k25-on-k26"]
    assert seed.tokens_per_step(pk.parse_mode("ar")) == 1.0
    assert seed.tokens_per_step(pk.parse_mode("chain-1")) == pytest.approx(1.64)
    assert seed.tokens_per_step(pk.parse_mode("chain-5")) == pytest.approx(1 + 0.64 + 0.34 + 0.18 + 0.09 + 0.03)
    tiny = curves["tiny-matched"]
    assert tiny.tokens_per_step(pk.parse_mode("tree-16")) > tiny.tokens_per_step(pk.parse_mode("tree-8"))
    assert tiny.tokens_per_step(pk.parse_mode("chain-9")) is None  # beyond the recorded positions
    like = curves["tiny-mismatched"]
    assert pk.transfer_trees(like.chain, like) == pytest.approx(like.trees)  # its own chain: its own trees
    assert all(v < like.trees[n] for n, v in seed.trees.items()) == (sum(seed.chain[:7]) < sum(like.chain[:7]))


def test_the_seed_check_fits_one_overhead_to_the_autoregressive_number(pk):
    check = pk.check_seeds(pk.Setup(), pk.curves()["seed-k25-on-k26"])
    ar, chain8, chain32 = check["rows"]
    assert ar["fitted_tok_s_node"] == pytest.approx(ar["tok_s_node"])
    assert check["fitted_overhead_ms"] > 0  # the seeds' stack is slower than the bound
    for row in check["rows"]:
        assert row["roofline_over_measured"] > 1
    assert check["chain1_over_ar_at_8"]["measured"] == pytest.approx(127.1 / 90.4)


def _bench_result(tmp_path, config, rows):
    model = tmp_path / "target"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(config))
    server = {"model_path": str(model), "tp_size": 1, "dtype": "bfloat16", "device": "cuda:NVIDIA H200"}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"servers": {"ar": server}, "rows": rows, "device": "cuda:NVIDIA H200"}))
    return path


def test_a_measured_table_is_scaled_to_the_deployment(pk, tmp_path):
    rank = ks.rank_target_config(ks.RankShape(tp=8, layers=8))
    rows = [{"mode": "ar", "concurrency": 8, "steps": 40, "step_s": 0.010, "target_s": 0.006, "draft_s": 0.0,
             "rest_s": 0.004}]  # fmt: skip
    setup = pk.Setup()
    measured = pk.load_measured(_bench_result(tmp_path, rank, rows), setup)
    t = pk.step_time(pk.parse_mode("ar"), 8, pk.DEVICES["H200"], setup, measured)
    assert t["source"] == "measured" and t["rest_s"] == 0.004
    assert t["depth_ratio"] > 1  # 61 layers and INT4 experts against 8 layers in bf16 with the whole vocabulary
    assert t["target_s"] == pytest.approx(0.006 * t["depth_ratio"])
    assert t["step_s"] == pytest.approx(t["target_s"] + t["comm_s"] + 0.004)
    assert pk.step_time(pk.parse_mode("ar"), 16, pk.DEVICES["H200"], setup, measured) == {}  # not measured


def test_a_table_of_another_model_is_refused(pk, tmp_path):
    tiny = json.loads((TINY_MODEL / "config.json").read_text())
    path = _bench_result(tmp_path, tiny, [])
    with pytest.raises(pk.ProjectionError) as e:
        pk.load_measured(path, pk.Setup())
    message = str(e.value)
    assert "another model than one rank of Kimi-K2.6 at TP 8" in message
    assert "hidden_size 256 (measured) vs 7168" in message and "scripts/make_rank_shaped.py" in message
    ep = ks.rank_target_config(ks.RankShape(tp=8, moe=ks.MOE_EP, layers=8))
    with pytest.raises(pk.ProjectionError, match="routed_experts 48 .measured. vs 384"):
        pk.load_measured(_bench_result(tmp_path, ep, []), pk.Setup())


def test_projected_step_costs_start_a_kimi_deployment_and_not_another(pk, tmp_path):
    modes = [pk.parse_mode(m) for m in ("ar", "tree-8", "tree-16")]
    costs = pk.step_costs_for("H200", pk.Setup(), modes, [1, 8, 32])
    path = tmp_path / "h200.json"
    write_step_costs(path, costs)

    def fit(tp, device="cuda:NVIDIA H200", mode="tree"):
        return fitting_step_costs(path, model_config=KIMI, tp=tp, ep=1, moe_a2a_backend="none", mode=mode,
                                  device=device)  # fmt: skip

    table = step_costs_table(fit(8), "tree", [1, 4, 32], [0, 4, 8, 16])
    assert table[1][0] < table[1][8] < table[1][16]
    with pytest.raises(ValueError, match="TP 8 .table. vs 4"):
        fit(4)
    with pytest.raises(ValueError, match="device 'cuda:NVIDIA H200' .table. vs 'cuda:AMD Instinct MI300X'"):
        fit(8, device="cuda:AMD Instinct MI300X")


@pytest.mark.parametrize(
    ("args", "words"), [(["--tp", "3"], "TP 3 does not divide"), (["--devices", "B200"], "unknown device")]
)
def test_bad_settings_are_refused(pk, tmp_path, capsys, args, words):
    with pytest.raises(SystemExit) as e:
        pk.main(args + ["--out-dir", str(tmp_path)])
    assert e.value.code == 2 and words in capsys.readouterr().err
