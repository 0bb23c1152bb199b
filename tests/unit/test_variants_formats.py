"""INT4 compressed-tensors and MXFP4 Quark layouts: packing against the reference implementations, the tiny model
written in each layout exactly as the real checkpoints are, and the dequantized reference."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from support.quant_formats import quantized_modules

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.launcher.server import sglang_env
from sglang_kimi.models.quant import formats as F

# ---------------------------------------------------------------------------------------------------------------
# INT4: compressed-tensors is the reference (pack_to_int32 / PackedQuantizationCompressor)


def test_int4_packing_is_compressed_tensors_pack_to_int32():
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    q = torch.randint(-8, 8, (24, 64), dtype=torch.int8)
    packed = F.pack_int4(q)  # [24, 8] int32
    assert packed.dtype == torch.int32 and packed.shape == (24, 8)
    assert torch.equal(packed, pack_to_int32(q, 4))
    assert torch.equal(F.unpack_int4(packed), q)
    assert torch.equal(unpack_from_int32(packed, 4, q.shape), q)


def test_int4_word_layout_by_hand():
    # one word holds inputs 0..7, input j in bits 4j..4j+3, stored as value + 8
    q = torch.tensor([[-8, -7, 0, 1, 2, 3, 6, 7]], dtype=torch.int8)
    nibbles = [v + 8 for v in q[0].tolist()]  # [0, 1, 8, 9, 10, 11, 14, 15]
    word = sum(n << (4 * j) for j, n in enumerate(nibbles))
    assert F.pack_int4(q).item() == word - 2**32  # 0xFEBA9810 as a signed int32


def test_int4_dequantization_is_compressed_tensors_decompress():
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig

    scheme = QuantizationConfig.model_validate(F.int4_quantization_config()).config_groups["group_0"]
    w = torch.randn(32, 128)
    q, scale = F.quantize_int4(w)
    sd = {"weight_packed": F.pack_int4(q), "weight_scale": scale, "weight_shape": torch.tensor([32, 128])}
    theirs = PackedQuantizationCompressor.decompress(sd, scheme)["weight"]  # bf16 (the scale's dtype)
    ours = F.dequantize_int4(sd["weight_packed"], scale, sd["weight_shape"])  # float32
    assert torch.equal(ours.to(theirs.dtype), theirs)
    # compressing our dequantized weights with compressed-tensors gives back the same packed words
    again = PackedQuantizationCompressor.compress({"weight": ours, "weight_scale": scale}, scheme)
    assert torch.equal(again["weight_packed"], sd["weight_packed"])
    assert again["weight_shape"].tolist() == [32, 128] and again["weight_shape"].dtype == torch.int64


def test_int4_config_is_kimi_k26s_and_validates_with_compressed_tensors():
    from compressed_tensors.quantization import QuantizationConfig

    block = F.int4_quantization_config()
    parsed = QuantizationConfig.model_validate(block)
    weights = parsed.config_groups["group_0"].weights
    assert (weights.num_bits, weights.type, weights.symmetric, weights.strategy, weights.group_size) == (
        4,
        "int",
        True,
        "group",
        32,
    )
    assert parsed.format == "pack-quantized" and parsed.quant_method == "compressed-tensors"
    assert parsed.config_groups["group_0"].targets == ["Linear"]
    assert block["ignore"] == list(F.KIMI_K26_INT4_IGNORE)


# ---------------------------------------------------------------------------------------------------------------
# MXFP4: E2M1 codes and E8M0 scales


def test_e2m1_codes_and_fp4_packing_by_hand():
    # byte 0x21: low nibble (input 0) code 1 = 0.5, high nibble (input 1) code 2 = 1.0
    # byte 0xF8: code 8 = -0.0, code 15 = -6.0
    values = F.e2m1_decode(F.unpack_fp4(torch.tensor([[0x21, 0xF8]], dtype=torch.uint8)))
    assert values.tolist() == [[0.5, 1.0, -0.0, -6.0]]
    codes = F.e2m1_encode(torch.tensor([0.5, 1.0, -0.1, -6.0, 7.0, 2.6]))
    assert codes.tolist() == [1, 2, 8, 15, 7, 5]  # -0.1 rounds to -0, 7 saturates to 6, 2.6 -> 3
    assert F.pack_fp4(codes[:4].view(1, 4)).tolist() == [[0x21, 0xF8]]


def test_mxfp4_round_trip_error_is_within_one_step():
    torch.manual_seed(0)
    w = torch.randn(64, 256) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different magnitude
    packed, scale = F.quantize_mxfp4(w)
    assert packed.shape == (64, 128) and packed.dtype == torch.uint8
    assert scale.shape == (64, 8) and scale.dtype == torch.uint8
    back = F.dequantize_mxfp4(packed, scale)
    step = torch.exp2(scale.float() - 127).repeat_interleave(32, dim=1)  # 1 ulp of E2M1 at magnitude 1
    assert ((back - w).abs() <= step + 1e-12).all()  # E2M1 spacing is at most 2 ulp (between 4 and 6)
    # the group maximum never clips: it maps to <= 6
    assert (w.view(64, 8, 32).abs().amax(-1) <= 6 * torch.exp2(scale.float() - 127)).all()
    # requantizing the dequantized weights is lossless (the bytes may differ: -0 vs +0, 3 * 2^e vs 6 * 2^(e-1))
    assert torch.equal(F.dequantize_mxfp4(*F.quantize_mxfp4(back)), back)


SGLANG_MXFP4_CHECK = """
import torch
from sglang_kimi.models.quant import formats as F
from sglang.srt.layers.quantization.mxfp4_tensor import MXFP4QuantizeUtil
from sglang.srt.layers.quantization.quark.schemes.quark_w4a4_mxfp4 import _dequant_mxfp4_to_bf16
torch.manual_seed(1)
w = torch.randn(16, 128) * 3
packed, scale = F.quantize_mxfp4(w)
ours = F.dequantize_mxfp4(packed, scale)
modelopt = MXFP4QuantizeUtil.dequantize(packed, torch.float32, scale, [32])
quark = _dequant_mxfp4_to_bf16(packed, scale)
assert torch.equal(ours, modelopt), (ours - modelopt).abs().max()
assert torch.equal(ours.to(torch.bfloat16), quark)
print("OK")
"""


def test_mxfp4_decoding_is_sglangs():
    """SGLang's two MXFP4 decoders (ModelOpt's MXFP4QuantizeUtil, Quark's bf16 dequant) read our bytes alike."""
    env, _ = sglang_env(cpu=True)
    out = subprocess.run(
        [sys.executable, "-c", SGLANG_MXFP4_CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------------------
# Exclude lists follow SGLang's matching rule (re.match, plain names match a dotted suffix)


@pytest.mark.parametrize(
    "module, int4_ignored, mxfp4_excluded",
    [
        ("language_model.model.layers.1.mlp.experts.7.gate_proj", False, False),
        ("language_model.model.layers.1.mlp.experts.0.down_proj", False, False),
        ("language_model.model.layers.1.mlp.shared_experts.up_proj", True, True),
        ("language_model.model.layers.0.mlp.gate_proj", True, True),  # the dense layer-0 MLP
        ("language_model.model.layers.0.mlp.gate_up_proj", True, True),
        ("language_model.model.layers.3.self_attn.kv_b_proj", True, True),
        ("language_model.model.layers.3.mlp.gate", False, True),  # the router (never a Linear target)
        ("language_model.lm_head", True, True),
        ("vision_tower.encoder.blocks.0.wqkv", True, True),
        ("mm_projector.proj.0", True, True),
    ],
)
def test_exclude_lists(module, int4_ignored, mxfp4_excluded):
    assert F.is_excluded(module, F.KIMI_K26_INT4_IGNORE) is int4_ignored
    assert F.is_excluded(module, F.KIMI_K26_MXFP4_EXCLUDE) is mxfp4_excluded


# ---------------------------------------------------------------------------------------------------------------
# The tiny model in each layout


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    out = tmp_path_factory.mktemp("variants")
    return {fmt: F.write_variant(TINY_MODEL, out / fmt, fmt) for fmt in F.FORMATS}


def _tensors(path):
    with safe_open(path / "model.safetensors", "pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def test_int4_variant_layout(variants):
    cfg = json.loads((variants[F.INT4] / "config.json").read_text())
    assert "quantization_config" not in cfg  # Kimi-K2.6 keeps it in text_config
    assert cfg["text_config"]["quantization_config"] == F.int4_quantization_config()
    assert F.format_of(cfg) == F.INT4
    src, sd = _tensors(TINY_MODEL), _tensors(variants[F.INT4])
    quantized = quantized_modules(sd, F.INT4)
    assert len(quantized) == 5 * 8 * 3  # every routed expert projection of the 5 MoE layers, nothing else
    assert all(".mlp.experts." in m for m in quantized)
    p = "language_model.model.layers.2.mlp.experts.5."
    assert sd[p + "gate_proj.weight_packed"].dtype == torch.int32
    assert sd[p + "gate_proj.weight_packed"].shape == (128, 256 // 8)  # [moe_inter, hidden / 8]
    assert sd[p + "gate_proj.weight_scale"].dtype == torch.bfloat16
    assert sd[p + "gate_proj.weight_scale"].shape == (128, 256 // 32)
    assert sd[p + "down_proj.weight_packed"].shape == (256, 128 // 8)  # [hidden, moe_inter / 8]
    assert sd[p + "down_proj.weight_scale"].shape == (256, 128 // 32)
    assert sd[p + "down_proj.weight_shape"].tolist() == [256, 128]
    assert p + "gate_proj.weight" not in sd
    for name, t in sd.items():  # everything else is the source tensor, untouched
        if not any(name.startswith(m + ".") for m in quantized):
            assert torch.equal(t, src[name]), name
    assert set(src) - set(sd) == {m + ".weight" for m in quantized}


def test_mxfp4_variant_layout(variants):
    cfg = json.loads((variants[F.MXFP4] / "config.json").read_text())
    q = cfg["quantization_config"]  # Quark exports: top level
    assert q["quant_method"] == "quark" and F.format_of(cfg) == F.MXFP4
    assert q["export"]["pack_method"] == "reorder" and q["export"]["weight_format"] == "real_quantized"
    assert q["export"]["kv_cache_group"] == []
    for spec, dynamic in (
        (q["global_quant_config"]["weight"], False),
        (q["global_quant_config"]["input_tensors"], True),
    ):
        assert (spec["dtype"], spec["qscheme"], spec["group_size"], spec["scale_format"], spec["is_dynamic"]) == (
            "fp4",
            "per_group",
            32,
            "e8m0",
            dynamic,
        )
    assert q["exclude"] == list(F.KIMI_K26_MXFP4_EXCLUDE)
    src, sd = _tensors(TINY_MODEL), _tensors(variants[F.MXFP4])
    quantized = quantized_modules(sd, F.MXFP4)
    assert len(quantized) == 5 * 8 * 3 and all(".mlp.experts." in m for m in quantized)
    p = "language_model.model.layers.4.mlp.experts.1."
    assert sd[p + "up_proj.weight"].dtype == torch.uint8 and sd[p + "up_proj.weight"].shape == (128, 256 // 2)
    assert sd[p + "up_proj.weight_scale"].dtype == torch.uint8 and sd[p + "up_proj.weight_scale"].shape == (128, 8)
    assert sd[p + "down_proj.weight"].shape == (256, 128 // 2) and sd[p + "down_proj.weight_scale"].shape == (256, 4)
    for name, t in sd.items():
        if not any(name.startswith(m + ".") for m in quantized):
            assert torch.equal(t, src[name]), name


@pytest.mark.parametrize("fmt", F.FORMATS)
def test_dequantized_reference_is_close_to_the_bf16_model(variants, fmt, tmp_path):
    """The reference holds exactly what the packed tensors decode to, close to the original weights."""
    ref = F.dequantize_checkpoint(variants[fmt], tmp_path / "ref")
    cfg = json.loads((ref / "config.json").read_text())
    assert F.checkpoint_quantization(cfg) is None
    src, q, r = _tensors(TINY_MODEL), _tensors(variants[fmt]), _tensors(ref)
    assert set(r) == set(src)
    name = "language_model.model.layers.3.mlp.experts.2.down_proj"
    if fmt == F.INT4:
        exact = F.dequantize_int4(q[name + ".weight_packed"], q[name + ".weight_scale"])
    else:
        exact = F.dequantize_mxfp4(q[name + ".weight"], q[name + ".weight_scale"])
    assert torch.equal(r[name + ".weight"], exact) and exact.dtype == torch.float32
    rel = (exact - src[name + ".weight"].float()).norm() / src[name + ".weight"].float().norm()
    assert rel < {F.INT4: 0.12, F.MXFP4: 0.15}[fmt], rel
    assert torch.equal(r["language_model.lm_head.weight"], src["language_model.lm_head.weight"])


def test_amd_k25_variant_quantizes_shared_experts_and_the_dense_mlp(tmp_path):
    path = F.write_named_variant(TINY_MODEL, tmp_path / "amd", "mxfp4-amd-k25")
    quantized = quantized_modules(_tensors(path), F.MXFP4)
    assert "language_model.model.layers.0.mlp.gate_proj" in quantized  # dense layer-0 MLP
    assert "language_model.model.layers.3.mlp.shared_experts.down_proj" in quantized
    assert not any("self_attn" in m or "lm_head" in m or m.endswith("mlp.gate") for m in quantized)
    assert len(quantized) == 3 + 5 * (8 + 1) * 3
    with pytest.raises(ValueError, match="unknown variant"):
        F.write_named_variant(TINY_MODEL, tmp_path / "x", "nvfp4")


def test_write_variant_refuses_a_quantized_source(variants, tmp_path):
    with pytest.raises(F.CheckpointFormatError, match="already quantized"):
        F.write_variant(variants[F.INT4], tmp_path / "again", F.MXFP4)
    with pytest.raises(F.CheckpointFormatError, match="nothing to dequantize"):
        F.dequantize_checkpoint(TINY_MODEL, tmp_path / "ref")


def test_make_variants_script(tmp_path, capsys):
    sys.path.insert(0, str(TINY_MODEL.parents[2] / "scripts"))
    import make_variants

    assert make_variants.main(["--out", str(tmp_path), "--variants", "mxfp4", "--reference"]) == 0
    printed = capsys.readouterr().out
    assert "mxfp4" in printed and "mxfp4-reference" in printed
    assert (tmp_path / "mxfp4" / "tokenizer.json").exists() and (tmp_path / "mxfp4-reference" / "config.json").exists()


def test_quant_package_ships_in_the_wheel():
    import tomllib

    pyproject = tomllib.loads((TINY_MODEL.parents[2] / "pyproject.toml").read_text())
    assert "sglang_kimi.models.quant" in pyproject["tool"]["setuptools"]["packages"]
