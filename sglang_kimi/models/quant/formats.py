"""Kimi-K2.6 weight formats, written and read in plain torch: INT4 compressed-tensors and MXFP4 Quark.

Two checkpoint layouts the plugin serves (no SGLang import here; ``tests/unit/test_variants_formats.py`` checks every
packing function against compressed-tensors' and SGLang's own):

**INT4, compressed-tensors ``pack-quantized``** (``moonshotai/Kimi-K2.6``, the native checkpoint). The
``quantization_config`` block sits in ``text_config`` (SGLang's ``KimiK25Config`` lifts it to the top level). Every
``Linear`` not matched by ``ignore`` (in Kimi-K2.6: only the routed experts) is stored as three tensors::

    <module>.weight_packed  int32 [out, in / 8]     8 signed 4-bit values per word, value j of a word in bits
                                                     4j..4j+3, stored with +8 offset (compressed-tensors
                                                     ``pack_to_int32``, packed along the input dim)
    <module>.weight_scale   bf16  [out, in / 32]    symmetric, one scale per group of 32 inputs
    <module>.weight_shape   int64 [2]               (out, in)

    w[o, i] = (nibble(o, i) - 8) * scale[o, i // 32]

**MXFP4, AMD Quark** (``amd/Kimi-K2.5-MXFP4`` format; the exclude list of the community Kimi-K2.6 MXFP4 export:
``lm_head``, every ``self_attn``, the shared experts, the dense layer-0 MLP, the router, vision). The
``quantization_config`` block is top-level (``quant_method: quark``, fp4 ``per_group`` 32 with ``e8m0`` scales,
dynamic fp4 inputs, ``export.pack_method: reorder``, ``weight_format: real_quantized``). A quantized module keeps its
``.weight`` name::

    <module>.weight         uint8 [out, in / 2]     two E2M1 codes per byte: input 2k in the low nibble, 2k+1 in the
                                                     high nibble (Quark ``Pack_fp4``; ``reorder`` only permutes int4
                                                     words and leaves fp4 bytes in this order)
    <module>.weight_scale   uint8 [out, in / 32]    E8M0: the group's scale is 2 ** (byte - 127)

    E2M1 code c = s eee: value (-1)**s * [0, 0.5, 1, 1.5, 2, 3, 4, 6][c & 7]
    w[o, i] = e2m1(code(o, i)) * 2 ** (scale[o, i // 32] - 127)

Kimi-K2.6 routed-expert shapes: ``gate_proj``/``up_proj`` [2048, 7168] -> INT4 packed [2048, 896] + scale
[2048, 224]; MXFP4 [2048, 3584] + [2048, 224]. ``down_proj`` [7168, 2048] -> INT4 [7168, 256] + [7168, 64];
MXFP4 [7168, 1024] + [7168, 64].

:func:`write_variant` converts a bf16 Kimi checkpoint (the embedded tiny model) into either layout;
:func:`dequantize_checkpoint` writes the float32 checkpoint a quantized one stands for: the reference the served
variant is checked against.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

INT4 = "int4"  # compressed-tensors pack-quantized, W4A16 group 32 (Kimi-K2.6 native)
MXFP4 = "mxfp4"  # AMD Quark, fp4 E2M1 weights, E8M0 scales per group of 32
FORMATS = (INT4, MXFP4)

GROUP_SIZE = 32
INT4_PACK = 8  # int4 values per int32 word
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitude of codes 0..7; bit 3 is the sign
E2M1_MAX = 6.0
E8M0_BIAS = 127

# The ignore list of moonshotai/Kimi-K2.6's compressed-tensors quantization_config: everything but routed experts.
KIMI_K26_INT4_IGNORE = (
    "re:.*self_attn.*",
    "re:.*shared_experts.*",
    r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
    "re:.*lm_head.*",
    "re:vision_tower.*",
    "re:mm_projector.*",
)

# Kimi-K2.6 MXFP4 (Quark): lm_head, every self_attn, the router, the shared experts, the dense layer-0 MLP, vision.
KIMI_K26_MXFP4_EXCLUDE = (
    "re:.*lm_head",
    "re:.*self_attn.*",
    r"re:.*mlp\.gate$",
    "re:.*shared_experts.*",
    r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
    "re:vision_tower.*",
    "re:mm_projector.*",
)

# amd/Kimi-K2.5-MXFP4 style: only lm_head, attention and the router stay bf16; the shared experts and the dense
# layer-0 MLP are MXFP4 too (dense quantized Linears, served by the Linear fallback where SGLang has no kernel).
AMD_K25_MXFP4_EXCLUDE = (
    "re:.*lm_head",
    "re:.*self_attn.*",
    r"re:.*mlp\.gate$",
    "re:vision_tower.*",
    "re:mm_projector.*",
)


class CheckpointFormatError(ValueError):
    """A checkpoint whose quantized tensors do not have the layout their config declares."""


# ---------------------------------------------------------------------------------------------------------------
# Config blocks
# ---------------------------------------------------------------------------------------------------------------


def int4_quantization_config(ignore: Iterable[str] = KIMI_K26_INT4_IGNORE) -> dict:
    """Kimi-K2.6's ``text_config.quantization_config`` (compressed-tensors, INT4 weight-only, group 32)."""
    return {
        "config_groups": {
            "group_0": {
                "input_activations": None,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": {
                    "actorder": None,
                    "block_structure": None,
                    "dynamic": False,
                    "group_size": GROUP_SIZE,
                    "num_bits": 4,
                    "observer": "minmax",
                    "observer_kwargs": {},
                    "strategy": "group",
                    "symmetric": True,
                    "type": "int",
                },
            }
        },
        "format": "pack-quantized",
        "ignore": list(ignore),
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
    }


