"""One rank of Kimi-K2.6 at its real shapes (``sglang_kimi/models/kimi_shapes.py``, ``scripts/make_rank_shaped.py``):
the rank's share of every tensor, its drafters in the formats serving parses, the per-rank signature a cost table is
matched by, the expected expert union, and the settings it refuses."""

from __future__ import annotations

import json
import random

import pytest
from support.repo_scripts import load_script

from sglang_kimi.models import kimi_shapes as ks
from sglang_kimi.speculators.configs import DFlashConfig, Eagle3Config
from sglang_kimi.speculators.pairing import validate_pair

KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": ks.KIMI_K26_TEXT}


@pytest.mark.parametrize("tp", [1, 2, 4, 8, 16])
def test_a_tensor_parallel_rank_holds_its_share_of_every_sharded_tensor(tp):
    text = ks.rank_text_config(ks.RankShape(tp=tp, layers=61))
    full = ks.KIMI_K26_TEXT
    assert text["num_attention_heads"] * tp == full["num_attention_heads"]
    assert text["intermediate_size"] * tp == full["intermediate_size"]
    assert text["moe_intermediate_size"] * tp == full["moe_intermediate_size"]
    # replicated on every rank: the MLA down-projections, the router, the expert count, the vocabulary
    for key in ("hidden_size", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "n_routed_experts", "vocab_size"):
        assert text[key] == full[key], key


def test_an_expert_parallel_rank_holds_whole_experts_and_its_share_of_a_tokens_experts():
    text = ks.rank_text_config(ks.RankShape(tp=8, moe=ks.MOE_EP, layers=61))
    assert (text["n_routed_experts"], text["num_experts_per_tok"]) == (48, 1)
    assert text["moe_intermediate_size"] == ks.KIMI_K26_TEXT["moe_intermediate_size"]


def test_rank_shaped_model_and_kimi_at_its_tp_have_one_signature():
    """Served at TP 1, the rank-shaped model stands for Kimi-K2.6 at TP 8: same per-rank shape up to its depth and
    whole vocabulary, which the projection corrects for."""
    for moe, ep, replicated in ((ks.MOE_TP, 1, False), (ks.MOE_EP, 8, True)):
        rank = ks.rank_target_config(ks.RankShape(tp=8, moe=moe, layers=61))
        assert ks.represented_tp(rank, 1) == ks.represented_tp(KIMI, 8) == 8
        mine = ks.rank_signature(rank, 1)
        kimi = ks.rank_signature(KIMI, 8, ep, shared_replicated=replicated)
        differing = {k for k in mine if mine[k] != kimi[k]}
        assert differing == {"vocab_size"}, (moe, differing)
        assert mine["vocab_size"] == 8 * kimi["vocab_size"]


def test_expert_parallel_without_an_all_to_all_backend_shards_the_shared_expert():
    assert (
        ks.rank_signature(KIMI, 8, 8)["shared_intermediate"] * 8
        == ks.rank_signature(KIMI, 8, 8, True)["shared_intermediate"]
    )


@pytest.mark.parametrize("layers", [2, 5, 8, 12, 30, 61])
def test_drafters_parse_pair_with_the_target_and_read_distinct_layers(layers):
    shape = ks.RankShape(tp=8, layers=layers)
    target = ks.rank_target_config(shape)
    dflash = DFlashConfig.from_dict(ks.rank_dflash_config(shape))
    validate_pair(target, ks.rank_dflash_config(shape), expected_algorithm="DFLASH")
    ids = dflash.resolve_target_layer_ids()
    assert len(set(ids)) == len(ids) and 0 <= min(ids) and max(ids) <= layers - 2
    assert len(ids) == min(6, layers - 1)
    assert (dflash.num_attention_heads, dflash.num_key_value_heads, dflash.intermediate_size) == (8, 1, 2304)
    if layers < 5:
        with pytest.raises(ks.RankShapeError, match="at least 5 layers"):
            ks.rank_eagle3_config(shape)
        return
    eagle = Eagle3Config.from_dict(ks.rank_eagle3_config(shape))
    validate_pair(target, ks.rank_eagle3_config(shape), expected_algorithm="EAGLE3")
    assert eagle.aux_layer_ids[0] == 1 and len(set(eagle.aux_layer_ids)) == 3
    assert max(eagle.capture_points(layers)) <= layers - 1


