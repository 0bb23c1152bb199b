"""Dequantising fallbacks for Kimi's INT4 and MXFP4 checkpoints on devices where SGLang has no kernel for them.

SGLang serves Kimi-K2.6's INT4 compressed-tensors experts with Marlin (CUDA sm80+) or Triton WNA16 (ROCm), and
Quark MXFP4 experts only through AITER on gfx95x (``QuarkW4A4MXFp4MoE.create_moe_runner`` raises otherwise). On a
CPU, an older CUDA GPU, an H100/H200 with an MXFP4 checkpoint or an MI300 (gfx942) with one, the checkpoint does
not load. The plugin replaces the registry entries ``compressed-tensors`` and ``quark`` (SGLang's own names: ROCm's
``_verify_quantization`` refuses a new name) with subclasses that keep every decision of SGLang's configs, except
for the layers :func:`native_kernel` says SGLang cannot run on this device. Those get:

- :class:`DequantFusedMoEMethod` (routed experts): the checkpoint's packed tensors are loaded through FusedMoE's own
  weight loader into ``w13_*`` [E, 2I, ...] / ``w2_*`` [E, H, ...] (gate rows first, then up; checkpoint layout,
  not transposed), dequantized once after loading into ``w13_weight`` [E, 2I, H] and ``w2_weight`` [E, H, I] of
  the model dtype, then handed to SGLang's ``UnquantizedFusedMoEMethod``: on CPU ``moe_forward_native`` (or the AMX
  kernel), on a GPU the Triton fused MoE.
- :class:`DequantLinearMethod` (quantized dense layers, e.g. the shared experts of ``amd/Kimi-K2.5-MXFP4``): SGLang's
  scheme creates the packed parameters (TP sharding and fused gate/up shards included), they are dequantized after
  loading into ``weight`` [out, in] and run by ``UnquantizedLinearMethod``.

Dequantized weights take 4 (bf16) or 8 (float32) times the packed bytes: this is for development, correctness
checks and small models; serving the 1T Kimi-K2.6 needs the native kernels.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from sglang_kimi.log import warn_once
from sglang_kimi.models.quant.formats import INT4, MXFP4, dequantize_int4, dequantize_mxfp4

# SGLang registry keys the fallbacks replace (never a new name: ROCm refuses unknown quantization names).
REGISTRY_KEYS = {INT4: "compressed-tensors", MXFP4: "quark"}


# ---------------------------------------------------------------------------------------------------------------
# Which path: SGLang's kernel or the plugin's dequantization
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """What decides whether SGLang has a kernel for a format (``current_device()`` reads it from this machine)."""

    kind: str  # "cuda" | "rocm" | "cpu" | "npu" | "xpu" | "other"
    capability: tuple[int, int] | None = None  # CUDA compute capability
    gfx95: bool = False  # ROCm gfx950+ (MI350/MI355): FP4 hardware
    aiter: bool = False  # SGLANG_USE_AITER set (ROCm)


def current_device() -> Device:
    from sglang.srt.utils import is_cpu, is_cuda, is_hip, is_npu, is_xpu

    if is_cpu():
        return Device("cpu")
    if is_hip():
        from sglang.srt.utils import is_gfx95_supported

        aiter = os.environ.get("SGLANG_USE_AITER", "0").lower() in ("1", "true")
        return Device("rocm", gfx95=bool(is_gfx95_supported()), aiter=aiter)
    if is_cuda():
        return Device("cuda", capability=tuple(torch.cuda.get_device_capability()))
    if is_npu():
        return Device("npu")
    if is_xpu():
        return Device("xpu")
    return Device("other")


def native_kernel(fmt: str, device: Device) -> str | None:
    """SGLang's kernel for ``fmt`` experts on ``device``, or None when SGLang has none (the plugin dequantizes).

    INT4 (compressed-tensors W4A16): Marlin WNA16 MoE on CUDA sm80+ (``CompressedTensorsWNA16MoE``), Triton WNA16
    on ROCm, the NPU W4A16 MoE on Ascend. MXFP4 (Quark W4A4): only AITER on ROCm gfx95x
    (``QuarkW4A4MXFp4MoE`` raises "requires the AITER runner" elsewhere)."""
    if fmt == INT4:
        if device.kind == "cuda" and device.capability is not None and device.capability >= (8, 0):
            return "Marlin WNA16 MoE (CompressedTensorsWNA16MoE)"
        if device.kind == "rocm":
            return "Triton WNA16 MoE (CompressedTensorsWNA16TritonMoE)"
        if device.kind == "npu":
            return "NPU W4A16 MoE"
        return None
    if fmt == MXFP4:
        if device.kind == "rocm" and device.gfx95 and device.aiter:
            return "AITER MXFP4 MoE (QuarkW4A4MXFp4MoE)"
        return None
    raise ValueError(f"unknown format {fmt!r}")


def fallback_reason(fmt: str, device: Device) -> str:
    what = {INT4: "INT4 compressed-tensors", MXFP4: "MXFP4 Quark"}[fmt]
    if device.kind == "rocm" and fmt == MXFP4 and device.gfx95 and not device.aiter:
        why = "SGLANG_USE_AITER is not set (its only MXFP4 MoE kernel is AITER's)"
    else:
        cap = f" sm{device.capability[0]}{device.capability[1]}" if device.capability else ""
        why = f"SGLang has no {what} kernel for {device.kind}{cap}"
    return (
        f"{what}: {why}; sglang-kimi dequantizes these weights at load time to the model dtype and runs SGLang's "
        "unquantized layers (memory: 4x the packed size in bf16)"
    )


def _uses_fallback(fmt: str) -> bool:
    device = current_device()
    if native_kernel(fmt, device) is not None:
        return False
    warn_once(f"fallback:{fmt}", "sglang-kimi: %s", fallback_reason(fmt, device))
    return True


# ---------------------------------------------------------------------------------------------------------------
# The dequantizing methods
# ---------------------------------------------------------------------------------------------------------------


def _drop(layer: torch.nn.Module, *names: str) -> None:
    for name in names:
        if name in layer._parameters:
            del layer._parameters[name]
        elif hasattr(layer, name):
            delattr(layer, name)


def make_dequant_moe_method(fmt: str, group_size: int = 32):
    """A :class:`DequantFusedMoEMethod` for ``fmt`` (the class is built on SGLang's ``UnquantizedFusedMoEMethod``)."""
    return _dequant_moe_class()(fmt, group_size)


_MOE_CLASS = None


def _dequant_moe_class():
    global _MOE_CLASS
    if _MOE_CLASS is not None:
        return _MOE_CLASS
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoeWeightScaleSupported
    from sglang.srt.layers.quantization.unquant import UnquantizedFusedMoEMethod
    from sglang.srt.utils import set_weight_attrs

    class DequantFusedMoEMethod(UnquantizedFusedMoEMethod):
        """Routed experts stored INT4 / MXFP4, served as unquantized experts of the model dtype.

        Parameters created (checkpoint layout, E local experts, I = intermediate size per TP rank, H hidden)::

            INT4   w13_weight_packed int32 [E, 2I, H/8]  w13_weight_scale [E, 2I, H/32]  w13_weight_shape [E, 2]
                   w2_weight_packed  int32 [E, H, I/8]   w2_weight_scale  [E, H, I/32]   w2_weight_shape  [E, 2]
            MXFP4  w13_weight uint8 [E, 2I, H/2]         w13_weight_scale uint8 [E, 2I, H/32]
                   w2_weight  uint8 [E, H, I/2]          w2_weight_scale  uint8 [E, H, I/32]

        After loading: ``w13_weight`` [E, 2I, H] and ``w2_weight`` [E, H, I] in the model dtype, exactly what
        ``UnquantizedFusedMoEMethod.create_weights`` would have made, then its own post-processing.
        """

        def __init__(self, fmt: str, group_size: int):
            super().__init__()
            self.fmt = fmt
            self.group_size = group_size

        def create_weights(
            self, layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype, **extra_weight_attrs
        ):
            extra_weight_attrs.pop("with_bias", None)
            self.params_dtype = params_dtype
            e, h, i, g = num_experts, hidden_size, intermediate_size_per_partition, self.group_size
            if h % g or i % g:
                raise ValueError(
                    f"{self.fmt} experts need hidden ({h}) and per-rank intermediate ({i}) sizes divisible by the "
                    f"group size {g}: use a tensor-parallel size that keeps whole groups per rank"
                )
            weight_attrs = dict(extra_weight_attrs)
            scale_attrs = dict(extra_weight_attrs, quant_method=FusedMoeWeightScaleSupported.GROUP.value)
            if self.fmt == INT4:
                shapes = {
                    "w13_weight_packed": ((e, 2 * i, h // 8), torch.int32, weight_attrs),
                    "w2_weight_packed": ((e, h, i // 8), torch.int32, weight_attrs),
                    "w13_weight_scale": ((e, 2 * i, h // g), params_dtype, scale_attrs),
                    "w2_weight_scale": ((e, h, i // g), params_dtype, scale_attrs),
                    "w13_weight_shape": ((e, 2), torch.int64, weight_attrs),
                    "w2_weight_shape": ((e, 2), torch.int64, weight_attrs),
                }
            else:
                shapes = {
                    "w13_weight": ((e, 2 * i, h // 2), torch.uint8, weight_attrs),
                    "w2_weight": ((e, h, i // 2), torch.uint8, weight_attrs),
                    "w13_weight_scale": ((e, 2 * i, h // g), torch.uint8, scale_attrs),
                    "w2_weight_scale": ((e, h, i // g), torch.uint8, scale_attrs),
                }
            for name, (shape, dtype, attrs) in shapes.items():
                param = torch.nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
                layer.register_parameter(name, param)
                set_weight_attrs(param, attrs)

        def process_weights_after_loading(self, layer) -> None:
            if self.fmt == INT4:
                w13 = dequantize_int4(layer.w13_weight_packed.data, layer.w13_weight_scale.data)  # [E, 2I, H]
                w2 = dequantize_int4(layer.w2_weight_packed.data, layer.w2_weight_scale.data)  # [E, H, I]
                _drop(layer, "w13_weight_packed", "w2_weight_packed", "w13_weight_shape", "w2_weight_shape")
            else:
                w13 = dequantize_mxfp4(layer.w13_weight.data, layer.w13_weight_scale.data)  # [E, 2I, H]
                w2 = dequantize_mxfp4(layer.w2_weight.data, layer.w2_weight_scale.data)  # [E, H, I]
            _drop(layer, "w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale")
            layer.register_parameter("w13_weight", torch.nn.Parameter(w13.to(self.params_dtype), requires_grad=False))
            layer.register_parameter("w2_weight", torch.nn.Parameter(w2.to(self.params_dtype), requires_grad=False))
            super().process_weights_after_loading(layer)

    _MOE_CLASS = DequantFusedMoEMethod
    return _MOE_CLASS


_LINEAR_CLASS = None


def make_dequant_linear_method(fmt: str, scheme):
    """A :class:`DequantLinearMethod`: ``scheme`` (SGLang's) only creates the checkpoint-layout parameters."""
    return _dequant_linear_class()(fmt, scheme)


def _dequant_linear_class():
    global _LINEAR_CLASS
    if _LINEAR_CLASS is not None:
        return _LINEAR_CLASS
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    class DequantLinearMethod(UnquantizedLinearMethod):
        """A dense layer stored INT4 / MXFP4, served as an unquantized ``weight`` [out, in] of the model dtype."""

        def __init__(self, fmt: str, scheme):
            super().__init__()
            self.fmt = fmt
            self.scheme = scheme

        def create_weights(
            self,
            layer,
            input_size_per_partition,
            output_partition_sizes,
            input_size,
            output_size,
            params_dtype,
            **extra_weight_attrs,
        ):
            self.params_dtype = params_dtype
            self.scheme.create_weights(
                layer=layer,
                output_size=output_size,
                input_size=input_size,
                output_partition_sizes=output_partition_sizes,
                input_size_per_partition=input_size_per_partition,
                params_dtype=params_dtype,
                weight_loader=extra_weight_attrs.get("weight_loader"),
            )

        def process_weights_after_loading(self, layer) -> None:
            if self.fmt == INT4:
                w = dequantize_int4(layer.weight_packed.data, layer.weight_scale.data)  # [out, in]
                _drop(layer, "weight", "weight_packed", "weight_scale", "weight_shape", "weight_g_idx")
            else:
                w = dequantize_mxfp4(layer.weight.data, layer.weight_scale.data)  # [out, in]
                _drop(layer, "weight", "weight_scale")
            layer.register_parameter("weight", torch.nn.Parameter(w.to(self.params_dtype), requires_grad=False))
            super().process_weights_after_loading(layer)

    _LINEAR_CLASS = DequantLinearMethod
    return _LINEAR_CLASS


# ---------------------------------------------------------------------------------------------------------------
# The configs that replace SGLang's registry entries
# ---------------------------------------------------------------------------------------------------------------


def _is_int4_w4a16(scheme_dict) -> bool:
    if not scheme_dict:
        return False
    w, a = scheme_dict.get("weights"), scheme_dict.get("input_activations")
    return (
        w is not None
        and a is None
        and str(getattr(w.type, "value", w.type)) == "int"
        and w.num_bits == 4
        and w.symmetric
        and not w.dynamic
        and str(getattr(w.strategy, "value", w.strategy)) == "group"
        and not w.actorder
    )


def _with_float32(dtypes, fmt: str) -> list[torch.dtype]:
    dtypes = list(dtypes)
    if torch.float32 not in dtypes and _uses_fallback(fmt):
        dtypes.append(torch.float32)
    return dtypes


def _compressed_tensors_class():
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    class KimiCompressedTensorsConfig(CompressedTensorsConfig):
        """SGLang's compressed-tensors config; INT4 W4A16 layers are dequantized where no native kernel exists."""

        def _scheme_dict(self, layer, name):
            try:
                return self.get_scheme_dict(layer, name)
            except ValueError:  # no target matches: SGLang's own path decides (and reports)
                return None

        def _pack_quantized(self, scheme_dict) -> bool:
            fmt = (scheme_dict or {}).get("format") or self.quant_format
            return fmt == "pack-quantized" and _is_int4_w4a16(scheme_dict)

        def get_quant_method(self, layer, prefix):
            if isinstance(layer, FusedMoE):
                self._add_fused_moe_to_target_scheme_map()
                scheme_dict = self._scheme_dict(layer, prefix + ".0.gate_proj")
                if self._pack_quantized(scheme_dict) and _uses_fallback(INT4):
                    return make_dequant_moe_method(INT4, scheme_dict["weights"].group_size)
            elif isinstance(layer, LinearBase) and self.linear_fp8_config is None:
                scheme_dict = self._scheme_dict(layer, prefix)
                if self._pack_quantized(scheme_dict) and _uses_fallback(INT4):
                    from sglang.srt.layers.quantization.compressed_tensors.schemes import CompressedTensorsWNA16

                    w = scheme_dict["weights"]
                    scheme = CompressedTensorsWNA16(
                        strategy=w.strategy, num_bits=w.num_bits, group_size=w.group_size, symmetric=w.symmetric
                    )
                    return make_dequant_linear_method(INT4, scheme)
            return super().get_quant_method(layer, prefix)

        def can_fuse_shared_expert(self) -> bool:
            # A fused shared-expert slot would receive bf16 weights in the packed INT4 buffers.
            return not _uses_fallback(INT4)

        def get_supported_act_dtypes(self) -> list[torch.dtype]:
            # dequantized layers run in any dtype (float32 on CPU: SGLang's CPU default here)
            return _with_float32(super().get_supported_act_dtypes(), INT4)

    return KimiCompressedTensorsConfig


def _quark_class():
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
    from sglang.srt.layers.quantization.quark.quark import QuarkConfig
    from sglang.srt.layers.quantization.quark.utils import should_ignore_layer

    class KimiQuarkConfig(QuarkConfig):
        """SGLang's Quark config; MXFP4 layers of a prequantized checkpoint are dequantized where no native kernel
        exists (everywhere but ROCm gfx95x with AITER)."""

        def _mxfp4(self, layer, prefix) -> dict | None:
            if not self.is_prequantized or self.dequantization_config is not None:
                return None
            if should_ignore_layer(prefix, ignore=self.exclude_layers, fused_mapping=self.packed_modules_mapping):
                return None
            cfg = self._find_matched_config(prefix, layer)
            return cfg if self._is_mx_fp4(cfg.get("weight"), cfg.get("input_tensors")) else None

        def get_quant_method(self, layer, prefix):
            if isinstance(layer, (FusedMoE, LinearBase)):
                cfg = self._mxfp4(layer, prefix)
                if cfg is not None and _uses_fallback(MXFP4):
                    group = int(cfg["weight"].get("group_size") or 32)
                    if isinstance(layer, FusedMoE):
                        return make_dequant_moe_method(MXFP4, group)
                    from sglang.srt.layers.quantization.quark.schemes import QuarkW4A4MXFP4

                    scheme = QuarkW4A4MXFP4(cfg["weight"], cfg["input_tensors"], is_checkpoint_mxfp4_serialized=True)
                    return make_dequant_linear_method(MXFP4, scheme)
            return super().get_quant_method(layer, prefix)

        def can_fuse_shared_expert(self) -> bool:
            if _uses_fallback(MXFP4):
                return False  # a fused slot would receive bf16 shared-expert weights in the packed MXFP4 buffers
            return super().can_fuse_shared_expert()

        def get_supported_act_dtypes(self) -> list[torch.dtype]:
            return _with_float32(super().get_supported_act_dtypes(), MXFP4)

    return KimiQuarkConfig


def install_dequant_fallbacks(target: str):
    """Replace SGLang's ``compressed-tensors`` and ``quark`` registry entries (and the CPU subset's) with the
    fallback-aware subclasses. Returns None (the table records "ok")."""
    import sglang.srt.layers.quantization as quantization

    ct, quark = _compressed_tensors_class(), _quark_class()
    quantization.QUANTIZATION_METHODS[REGISTRY_KEYS[INT4]] = ct
    quantization.QUANTIZATION_METHODS[REGISTRY_KEYS[MXFP4]] = quark
    # On an AMX CPU get_quantization_config() only accepts CPU_QUANTIZATION_METHODS, which lacks "quark".
    quantization.CPU_QUANTIZATION_METHODS[REGISTRY_KEYS[INT4]] = ct
    quantization.CPU_QUANTIZATION_METHODS[REGISTRY_KEYS[MXFP4]] = quark
    return None