def _mx_fp4_spec(dynamic: bool) -> dict:
    return {
        "ch_axis": -1,
        "dtype": "fp4",
        "group_size": GROUP_SIZE,
        "is_dynamic": dynamic,
        "is_scale_quant": False,
        "mx_element_dtype": None,
        "observer_cls": "PerBlockMXObserver",
        "qscheme": "per_group",
        "round_method": "half_even",
        "scale_calculation_mode": "even",
        "scale_format": "e8m0",
        "scale_type": "float",
        "symmetric": None,
    }


def mxfp4_quantization_config(exclude: Iterable[str] = KIMI_K26_MXFP4_EXCLUDE) -> dict:
    """A Quark MXFP4 export's top-level ``quantization_config`` (weights fp4 static, inputs fp4 dynamic)."""
    return {
        "algo_config": None,
        "exclude": list(exclude),
        "export": {
            "kv_cache_group": [],
            "min_kv_scale": 0.0,
            "pack_method": "reorder",
            "weight_format": "real_quantized",
            "weight_merge_groups": None,
        },
        "global_quant_config": {
            "bias": None,
            "input_tensors": _mx_fp4_spec(dynamic=True),
            "output_tensors": None,
            "target_device": None,
            "weight": _mx_fp4_spec(dynamic=False),
        },
        "layer_quant_config": {},
        "layer_type_quant_config": {},
        "quant_method": "quark",
        "quant_mode": "eager_mode",
        "softmax_quant_spec": None,
        "version": "0.10",
    }


def checkpoint_quantization(config: Mapping) -> dict | None:
    """The ``quantization_config`` of a Kimi ``config.json`` (top level, else ``text_config``), or None."""
    return config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")


def format_of(config: Mapping) -> str | None:
    """INT4 or MXFP4 for a Kimi ``config.json`` in one of the two layouts; None for an unquantized checkpoint."""
    q = checkpoint_quantization(config)
    if q is None:
        return None
    method = q.get("quant_method")
    if method in ("compressed-tensors", "compressed_tensors") and q.get("format") == "pack-quantized":
        weights = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values()]
        if weights and all(w.get("type") == "int" and w.get("num_bits") == 4 for w in weights):
            return INT4
    if method == "quark":
        weight = (q.get("global_quant_config") or {}).get("weight") or {}
        if weight.get("dtype") == "fp4" and weight.get("scale_format") == "e8m0":
            return MXFP4
    raise CheckpointFormatError(
        f"quantization_config {method!r} / {q.get('format')!r} is neither INT4 compressed-tensors pack-quantized nor "
        "Quark MXFP4: the plugin's Kimi variants cover those two"
    )


