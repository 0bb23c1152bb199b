"""Which path serves a quantized Kimi layer: SGLang's kernel where it has one, the plugin's dequantization elsewhere."""

import subprocess
import sys

import pytest

from sglang_kimi.launcher.server import sglang_env
from sglang_kimi.models.quant import fallback
from sglang_kimi.models.quant.fallback import Device, fallback_reason, native_kernel
from sglang_kimi.models.quant.formats import INT4, MXFP4

H100 = Device("cuda", capability=(9, 0))
V100 = Device("cuda", capability=(7, 0))
MI300X = Device("rocm", gfx95=False, aiter=True)
MI355X = Device("rocm", gfx95=True, aiter=True)
MI355X_NO_AITER = Device("rocm", gfx95=True, aiter=False)


@pytest.mark.parametrize(
    "fmt, device, native",
    [
        (INT4, Device("cpu"), None),
        (INT4, H100, "Marlin"),
        (INT4, V100, None),  # Marlin needs sm80
        (INT4, MI300X, "Triton WNA16"),
        (INT4, Device("npu"), "NPU"),
        (INT4, Device("xpu"), None),
        (MXFP4, Device("cpu"), None),
        (MXFP4, H100, None),  # SGLang's Quark MXFP4 MoE runs on AITER only
        (MXFP4, MI300X, None),  # gfx942 has no FP4
        (MXFP4, MI355X, "AITER"),
        (MXFP4, MI355X_NO_AITER, None),
    ],
)
def test_native_kernel_selection(fmt, device, native):
    found = native_kernel(fmt, device)
    assert (found is None) if native is None else (native in found), found


def test_fallback_reason_names_the_problem():
    assert "SGLANG_USE_AITER" in fallback_reason(MXFP4, MI355X_NO_AITER)
    reason = fallback_reason(INT4, V100)
    assert "cuda sm70" in reason and "dequantizes" in reason and "memory" in reason


