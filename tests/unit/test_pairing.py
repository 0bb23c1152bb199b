"""validate_pair: the published Kimi pairs pass; every mismatch is one clear DrafterMismatchError naming the
drafter's value, the target's (or requested) value and the fix; unparseable drafter configs raise
DrafterConfigError. Config-only: nothing here loads weights."""

from __future__ import annotations

import copy
import json

import pytest
from support.drafter_models import (
    EAGLE3_GQA,
    EAGLE3_MLA,
    EAGLE31_MLA,
    KIMI_TARGET,
    NVIDIA_EAGLE3,
    ZLAB_DFLASH,
    fixture,
)

from sglang_kimi.assets import TINY_DFLASH, TINY_EAGLE3
from sglang_kimi.speculators.configs import DFlashConfig, DrafterConfigError, Eagle3Config, drafter_algorithm
from sglang_kimi.speculators.pairing import DrafterMismatchError, TargetInfo, validate_pair

EAGLE3_FIXTURES = [EAGLE3_GQA, EAGLE3_MLA, EAGLE31_MLA, NVIDIA_EAGLE3]


def kimi() -> dict:
    return fixture(KIMI_TARGET)


def mismatch(target, draft, **kwargs) -> DrafterMismatchError:
    with pytest.raises(DrafterMismatchError) as info:
        validate_pair(target, draft, **kwargs)
    return info.value


def only_problem(err: DrafterMismatchError):
    assert len(err.problems) == 1, str(err)
    return err.problems[0]


# ----------------------------------------------------------------------------------------------------------------
# the published pairs
# ----------------------------------------------------------------------------------------------------------------


def test_published_dflash_pair_passes():
    cfg = validate_pair(kimi(), fixture(ZLAB_DFLASH), num_draft_tokens=8, expected_algorithm="DFLASH")
    assert isinstance(cfg, DFlashConfig)
    assert cfg.resolve_target_layer_ids(61) == [1, 12, 24, 35, 47, 58]


@pytest.mark.parametrize("name", EAGLE3_FIXTURES)
def test_published_eagle3_pairs_pass(name):
    cfg = validate_pair(kimi(), fixture(name), num_draft_tokens=4, expected_algorithm="EAGLE3")
    assert isinstance(cfg, Eagle3Config)
    assert cfg.resolve_target_layer_ids(61) == [1, 29, 57]


def test_target_forms(tmp_path):
    """Kimi wrapper dict, plain DeepSeek-V3 dict, HF config objects, a folder and a config.json path."""
    from transformers import DeepseekV3Config, PretrainedConfig

    text = kimi()["text_config"]
    expected = TargetInfo(163840, 7168, 61, ("KimiK25ForConditionalGeneration",))
    assert TargetInfo.from_config(kimi()) == expected
    assert TargetInfo.from_config(text) == TargetInfo(163840, 7168, 61, ("DeepseekV3ForCausalLM",))
    hf_text = DeepseekV3Config(**{k: v for k, v in text.items() if k not in ("model_type", "torch_dtype")})
    wrapper = PretrainedConfig(text_config=hf_text)
    (tmp_path / "config.json").write_text(json.dumps(kimi()))
    for form in (text, hf_text, wrapper, tmp_path, tmp_path / "config.json", str(tmp_path)):
        info = TargetInfo.from_config(form)
        assert (info.vocab_size, info.hidden_size, info.num_hidden_layers) == (163840, 7168, 61), form
        validate_pair(form, fixture(ZLAB_DFLASH))


def test_draft_forms(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(fixture(ZLAB_DFLASH)))
    assert isinstance(validate_pair(kimi(), tmp_path), DFlashConfig)
    assert isinstance(validate_pair(kimi(), DFlashConfig.from_dict(fixture(ZLAB_DFLASH))), DFlashConfig)
    assert drafter_algorithm(fixture(EAGLE3_MLA)) == "EAGLE3"


def test_embedded_tiny_drafters_fit_the_tiny_target():
    from sglang_kimi.models import tiny

    validate_pair(tiny.TINY_MODEL, TINY_DFLASH, num_draft_tokens=8, expected_algorithm="DFLASH")
    validate_pair(tiny.TINY_MODEL, TINY_EAGLE3, expected_algorithm="EAGLE3")
    with pytest.raises(DrafterMismatchError):  # and the Kimi drafters do not
        validate_pair(tiny.TINY_MODEL, fixture(ZLAB_DFLASH))


# ----------------------------------------------------------------------------------------------------------------
# one error per mismatch, with both values and the fix
# ----------------------------------------------------------------------------------------------------------------