def is_excluded(module: str, patterns: Iterable[str]) -> bool:
    """SGLang's rule for ``ignore``/``exclude`` lists: ``re:`` entries match with ``re.match`` (anchored at the
    start only), plain entries match the whole name or a dotted suffix."""
    for p in patterns:
        if p.startswith("re:"):
            if re.match(p[3:], module):
                return True
        elif module == p or module.endswith("." + p):
            return True
    return False


def _quantizable(name: str, t: torch.Tensor) -> bool:
    """A ``Linear`` weight (what ``targets: [Linear]`` selects): 2-D, not an embedding and not the MoE router."""
    return (
        name.endswith(".weight")
        and t.ndim == 2
        and not name.endswith("embed_tokens.weight")
        and not name.endswith(".mlp.gate.weight")
    )


# ---------------------------------------------------------------------------------------------------------------
# INT4: symmetric group-32 quantization, packed 8 per int32 (compressed-tensors pack-quantized)
# ---------------------------------------------------------------------------------------------------------------


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """int8 values in [-8, 7], [rows, cols] (cols % 8 == 0) -> int32 [rows, cols / 8]."""
    if q.dtype != torch.int8 or q.shape[-1] % INT4_PACK:
        raise ValueError(f"pack_int4 needs int8 [rows, cols] with cols % 8 == 0, got {q.dtype} {tuple(q.shape)}")
    u = (q.to(torch.int64) + 8).view(*q.shape[:-1], -1, INT4_PACK)  # [rows, cols/8, 8] in 0..15
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)  # value j of a word -> bits 4j..4j+3
    words = (u << shifts).sum(-1)  # [rows, cols/8] in 0..2^32-1
    return (words - (words >= 2**31).to(torch.int64) * 2**32).to(torch.int32)  # two's complement int32


def unpack_int4(packed: torch.Tensor, cols: int | None = None) -> torch.Tensor:
    """int32 [rows, words] -> int8 [rows, cols] in [-8, 7] (inverse of :func:`pack_int4`)."""
    if packed.dtype != torch.int32:
        raise CheckpointFormatError(f"an INT4 weight_packed tensor must be int32, got {packed.dtype}")
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    u = (packed.unsqueeze(-1) >> shifts) & 0xF  # [rows, words, 8] (arithmetic shift, masked)
    q = (u - 8).to(torch.int8).reshape(*packed.shape[:-1], -1)
    return q if cols is None else q[..., :cols]


def quantize_int4(w: torch.Tensor, group_size: int = GROUP_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (int8 q [out, in] in [-8, 7], bf16 scale [out, in / group]); scale = group absmax / 7."""
    out, cols = w.shape
    if cols % group_size:
        raise ValueError(f"input dim {cols} is not a multiple of the group size {group_size}")
    g = w.float().view(out, cols // group_size, group_size)
    scale = (g.abs().amax(-1) / 7.0).clamp(min=1e-8).to(torch.bfloat16)  # [out, in/g]
    q = torch.round(g / scale.float()[..., None]).clamp(-8, 7).to(torch.int8).view(out, cols)
    return q, scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, shape: Iterable[int] | None = None) -> torch.Tensor:
    """weight_packed int32 [out, in/8], weight_scale [out, in/g] -> float32 [out, in]."""
    cols = int(list(shape)[-1]) if shape is not None else packed.shape[-1] * INT4_PACK
    q = unpack_int4(packed, cols).float()  # [out, in]
    group = cols // scale.shape[-1]
    if group * scale.shape[-1] != cols:
        raise CheckpointFormatError(f"INT4 weight_scale {tuple(scale.shape)} does not divide the input dim {cols}")
    return (q.view(*q.shape[:-1], -1, group) * scale.float()[..., None]).reshape(q.shape)


# ---------------------------------------------------------------------------------------------------------------
# MXFP4: E2M1 elements, E8M0 scale per group of 32, two elements per byte (Quark Pack_fp4)
# ---------------------------------------------------------------------------------------------------------------

_E2M1_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # midpoints between E2M1 magnitudes


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Float values already divided by their scale -> E2M1 codes uint8 (round to nearest, saturate at 6)."""
    magnitude = (x.abs().unsqueeze(-1) > _E2M1_BOUNDS).sum(-1)  # 0..7
    sign = (x < 0).to(torch.int64) << 3
    return (sign | magnitude).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 0..15) -> float32 values."""
    c = codes.to(torch.int64)
    value = torch.tensor(E2M1_VALUES)[c & 7]
    return torch.where((c & 8) != 0, -value, value)


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """E2M1 codes uint8 [rows, cols] -> bytes uint8 [rows, cols / 2]; element 2k low nibble, 2k+1 high nibble."""
    pairs = codes.view(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [rows, bytes] -> E2M1 codes uint8 [rows, 2 * bytes] (inverse of :func:`pack_fp4`)."""
    if packed.dtype != torch.uint8:
        raise CheckpointFormatError(f"an MXFP4 weight must be uint8 (two fp4 codes per byte), got {packed.dtype}")
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1)