# In a fresh SGLang process (CPU engine): the registry entries, ROCm's allow-list, and the per-layer dispatch of the
# fallback-aware configs on this CPU and on a fake H100 / MI355X.
SGLANG_CHECK = r"""
import torch
from sglang_kimi.models.quant import fallback as fb, formats as F
fb.install_dequant_fallbacks("sglang.srt.layers.quantization.QUANTIZATION_METHODS")
import sglang.srt.layers.quantization as q
from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
from sglang.srt.layers.quantization.quark.quark import QuarkConfig
ct_cls, quark_cls = q.QUANTIZATION_METHODS["compressed-tensors"], q.QUANTIZATION_METHODS["quark"]
assert issubclass(ct_cls, CompressedTensorsConfig) and ct_cls.__name__ == "KimiCompressedTensorsConfig"
assert issubclass(quark_cls, QuarkConfig) and quark_cls.__name__ == "KimiQuarkConfig"
assert q.CPU_QUANTIZATION_METHODS["quark"] is quark_cls and q.CPU_QUANTIZATION_METHODS["compressed-tensors"] is ct_cls
assert q.get_quantization_config("quark") is quark_cls

# ROCm: _verify_quantization's local allow-list accepts the (overridden) existing names
import sglang.srt.configs.model_config as mc
mc.is_hip = lambda: True
for fmt, name in (("int4", "compressed-tensors"), ("mxfp4", "quark")):
    assert mc.ModelConfig(model_path=VARIANTS[fmt], dtype="float32").quantization == name

from sglang.srt.layers.moe.fused_moe_triton import FusedMoE
from sglang.srt.layers.linear import ReplicatedLinear
def bare(cls):
    layer = object.__new__(cls)
    torch.nn.Module.__init__(layer)
    return layer
moe, linear = bare(FusedMoE), bare(ReplicatedLinear)
ct = ct_cls.from_config(F.int4_quantization_config() | {"packed_modules_mapping": {}})
quark_cfg = F.mxfp4_quantization_config() | {"packed_modules_mapping": {}, "hf_config": None}
quark = quark_cls.from_config(quark_cfg)
name = lambda m: type(m).__name__ if m is not None else None

# this CPU: experts dequantized, excluded layers untouched, float32 accepted
assert name(ct.get_quant_method(moe, "model.layers.1.mlp.experts")) == "DequantFusedMoEMethod"
assert name(ct.get_quant_method(linear, "model.layers.1.mlp.shared_experts.gate_up_proj")) == "UnquantizedLinearMethod"
assert name(quark.get_quant_method(moe, "language_model.model.layers.1.mlp.experts")) == "DequantFusedMoEMethod"
LAYER = "language_model.model.layers.1."
assert name(quark.get_quant_method(linear, LAYER + "self_attn.q_a_proj")) == "UnquantizedLinearMethod"
assert torch.float32 in ct.get_supported_act_dtypes() and torch.float32 in quark.get_supported_act_dtypes()
assert not ct.can_fuse_shared_expert() and not quark.can_fuse_shared_expert()

# a quantized dense layer (amd/Kimi-K2.5-MXFP4 quantizes the shared experts too): dequantized Linear
wide = quark_cls.from_config(F.mxfp4_quantization_config(F.AMD_K25_MXFP4_EXCLUDE)
                             | {"packed_modules_mapping": {}, "hf_config": None})
assert name(wide.get_quant_method(linear, LAYER + "mlp.shared_experts.down_proj")) == "DequantLinearMethod"
wide_ct = ct_cls.from_config(
    F.int4_quantization_config(["re:.*lm_head.*", "re:.*self_attn.*"]) | {"packed_modules_mapping": {}}
)
assert name(wide_ct.get_quant_method(linear, "model.layers.1.mlp.shared_experts.down_proj")) == "DequantLinearMethod"

# a GPU with the native kernel keeps SGLang's methods (SGLang's GPU capability check is skipped on this CPU)
quark_cls._check_scheme_supported = lambda self, *args, **kwargs: True
fb.current_device = lambda: fb.Device("cuda", capability=(9, 0))
assert name(ct.get_quant_method(moe, "model.layers.1.mlp.experts")) == "CompressedTensorsFusedMoEMethod"
assert torch.float32 not in ct.get_supported_act_dtypes()
fb.current_device = lambda: fb.Device("rocm", gfx95=True, aiter=True)
assert name(quark.get_quant_method(moe, "language_model.model.layers.1.mlp.experts")) == "QuarkFusedMoEMethod"
assert name(wide.get_quant_method(linear, LAYER + "mlp.shared_experts.down_proj")) == "QuarkLinearMethod"
# ... and an H100 with an MXFP4 checkpoint falls back
fb.current_device = lambda: fb.Device("cuda", capability=(9, 0))
assert name(quark.get_quant_method(moe, "language_model.model.layers.1.mlp.experts")) == "DequantFusedMoEMethod"
print("OK")
"""


def test_registry_entries_and_per_layer_dispatch(tmp_path):
    from sglang_kimi.assets import TINY_MODEL
    from sglang_kimi.models.quant.formats import FORMATS, write_variant

    variants = {fmt: str(write_variant(TINY_MODEL, tmp_path / fmt, fmt)) for fmt in FORMATS}
    env, _ = sglang_env(cpu=True)
    code = f"VARIANTS = {variants!r}\n" + SGLANG_CHECK
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0 and "OK" in out.stdout, out.stdout[-2000:] + out.stderr[-4000:]
    assert "SGLang has no INT4 compressed-tensors kernel for cpu" in out.stderr  # logged once, with the fix


def test_install_is_the_table_entry():
    from sglang_kimi.plugin import REGISTRATIONS

    entry = next(e for e in REGISTRATIONS if e.name == "kimi-quant-dequant-fallback")
    assert entry.install == "sglang_kimi.models.quant.fallback:install_dequant_fallbacks"
    assert "only" not in entry.when and fallback.REGISTRY_KEYS == {INT4: "compressed-tensors", MXFP4: "quark"}
    assert "ROCm" in entry.why and "kept" in entry.why