def test_vocab_mismatch():
    target = kimi()
    target["text_config"]["vocab_size"] = 170000
    p = only_problem(mismatch(target, fixture(ZLAB_DFLASH)))
    assert (p.field, p.draft, p.target) == ("vocab_size", 163840, 170000)
    assert (
        "vocab_size: drafter has 163840, target has 170000. Fix: use a DFLASH drafter trained for this target" in str(p)
    )
    p = only_problem(mismatch(target, fixture(EAGLE3_GQA)))
    assert "vocab_size: drafter has 163840, target has 170000" in str(p) and "EAGLE3 drafter trained" in p.fix


def test_hidden_mismatch():
    target = kimi()
    target["text_config"]["hidden_size"] = 4096
    err = mismatch(target, fixture(ZLAB_DFLASH))
    p = only_problem(err)
    assert str(p).startswith("hidden_size: drafter has 7168, target has 4096. Fix: DFlash embeds its block")
    assert "DFLASH drafter does not fit the target model" in str(err)
    p = only_problem(mismatch(target, fixture(EAGLE3_MLA)))
    assert p.field == "hidden_size" and (p.draft, p.target) == (7168, 4096)
    assert "3 x 4096 = 12288 inputs, the drafter expects 21504" in p.fix


def test_eagle3_target_hidden_size_field():
    draft = fixture(EAGLE3_GQA)
    draft["target_hidden_size"] = 5120
    p = only_problem(mismatch(kimi(), draft))
    assert p.field == "target_hidden_size" and (p.draft, p.target) == (5120, 7168)


def test_num_target_layers_mismatch():
    target = kimi()
    target["text_config"]["num_hidden_layers"] = 64
    p = only_problem(mismatch(target, fixture(ZLAB_DFLASH)))
    assert str(p) == (
        "num_target_layers: drafter has 61, target has num_hidden_layers 64. Fix: the drafter was trained on a "
        "61-layer target; use a DFlash drafter trained for this 64-layer target"
    )


def test_layer_ids_out_of_range():
    target = kimi()
    draft = fixture(ZLAB_DFLASH)
    draft["dflash_config"]["target_layer_ids"] = [1, 12, 24, 35, 47, 60]  # 60 = the last layer: never captured
    p = only_problem(mismatch(target, draft))
    assert p.field == "dflash_config.target_layer_ids"
    assert "[1, 12, 24, 35, 47, 60] (out of range: [60])" in str(p)
    assert "num_hidden_layers 61 (capturable layer outputs 0..59" in str(p) and "Fix: use a drafter" in str(p)

    target["text_config"]["num_hidden_layers"] = 30  # a shallower target: EAGLE3 aux layers 29 and 57 don't exist
    p = only_problem(mismatch(target, fixture(EAGLE3_MLA)))
    assert p.field.startswith("eagle_config.eagle_aux_hidden_state_layer_ids")
    assert "(out of range: [29, 57])" in str(p) and "capturable layer outputs 0..28" in str(p)


def test_eagle3_default_capture_layers_follow_the_target():
    target = kimi()
    target["text_config"]["num_hidden_layers"] = 12
    cfg = validate_pair(target, fixture(EAGLE3_GQA))  # no aux ids: SGLang's [2, L//2, L-3]
    assert cfg.capture_points(12) == [2, 6, 9] and cfg.resolve_target_layer_ids(12) == [1, 5, 8]


def test_mask_token_outside_vocab():
    draft = fixture(ZLAB_DFLASH)
    draft["dflash_config"]["mask_token_id"] = 163840
    p = only_problem(mismatch(kimi(), draft))
    assert str(p).startswith(
        "dflash_config.mask_token_id: drafter has 163840, target has vocab_size 163840 (valid ids 0..163839). "
        "Fix: set dflash_config.mask_token_id to a token id inside the target vocabulary"
    )


def test_block_size_vs_num_draft_tokens():
    p = only_problem(mismatch(kimi(), fixture(ZLAB_DFLASH), num_draft_tokens=16))
    assert str(p) == (
        "block_size: drafter has 8, target has --speculative-num-draft-tokens 16 requested. Fix: pass "
        "--speculative-num-draft-tokens 8 or less: the drafter was trained on blocks of 8 (root + 7 drafts) and "
        "has never predicted further positions"
    )
    p = only_problem(mismatch(kimi(), fixture(ZLAB_DFLASH), num_draft_tokens=1))
    assert "between 2 and 8" in p.fix
    # set through SGLang's --speculative-dflash-block-size: the error names that flag
    p = only_problem(
        mismatch(kimi(), fixture(ZLAB_DFLASH), num_draft_tokens=16, draft_tokens_flag="--speculative-dflash-block-size")
    )
    assert p.fix.startswith("pass --speculative-dflash-block-size 8 or less") and "num-draft-tokens" not in str(p)
    for n in (2, 4, 8):
        validate_pair(kimi(), fixture(ZLAB_DFLASH), num_draft_tokens=n)