def test_at_full_depth_the_drafters_read_the_published_layers():
    shape = ks.RankShape(tp=8, layers=61)
    assert ks.rank_dflash_config(shape)["dflash_config"]["target_layer_ids"] == list(
        ks.KIMI_K25_DFLASH["target_layer_ids"]
    )
    ids = ks.rank_eagle3_config(shape)["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert ids == list(ks.KIMI_K26_EAGLE3["aux_layer_ids"])


def test_scale_divides_the_widths_and_keeps_the_code_paths():
    full, small = ks.rank_text_config(ks.RankShape(layers=5)), ks.rank_text_config(ks.RankShape(layers=5, scale=28))
    assert small["hidden_size"] == full["hidden_size"] // 28 == 256
    assert small["n_routed_experts"] < full["n_routed_experts"] and small["num_experts_per_tok"] >= 1
    assert small["vocab_size"] == full["vocab_size"]  # the mask token and Kimi's specials stay
    for key in ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "moe_intermediate_size"):
        assert small[key] % 16 == 0 and small[key] < full[key], key


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tp": 3}, "TP 3 does not divide 64 attention heads"),
        ({"tp": 16, "moe": ks.MOE_EP}, "top-8 routing"),
        ({"tp": 128}, "attention heads"),
        ({"layers": 0}, "layers must be at least 1"),
        ({"scale": 0}, "scale must be at least 1"),
        ({"moe": "dp"}, "moe must be one of"),
    ],
)
def test_shapes_that_cannot_be_built_are_refused_naming_the_setting(kwargs, match):
    with pytest.raises(ks.RankShapeError, match=match):
        ks.RankShape(**kwargs)


def test_expected_distinct_experts_matches_random_routing():
    rng = random.Random(0)
    for experts, k, tokens in ((384, 8, 1), (384, 8, 72), (48, 1, 9), (14, 1, 40)):
        trials = [len({e for _ in range(tokens) for e in rng.sample(range(experts), k)}) for _ in range(400)]
        mean = sum(trials) / len(trials)
        assert ks.expected_distinct_experts(experts, k, tokens) == pytest.approx(mean, rel=0.03, abs=0.05)
    assert ks.expected_distinct_experts(384, 8, 1) == pytest.approx(8)
    assert ks.expected_distinct_experts(384, 8, 10**5) == pytest.approx(384)


def test_the_script_writes_three_servable_folders(tmp_path, capsys):
    script = load_script("scripts/make_rank_shaped.py")
    assert script.main(["--out", str(tmp_path), "--layers", "8", "--moe", "ep"]) == 0
    target = json.loads((tmp_path / "target" / "config.json").read_text())
    assert target["rank_shape"] == {"tp": 8, "moe": "ep", "layers": 8, "scale": 1, "source": ks.SOURCE}
    assert (tmp_path / "target" / "tokenizer.json").is_file()
    assert DFlashConfig.from_pretrained(tmp_path / "dflash").mask_token_id == ks.MASK_TOKEN_ID
    assert Eagle3Config.from_pretrained(tmp_path / "eagle3").attention == "mla"
    params = script.rank_parameters(target["text_config"])
    assert params["routed_experts"] == 7 * 48 * 3 * 7168 * 2048
    assert f"{sum(params.values()) / 1e9:.3f} B parameters" in capsys.readouterr().out


def test_the_script_writes_the_drafters_a_shallow_target_allows(tmp_path, capsys):
    script = load_script("scripts/make_rank_shaped.py")
    assert script.main(["--out", str(tmp_path), "--layers", "3"]) == 0
    assert (tmp_path / "dflash" / "config.json").is_file() and not (tmp_path / "eagle3").exists()
    assert "eagle3  not written: an EAGLE3 drafter reads 3 distinct target layers" in capsys.readouterr().out


def test_the_script_refuses_a_tp_that_does_not_divide_kimi(tmp_path, capsys):
    script = load_script("scripts/make_rank_shaped.py")
    with pytest.raises(SystemExit):
        script.main(["--out", str(tmp_path), "--tp", "6"])
    assert "TP 6 does not divide" in capsys.readouterr().err
    assert not (tmp_path / "target").exists()