def quantize_mxfp4(w: torch.Tensor, group_size: int = GROUP_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (uint8 packed [out, in / 2], uint8 E8M0 scale [out, in / 32]).

    The group's exponent is ``ceil(log2(absmax / 6))``, so the largest element maps to at most 6 (no clipping)."""
    out, cols = w.shape
    if cols % group_size:
        raise ValueError(f"input dim {cols} is not a multiple of the group size {group_size}")
    g = w.float().view(out, cols // group_size, group_size)
    amax = g.abs().amax(-1).clamp(min=2.0**-126)
    exponent = torch.ceil(torch.log2(amax / E2M1_MAX)).clamp(-E8M0_BIAS, E8M0_BIAS)  # [out, in/g]
    codes = e2m1_encode(g / torch.exp2(exponent)[..., None]).view(out, cols)
    return pack_fp4(codes), (exponent + E8M0_BIAS).to(torch.uint8)


def dequantize_mxfp4(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """weight uint8 [out, in/2], weight_scale uint8 E8M0 [out, in/32] -> float32 [out, in]."""
    if scale.dtype != torch.uint8:
        raise CheckpointFormatError(f"an MXFP4 weight_scale must be uint8 (E8M0), got {scale.dtype}")
    values = e2m1_decode(unpack_fp4(packed))  # [out, in]
    cols = values.shape[-1]
    group = cols // scale.shape[-1]
    if group * scale.shape[-1] != cols:
        raise CheckpointFormatError(f"MXFP4 weight_scale {tuple(scale.shape)} does not divide the input dim {cols}")
    factor = torch.exp2(scale.to(torch.float32) - E8M0_BIAS)  # [out, in/g]
    return (values.view(*values.shape[:-1], -1, group) * factor[..., None]).reshape(values.shape)


# ---------------------------------------------------------------------------------------------------------------
# Whole checkpoints
# ---------------------------------------------------------------------------------------------------------------

CHECKPOINT_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def quantize_state_dict(sd: Mapping[str, torch.Tensor], fmt: str, patterns: Iterable[str]) -> dict[str, torch.Tensor]:
    """A bf16 Kimi state dict in ``fmt``: every quantizable weight whose module is not excluded gets quantized."""
    patterns = list(patterns)
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        module = name[: -len(".weight")]
        if not _quantizable(name, t) or is_excluded(module, patterns):
            out[name] = t
            continue
        if fmt == INT4:
            q, scale = quantize_int4(t)
            out[module + ".weight_packed"] = pack_int4(q)
            out[module + ".weight_scale"] = scale
            out[module + ".weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int64)
        elif fmt == MXFP4:
            out[module + ".weight"], out[module + ".weight_scale"] = quantize_mxfp4(t)
        else:
            raise ValueError(f"unknown format {fmt!r}: expected one of {FORMATS}")
    return out


def dequantize_state_dict(sd: Mapping[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """The float32 weights a quantized state dict stands for (unquantized tensors are passed through)."""
    out: dict[str, torch.Tensor] = {}
    for name, t in sd.items():
        if fmt == INT4 and name.endswith(".weight_packed"):
            module = name[: -len(".weight_packed")]
            out[module + ".weight"] = dequantize_int4(t, sd[module + ".weight_scale"], sd[module + ".weight_shape"])
        elif fmt == INT4 and name.endswith((".weight_scale", ".weight_shape")):
            continue
        elif fmt == MXFP4 and name.endswith(".weight_scale"):
            continue
        elif fmt == MXFP4 and name.endswith(".weight") and name[: -len(".weight")] + ".weight_scale" in sd:
            out[name] = dequantize_mxfp4(t, sd[name + "_scale"])
        else:
            out[name] = t
    return out


def _read_checkpoint(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    config = json.loads((path / "config.json").read_text())
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    sd: dict[str, torch.Tensor] = {}
    for f in files:
        sd.update(load_file(f))
    return config, sd


def _write_checkpoint(src: Path, dst: Path, config: dict, sd: Mapping[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    dst.mkdir(parents=True, exist_ok=True)
    for name in CHECKPOINT_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in sd.items()}, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def write_variant(src: str | Path, dst: str | Path, fmt: str, patterns: Iterable[str] | None = None) -> Path:
    """Write the Kimi checkpoint ``src`` (bf16) to ``dst`` in ``fmt`` (:data:`INT4` or :data:`MXFP4`), laid out
    as the real checkpoints are: config block, tensor names, dtypes and packing. ``patterns`` overrides the
    ignore/exclude list (defaults: Kimi-K2.6's)."""
    src, dst = Path(src), Path(dst)
    config, sd = _read_checkpoint(src)
    if checkpoint_quantization(config) is not None:
        raise CheckpointFormatError(f"{src} is already quantized: convert an unquantized (bf16) checkpoint")
    if fmt == INT4:
        block = int4_quantization_config(KIMI_K26_INT4_IGNORE if patterns is None else patterns)
        (config.get("text_config") or config)["quantization_config"] = block  # Kimi-K2.6: inside text_config
        patterns = block["ignore"]
    elif fmt == MXFP4:
        block = mxfp4_quantization_config(KIMI_K26_MXFP4_EXCLUDE if patterns is None else patterns)
        config["quantization_config"] = block  # Quark exports: top level
        patterns = block["exclude"]
    else:
        raise ValueError(f"unknown format {fmt!r}: expected one of {FORMATS}")
    return _write_checkpoint(src, dst, config, quantize_state_dict(sd, fmt, patterns))


# The variants scripts/make_variants.py writes: name -> (format, ignore/exclude list).
VARIANTS = {
    "int4": (INT4, KIMI_K26_INT4_IGNORE),  # moonshotai/Kimi-K2.6: routed experts INT4
    "mxfp4": (MXFP4, KIMI_K26_MXFP4_EXCLUDE),  # Kimi-K2.6 MXFP4 (Quark): routed experts MXFP4
    "mxfp4-amd-k25": (MXFP4, AMD_K25_MXFP4_EXCLUDE),  # amd/Kimi-K2.5-MXFP4 style: shared + dense MLP MXFP4 too
}


def write_named_variant(src: str | Path, dst: str | Path, name: str) -> Path:
    """:func:`write_variant` for one of :data:`VARIANTS`."""
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}: expected one of {sorted(VARIANTS)}")
    fmt, patterns = VARIANTS[name]
    return write_variant(src, dst, fmt, patterns)


def dequantize_checkpoint(src: str | Path, dst: str | Path) -> Path:
    """Write the unquantized float32 checkpoint that the quantized checkpoint ``src`` stands for (config without
    its ``quantization_config``): the reference a served variant is checked against."""
    src, dst = Path(src), Path(dst)
    config, sd = _read_checkpoint(src)
    fmt = format_of(config)
    if fmt is None:
        raise CheckpointFormatError(f"{src} has no quantization_config: nothing to dequantize")
    config.pop("quantization_config", None)
    if isinstance(config.get("text_config"), dict):
        config["text_config"].pop("quantization_config", None)
    return _write_checkpoint(src, dst, config, dequantize_state_dict(sd, fmt))