def test_algorithm_swaps():
    err = mismatch(kimi(), fixture(EAGLE3_GQA), expected_algorithm="DFLASH")
    p = only_problem(err)
    assert str(p) == (
        "speculative algorithm: drafter has EAGLE3 (architectures ['LlamaForCausalLMEagle3']), target "
        "has --speculative-algorithm DFLASH. Fix: pass --speculative-algorithm EAGLE3, or point "
        "--speculative-draft-model-path at a DFLASH drafter (architectures ['DFlashDraftModel', 'DFlash2DraftModel', "
        "'DFlash2BeamDraftModel', 'MiniMaxDFlash2DraftModel'], e.g. z-lab/Kimi-K2.5-DFlash)"
    )
    p = only_problem(mismatch(kimi(), fixture(ZLAB_DFLASH), expected_algorithm="EAGLE3"))
    assert "drafter has DFLASH (architectures ['DFlashDraftModel'])" in str(p)
    assert "target has --speculative-algorithm EAGLE3." in str(p)
    assert "pass --speculative-algorithm DFLASH, or point --speculative-draft-model-path at an EAGLE3 drafter" in p.fix
    assert "lightseekorg/kimi-k2.5-eagle3" in p.fix
    p = only_problem(mismatch(kimi(), fixture(EAGLE3_MLA), expected_algorithm="eagle"))
    assert "pass --speculative-algorithm EAGLE3" in p.fix


def test_draft_vocab_larger_than_vocab():
    draft = fixture(EAGLE3_GQA)
    draft["draft_vocab_size"] = 200000
    p = only_problem(mismatch(kimi(), draft))
    assert (p.field, p.draft, p.target) == ("draft_vocab_size", 200000, "vocab_size 163840")


def test_every_mismatch_is_listed():
    target = kimi()
    target["text_config"].update(vocab_size=1000, hidden_size=256, num_hidden_layers=6)
    err = mismatch(target, fixture(ZLAB_DFLASH), num_draft_tokens=9)
    fields = [p.field for p in err.problems]
    assert fields == ["vocab_size", "hidden_size", "num_target_layers", "dflash_config.target_layer_ids",
                      "dflash_config.mask_token_id", "block_size"]  # fmt: skip
    assert str(err).count("\n  - ") == 6 and isinstance(err, ValueError)


# ----------------------------------------------------------------------------------------------------------------
# unparseable drafter configs
# ----------------------------------------------------------------------------------------------------------------


def test_unknown_architecture():
    draft = fixture(ZLAB_DFLASH)
    draft["architectures"] = ["Qwen3ForCausalLM"]
    with pytest.raises(DrafterConfigError, match=r"unknown drafter architectures \['Qwen3ForCausalLM'\]"):
        validate_pair(kimi(), draft)


def test_missing_or_invalid_fields():
    cases = [
        (lambda d: d.pop("intermediate_size"), "config has no 'intermediate_size'"),
        (lambda d: d["dflash_config"].pop("mask_token_id"), "dflash_config.mask_token_id is missing"),
        (lambda d: d["dflash_config"].update(mask_token_id="[UNK]"), "mask_token_id must be a non-negative integer"),
        (lambda d: d["dflash_config"].update(target_layer_ids=[]), "target_layer_ids must be a non-empty int list"),
        (lambda d: d.update(num_key_value_heads=7), "not a multiple of num_key_value_heads 7"),
        (lambda d: d.update(block_size=1), "block_size must be >= 2"),
        (lambda d: d.update(hidden_act="gelu"), "hidden_act 'gelu' is not supported"),
        (lambda d: d["rope_scaling"].update(rope_type="longrope"), "rope_scaling type 'longrope' is not supported"),
        (lambda d: d.update(num_target_layers=40), "name layers beyond num_target_layers 40"),
    ]
    for edit, message in cases:
        draft = copy.deepcopy(fixture(ZLAB_DFLASH))
        edit(draft)
        with pytest.raises(DrafterConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            validate_pair(kimi(), draft)


def test_missing_config_file(tmp_path):
    with pytest.raises(DrafterConfigError, match="no config.json"):
        validate_pair(kimi(), tmp_path)


def test_embedded_drafters_load_with_sglang_loaders():
    """SGLang's own config reader, parse_dflash_draft_config and model classes (DFlashDraftModel,
    LlamaForCausalLMEagle3) load the embedded drafters: every SGLang parameter receives a checkpoint tensor, the
    fused tensors, RoPE cache, context K/V and hot_token_id equal ours (scripts/_drafter_sglang_check.py)."""
    import subprocess
    import sys

    from support.paths import SCRIPTS

    script = SCRIPTS / "_drafter_sglang_check.py"
    run = subprocess.run(
        [sys.executable, str(script), str(TINY_DFLASH), str(TINY_EAGLE3)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert run.stdout.count('"ok": true') == 2
