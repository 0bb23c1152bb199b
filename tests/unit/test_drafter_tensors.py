"""Drafter checkpoint tensors: the published names of each format, the spellings SGLang's loaders accept, and the
start-up check that refuses a checkpoint lacking a tensor (SGLang would serve it uninitialized), holding no weights,
or with an unreadable file."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from support.drafter_models import EAGLE3_GQA, EAGLE3_MLA, scaled_dflash, scaled_eagle3

from sglang_kimi.assets import ASSETS_DIR
from sglang_kimi.speculators.configs import DFlashConfig, Eagle3Config, parse_drafter_config
from sglang_kimi.speculators.drafter_tensors import (
    DrafterCheckpointError,
    canonical_name,
    check_checkpoint,
    name_problems,
    published_weight_names,
)

DRAFTERS = ["tiny-kimi-k2.6-dflash", "tiny-kimi-k2.5-dflash", "tiny-kimi-k2.6-eagle3"]


def _copy(name, tmp_path):
    folder = tmp_path / name
    shutil.copytree(ASSETS_DIR / name, folder)
    return folder, parse_drafter_config(folder)


def _rewrite(folder, edit):
    path = folder / "model.safetensors"
    tensors = edit(load_file(path))
    save_file(tensors, path)


@pytest.mark.parametrize("name", DRAFTERS)
def test_shipped_drafters_pass(name, tmp_path):
    folder, config = _copy(name, tmp_path)
    assert sorted(load_file(folder / "model.safetensors")) == published_weight_names(config)
    assert check_checkpoint(folder, config) == []


@pytest.mark.parametrize("name", DRAFTERS)
def test_a_missing_tensor_is_named(name, tmp_path):
    folder, config = _copy(name, tmp_path)
    dropped = published_weight_names(config)[3]
    _rewrite(folder, lambda t: {k: v for k, v in t.items() if k != dropped})
    with pytest.raises(DrafterCheckpointError, match=rf"lack 1 of the \d+ tensors .*: {dropped}\. .*uninitialized"):
        check_checkpoint(folder, config)


def test_names_under_an_unknown_prefix_are_all_missing(tmp_path):
    folder, config = _copy("tiny-kimi-k2.6-dflash", tmp_path)
    _rewrite(folder, lambda t: {f"transformer.{k}": v for k, v in t.items()})
    with pytest.raises(DrafterCheckpointError, match=r"lack 25 of the 25 .* and 17 more \(it has transformer\."):
        check_checkpoint(folder, config)


def test_extra_tensors_are_warned_not_refused(tmp_path):
    folder, config = _copy("tiny-kimi-k2.6-dflash", tmp_path)
    _rewrite(folder, lambda t: {**t, "rotary_emb.inv_freq": torch.ones(4)})
    (warning,) = check_checkpoint(folder, config)
    assert "rotary_emb.inv_freq" in warning and "does not read" in warning


def test_no_weights_and_unreadable_files_are_refused(tmp_path):
    folder, config = _copy("tiny-kimi-k2.6-dflash", tmp_path)
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(DrafterCheckpointError, match="model.safetensors is not a readable safetensors file"):
        check_checkpoint(folder, config)
    (folder / "model.safetensors").unlink()
    with pytest.raises(DrafterCheckpointError, match="holds no weights"):
        check_checkpoint(folder, config)
    (folder / "pytorch_model.bin").write_bytes(b"")  # a .bin checkpoint: SGLang's loader reads it, names unchecked
    (warning,) = check_checkpoint(folder, config)
    assert "no safetensors file" in warning


def test_sharded_checkpoints_follow_their_index(tmp_path):
    folder, config = _copy("tiny-kimi-k2.6-dflash", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:10], "model-00002-of-00002.safetensors": names[10:]}
    for file, part in shards.items():
        save_file({k: tensors[k] for k in part}, folder / file)
    index = {"weight_map": {k: file for file, part in shards.items() for k in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert check_checkpoint(folder, config) == []
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(DrafterCheckpointError, match="model-00002-of-00002.safetensors listed in .* absent"):
        check_checkpoint(folder, config)
    (folder / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(DrafterCheckpointError, match="not a safetensors index"):
        check_checkpoint(folder, config)


def test_spellings_each_loader_reads():
    dflash = DFlashConfig.from_dict(scaled_dflash())
    assert canonical_name(dflash, "model.layers.0.mlp.up_proj.weight") == "layers.0.mlp.up_proj.weight"
    gqa = Eagle3Config.from_dict(scaled_eagle3(EAGLE3_GQA))
    # LlamaForCausalLMEagle3: model. optional, midlayer / layers.0, but lm_head only at the top level
    assert canonical_name(gqa, "model.layers.0.mlp.up_proj.weight") == "midlayer.mlp.up_proj.weight"
    assert canonical_name(gqa, "model.fc.weight") == "fc.weight"
    assert canonical_name(gqa, "model.lm_head.weight") == "model.lm_head.weight"
    assert canonical_name(gqa, "model.d2t") == "d2t"
    # Eagle3DeepseekV2ForCausalLM prefixes every name but lm_head with model. itself
    mla = Eagle3Config.from_dict(scaled_eagle3(EAGLE3_MLA))
    assert canonical_name(mla, "layers.0.self_attn.kv_b_proj.weight") == "midlayer.self_attn.kv_b_proj.weight"
    assert canonical_name(mla, "model.fc.weight") == "model.fc.weight"


def test_optional_eagle3_names():
    reduced = Eagle3Config.from_dict(scaled_eagle3(EAGLE3_GQA, draft_vocab=24))
    names = published_weight_names(reduced)
    without_maps = [n for n in names if n not in ("d2t", "t2d")]
    assert name_problems(reduced, without_maps) == (["d2t", "t2d"], [])  # a reduced vocab needs its map
    full = Eagle3Config.from_dict(scaled_eagle3(EAGLE3_GQA, draft_vocab=32))
    assert name_problems(full, without_maps + ["embed_tokens.weight"]) == ([], [])
    config = scaled_eagle3(EAGLE3_GQA, draft_vocab=32)
    del config["draft_vocab_size"]  # SGLang then loads the head from the target
    from_target = Eagle3Config.from_dict(config)
    assert from_target.lm_head_from_target
    assert name_problems(from_target, [n for n in without_maps if n != "lm_head.weight"]) == ([], [])
    assert name_problems(full, [n for n in without_maps if n != "lm_head.weight"]) == (["lm_head.weight"], [])


def test_quantized_checkpoints_store_a_weight_as_its_module_s_tensors():
    config = scaled_dflash(quantization_config={"quant_method": "compressed-tensors"})
    quantized = DFlashConfig.from_dict(config)
    packed = []
    for name in published_weight_names(quantized):
        if name.endswith("_proj.weight") or name == "fc.weight":
            packed += [name.replace(".weight", ".weight_packed"), name.replace(".weight", ".weight_scale")]
        else:
            packed.append(name)
    assert name_problems(quantized, packed) == ([], [])
    without = [n for n in packed if not n.startswith("layers.1.mlp.up_proj.")]
    assert name_problems(quantized, without) == (["layers.1.mlp.up_proj.weight"], [])
    plain = DFlashConfig.from_dict(scaled_dflash())  # not quantized: the packed names are not the published ones
    missing, unexpected = name_problems(plain, packed)
    assert "fc.weight" in missing and "fc.weight_packed" in unexpected


def test_an_eagle3_drafter_narrower_than_its_target_needs_its_own_embedding():
    """SGLang's set_embed keeps the drafter's embed_tokens when target_hidden_size differs from hidden_size."""
    narrow = Eagle3Config.from_dict(scaled_eagle3(EAGLE3_GQA, draft_vocab=32, target_hidden_size=24))
    names = [n for n in published_weight_names(narrow) if n not in ("d2t", "t2d")]
    assert name_problems(narrow, names) == (["embed_tokens.weight"], [])
    assert name_problems(narrow, [*names, "model.embed_tokens.weight"]) == ([], [])
    same = Eagle3Config.from_dict(scaled_eagle3(EAGLE3_GQA, draft_vocab=32, target_hidden_size=16))
    assert name_problems(same, names) == ([], [])
