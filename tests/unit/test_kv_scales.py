"""FP8 KV cache scales: the rule, the FP8 round trip, the failure with scale 1.0 and the fix with dynamic scales on
the tiny model, and the plugin's hooks on SGLang's real KV pools (MLA target, MHA drafter) on this CPU.

SGLang's CPU path cannot hold an FP8 KV cache for MLA ("CPU FP8 KV cache is only supported for MHA", and only
with AMX and intel_amx), so no server runs FP8 KV here. What runs instead: SGLang's own ``MLATokenToKVPool`` /
``MHATokenToKVPool`` built with ``float8_e4m3fn`` on the CPU, written through the hooked ``set_kv_buffer`` exactly
as the triton backend (MLA: ``k / layer.k_scale``) and the DFlash worker (MHA: ``k_scale`` argument) call it, and
read back as the kernels do (``stored * k_scale_float``).
"""

import json
import subprocess
import sys

import pytest
import torch
from support.fp8_kv import fp8_load, fp8_store

from sglang_kimi.launcher.server import sglang_env
from sglang_kimi.models import kv_scales as K
from sglang_kimi.speculators.reference.deepseek_v3 import MLA, CompactDeepseekV3

# ---------------------------------------------------------------------------------------------------------------
# The rule


def test_scale_is_the_smallest_power_of_two_that_fits():
    rule = K.ScaleRule(headroom=1.25)
    for amax in (1e-3, 0.7, 300.0, 448.0, 3700.0, 1e6):
        s = rule.scale(amax)
        assert s == 2.0 ** round(torch.log2(torch.tensor(s)).item())
        assert amax * 1.25 / s <= 448.0 < amax * 1.25 / (s / 2)
    assert rule.scale(0.0) == 1.0 and rule.scale(float("nan")) == 1.0


def test_layer_freezes_after_freeze_tokens():
    rule = K.ScaleRule(freeze_tokens=1000, min_tokens=10_000)
    state = K.LayerScale(mla=False)
    growing = [10.0 * 2**i for i in range(10)]
    for i, amax in enumerate(growing):
        state.observe(amax, amax / 2, 250, rule)
        assert state.frozen == (state.tokens >= 1000), i
        if state.frozen:
            break
    frozen = (state.k_scale, state.v_scale)
    assert not state.observe(1e9, 1e9, 250, rule) and (state.k_scale, state.v_scale) == frozen


def test_layer_freezes_when_the_max_stops_growing():
    rule = K.ScaleRule(freeze_tokens=10**9, min_tokens=64, patience=3, growth_tol=0.05)
    state = K.LayerScale(mla=True)
    for amax in (100.0, 200.0, 400.0, 800.0):  # doubling: never stable
        state.observe(amax, amax, 32, rule)
        assert not state.frozen
    for amax in (810.0, 820.0, 800.0):  # within 5% of 800: stable batches 1, 2, 3 (plus the 800 batch)
        state.observe(amax, amax, 32, rule)
    assert state.frozen and state.k_amax == 820.0 and state.k_scale == state.v_scale == rule.scale(820.0)


def test_observe_only_never_freezes():
    state = K.LayerScale(mla=False, freeze=False)
    for _ in range(100):
        state.observe(1.0, 1.0, 10_000, K.RULE)
    assert not state.frozen and state.tokens == 1_000_000


# ---------------------------------------------------------------------------------------------------------------
# The FP8 round trip and re-encoding


def test_scale_one_clips_and_a_fitted_scale_does_not():
    x = torch.randn(4096, 288) * 1000  # large latent values, like outlier channels
    clipped = fp8_load(fp8_store(x, 1.0), 1.0)
    assert clipped.abs().max() == 448.0 and (x.abs() > 448).float().mean() > 0.5
    assert (clipped - x).abs().max() > 2000
    s = K.RULE.scale(x.abs().max().item())
    back = fp8_load(fp8_store(x, s), s)
    normal = x.abs() > s * 2**-6  # FP8 e4m3 normals: 3 mantissa bits, relative error <= 2^-4
    assert ((back - x).abs()[normal] <= x.abs()[normal] * 2**-4).all()


def test_reencode_is_exact_for_power_of_two_ratios():
    x = torch.randn(1000, 64) * 50
    stored = fp8_store(x, 0.25).view(torch.uint8).clone()  # the pool's uint8 storage
    before = fp8_load(stored.view(torch.float8_e4m3fn), 0.25)
    K.reencode_(stored, torch.float8_e4m3fn, 0.25 / 2.0, chunk=300)  # scale 0.25 -> 2.0
    after = fp8_load(stored.view(torch.float8_e4m3fn), 2.0)
    normal = before.abs() >= 2.0 * 2**-6
    assert torch.equal(after[normal], before[normal])
    assert ((after - before).abs() <= 2.0 * 2**-9).all()  # only values pushed into subnormals move, by < 1 ulp


# ---------------------------------------------------------------------------------------------------------------
# Scale files


def _document(tmp_path, **overrides):
    layers = {
        K.TARGET: {
            i: K.LayerScale(
                mla=True,
                k_amax=1000.0 * (i + 1),
                v_amax=900.0,
                k_scale=4.0 * (i + 1),
                v_scale=4.0 * (i + 1),
                frozen=True,
            )
            for i in range(3)
        },
        K.DRAFT: {0: K.LayerScale(mla=False, k_amax=30.0, v_amax=2000.0, k_scale=0.125, v_scale=8.0)},
    }
    doc = K.scales_document(layers, K.RULE, {K.TARGET: "KimiK25ForConditionalGeneration", K.DRAFT: "DFlash"})
    doc.update(overrides)
    path = tmp_path / "kv_scales.json"
    path.write_text(json.dumps(doc))
    return path


def test_scale_file_round_trip(tmp_path):
    scales = K.read_scales(_document(tmp_path))
    assert scales[K.TARGET] == {0: (4.0, 4.0), 1: (8.0, 8.0), 2: (12.0, 12.0)}
    assert scales[K.DRAFT] == {0: (0.125, 8.0)}


def test_scale_file_errors_name_the_fix(tmp_path):
    with pytest.raises(K.KVScalesError, match="calibrate-kv --out"):
        K.read_scales(tmp_path / "missing.json")
    with pytest.raises(K.KVScalesError, match="not a KV scale file"):
        K.read_scales(_document(tmp_path, format="something else"))
    bad = json.loads(_document(tmp_path).read_text())
    bad["target"]["layers"]["1"]["k_scale"] = 0.0
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(K.KVScalesError, match="invalid scales"):
        K.read_scales(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "setting, kv, draft_kv, refused",
    [
        ("kv_scales.json", "auto", None, True),  # the file was left unused
        ("kv_scales.json", "bf16", "bf16", True),
        ("dynamic", "bfloat16", None, True),  # asked for explicitly
        ("kv_scales.json", "fp8_e4m3", None, False),
        ("kv_scales.json", "fp8_e4m3", "bf16", False),  # the target's cache uses it
        ("kv_scales.json", "bf16", "fp8_e4m3", False),  # the drafter's cache uses it
        ("dynamic", "fp8_e5m2", None, False),
        ("", "auto", None, False),  # unset: dynamic is only the FP8 default
        ("observe", "auto", None, False),  # observing works with any dtype
        ("off", "bf16", None, False),
    ],
)
def test_scales_without_an_fp8_cache_are_refused(monkeypatch, setting, kv, draft_kv, refused):
    """A scale file (or `dynamic`) with no FP8 KV cache was silently unused: the launch is refused, naming the fixes."""
    monkeypatch.setenv(K.ENV, setting)
    if not refused:
        K.check_kv_dtype(kv, draft_kv)
        return
    with pytest.raises(K.KVScalesError) as error:
        K.check_kv_dtype(kv, draft_kv)
    message = str(error.value)
    assert f"{K.ENV}={setting}" in message and f"--kv-cache-dtype {kv}" in message
    assert "--kv-cache-dtype fp8_e4m3" in message and f"unset {K.ENV}" in message
    assert ("--speculative-draft-kv-cache-dtype" in message) == (draft_kv is not None)


@pytest.mark.parametrize(
    "setting, kv, backends, mla, refused",
    [
        ("kv_scales.json", "fp8_e4m3", {"flashinfer"}, True, True),  # FlashInfer-MLA ignores layer.k_scale
        ("dynamic", "fp8_e4m3", {"triton", "fa3"}, True, True),  # a prefill / decode split, one unaware
        ("kv_scales.json", "fp8_e4m3", {"triton"}, True, False),
        ("kv_scales.json", "fp8_e4m3", {"flashinfer"}, False, False),  # MHA targets: the pools divide
        ("", "fp8_e4m3", {"flashinfer"}, True, False),  # the default: logged at load, not refused
        ("observe", "fp8_e4m3", {"flashinfer"}, True, False),
        ("kv_scales.json", "bf16", {"flashinfer"}, True, False),  # no FP8 cache: check_kv_dtype's case
        ("kv_scales.json", "fp8_e4m3", {None}, True, False),  # unresolved: left to the load-time warning
    ],
)
def test_scales_an_mla_backend_would_ignore_are_refused(monkeypatch, setting, kv, backends, mla, refused):
    """The target's MLA latent cache is scaled only by the triton backend: with another one, a scale file served
    FP8 with scale 1.0 (a warning at load)."""
    monkeypatch.setenv(K.ENV, setting)
    if not refused:
        K.check_mla_backends(kv, backends, mla)
        return
    with pytest.raises(K.KVScalesError) as error:
        K.check_mla_backends(kv, backends, mla)
    message = str(error.value)
    assert f"{K.ENV}={setting}" in message and "--attention-backend triton" in message and f"unset {K.ENV}" in message
    assert all(b in message for b in backends if b != "triton")


@pytest.mark.parametrize("draft_kv, expected", [(None, "fp8_e4m3"), ("bf16", "bf16"), ("auto", "auto")])
def test_each_model_is_set_up_for_its_own_pool_dtype(monkeypatch, draft_kv, expected):
    """SGLang hands the target's --kv-cache-dtype to the drafter's runner too; the drafter's pool follows
    --speculative-draft-kv-cache-dtype when given, and its scales must follow the pool."""
    import sglang.srt.runtime_context as context

    monkeypatch.setattr(
        context, "get_server_args", lambda: type("Args", (), {"speculative_draft_kv_cache_dtype": draft_kv})()
    )
    seen = {}
    monkeypatch.setattr(K, "setup_model", lambda model, dtype: seen.setdefault(K.model_role(model), dtype))

    def load(*, model, kv_cache_dtype):
        return None

    for arch in ("KimiK25ForConditionalGeneration", "DFlashDraftModel"):
        model = type("Model", (), {"config": type("Config", (), {"architectures": [arch]})()})()
        K._after_load_kv_cache_scales(load, model=model, kv_cache_dtype="fp8_e4m3")
    assert seen == {K.TARGET: "fp8_e4m3", K.DRAFT: expected}


# ---------------------------------------------------------------------------------------------------------------
# The tiny Kimi model with an FP8 latent cache: scale 1.0 breaks it, dynamic scales keep it close to BF16 KV


def _keys_values_through(attn, cache):
    """``attn.keys_values`` with the cached row made explicit: [normed latent (256) | roped key (32)] passes through
    ``cache`` (the KV cache's storage) before it serves as K (all of it) and V (the latent, through kv_b_proj)."""
    return lambda rows: MLA.keys_values(attn, cache(rows))  # rows [b, s, 288]


@pytest.fixture(scope="module")
def large_latent_model():
    """The tiny model with its latent scaled by 1000 (kv_a_layernorm x 1000, kv_b_proj / 1000): the same function
    in float, latent values in the thousands, as in models with outlier channels."""
    from transformers import PreTrainedTokenizerFast

    from sglang_kimi.assets import TINY_MODEL

    model = CompactDeepseekV3.from_pretrained(TINY_MODEL)
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.kv_a_layernorm.weight.mul_(1000)
            layer.self_attn.kv_b_proj.weight.div_(1000)
    tok = PreTrainedTokenizerFast.from_pretrained(str(TINY_MODEL))
    text = (
        "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?\nAnswer: Natalia sold 48/2 = 24 clips in May."
    )
    return model, torch.tensor([tok(text)["input_ids"]])


def _logprobs(model, ids, make_cache):
    for i, layer in enumerate(model.layers):
        layer.self_attn.keys_values = _keys_values_through(layer.self_attn, make_cache(i))
    with torch.no_grad():
        return torch.log_softmax(model(ids).float(), -1)[0]  # [T, V]


def test_fp8_kv_with_scale_one_is_wrong_and_dynamic_scales_fix_it(large_latent_model):
    model, ids = large_latent_model
    reference = _logprobs(model, ids, lambda i: lambda row: row)  # float32 KV
    bf16 = _logprobs(model, ids, lambda i: lambda row: row.to(torch.bfloat16).float())
    seen = {}

    def scale_one(i):
        def cache(row):
            seen[i] = row.abs().max().item()
            return fp8_load(fp8_store(row, 1.0), 1.0)

        return cache

    one = _logprobs(model, ids, scale_one)
    states = {}

    def dynamic(i):  # what the pool hook does on a prefill write: observe, then store with the layer's scale
        state = states.setdefault(i, K.LayerScale(mla=True))

        def cache(row):
            state.observe(row.abs().max().item(), row[..., :256].abs().max().item(), row.shape[1], K.RULE)
            return fp8_load(fp8_store(row, state.k_scale), state.k_scale)

        return cache

    scaled = _logprobs(model, ids, dynamic)

    def stats(lp):
        return (
            (lp - reference).abs().max().item(),
            (lp.argmax(-1) == reference.argmax(-1)).float().mean().item(),
            (reference.exp() * (reference - lp)).sum(-1).mean().item(),
        )

    assert min(seen.values()) > 448  # every layer's latent exceeds the e4m3 range
    err_bf16, top1_bf16, _ = stats(bf16)
    err_one, top1_one, kl_one = stats(one)
    err_dyn, top1_dyn, kl_dyn = stats(scaled)
    print(
        f"bf16 KV: max err {err_bf16:.3g}, top-1 {top1_bf16:.3f}; fp8 scale 1.0: max err {err_one:.3g}, "
        f"top-1 {top1_one:.3f}, KL {kl_one:.3g}; fp8 dynamic: max err {err_dyn:.3g}, top-1 {top1_dyn:.3f}, "
        f"KL {kl_dyn:.3g}; scales {sorted({s.k_scale for s in states.values()})}"
    )
    assert top1_bf16 == 1.0 and err_bf16 < 0.05
    assert err_one > 1.0 and top1_one < 0.8  # measurably wrong: clipped latents
    # e4m3 keeps 3 mantissa bits (~6% steps): close to BF16 KV means the same top-1 tokens and a KL two orders
    # of magnitude below the clipped cache's, not BF16's own error
    assert err_dyn < err_one / 10 and top1_dyn >= 0.95 and kl_dyn < 1e-3 and kl_dyn < kl_one / 100
    assert all(s.k_scale == s.v_scale > 1.0 for s in states.values())


# ---------------------------------------------------------------------------------------------------------------
# The plugin's hooks on SGLang's real pools (a fresh SGLang process, CPU engine)

SGLANG_POOLS = r"""
import json, os, sys, types
import torch
from sglang.srt.runtime_context import get_parallel
get_parallel().override_permanently(dcp_enabled=False)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_kimi.models import kv_scales as K
from sglang_kimi import plugin

for name in ("kimi-fp8-kv-scales", "kimi-kv-observe-mla", "kimi-kv-observe-mha"):
    entry = next(e for e in plugin.REGISTRATIONS if e.name == name)
    assert plugin._load(entry.install)(entry.target) is None
HookRegistry.apply_hooks()
K._mla_backend_ok = lambda role: True  # the triton backend is the scale-aware one; no backend runs here
FP8 = torch.float8_e4m3fn

def model(arch, layers, mla):
    # attention modules are SGLang RadixAttentions; MLA layers have two, like DeepSeek's attn_mqa (absorbed: writes
    # the latent cache) and attn_mha, sharing one layer id
    m = torch.nn.Module()
    m.config = types.SimpleNamespace(architectures=[arch], kv_lora_rank=256 if mla else None)
    attn, siblings = [], []
    for i in range(layers):
        for copy in range(2 if mla else 1):
            a = object.__new__(RadixAttention); torch.nn.Module.__init__(a); a.layer_id = i
            a.k_scale = a.v_scale = a.k_scale_float = a.v_scale_float = None
            (attn if copy == 0 else siblings).append(a)
    m.attn = torch.nn.ModuleList(attn + siblings)
    m.siblings = siblings
    return m, attn

torch.manual_seed(0)
report = {}
# --- target: MLA latent rows, dynamic scales, two prefill batches whose maximum grows 8x
target, t_layers = model("KimiK25ForConditionalGeneration", 2, mla=True)
assert K.setup_model(target, "fp8_e4m3", env_mode="dynamic") == "dynamic"
pool = MLATokenToKVPool(size=512, page_size=1, dtype=FP8, kv_lora_rank=256, qk_rope_head_dim=32, layer_num=2,
                        device="cpu", enable_memory_saver=False)
rows = [torch.randn(100, 1, 288) * 250, torch.randn(100, 1, 288) * 2000]
locs = [torch.arange(1, 101), torch.arange(101, 201)]
layer = t_layers[0]
for row, loc in zip(rows, locs):  # the triton backend: k / layer.k_scale, then set_kv_buffer
    pool.set_kv_buffer(layer, loc, row.clone().div_(layer.k_scale), row[..., :256])
    report.setdefault("mla_scales", []).append(layer.k_scale_float)
stored = pool.get_key_buffer(0)[torch.cat(locs)].float() * layer.k_scale_float  # what the kernels read
truth = torch.cat(rows)
normal = truth.abs() > layer.k_scale_float * 2**-6
report["mla_rel_err"] = ((stored - truth).abs()[normal] / truth.abs()[normal]).max().item()
report["mla_v_equals_k"] = layer.v_scale_float == layer.k_scale_float
report["sibling_scale"] = target.siblings[0].k_scale_float  # attn_mha of layer 0 follows attn_mqa's scale
# the same writes with SGLang's default (no scales): clipped
plain = MLATokenToKVPool(size=512, page_size=1, dtype=FP8, kv_lora_rank=256, qk_rope_head_dim=32, layer_num=2,
                         device="cpu", enable_memory_saver=False)
class Bare: layer_id = 1
for row, loc in zip(rows, locs):
    plain.set_kv_buffer(Bare(), loc, row.clone(), row[..., :256])
report["unscaled_abs_err"] = (plain.get_key_buffer(1)[torch.cat(locs)].float() - truth).abs().max().item()

# --- drafter: MHA K and V with their own scales, written like DFlash's sequential context path
draft, d_layers = model("DFlashDraftModel", 1, mla=False)
assert K.setup_model(draft, "fp8_e4m3", env_mode="dynamic") == "dynamic"
mha = MHATokenToKVPool(size=512, page_size=1, dtype=FP8, head_num=2, head_dim=64, layer_num=1, device="cpu",
                       enable_memory_saver=False)
k, v = torch.randn(64, 2, 64) * 30, torch.randn(64, 2, 64) * 3000
dl = d_layers[0]
mha.set_kv_buffer(dl, torch.arange(1, 65), k.clone(), v.clone(), dl.k_scale, dl.v_scale)
kb = mha.get_key_buffer(0)[1:65].float() * dl.k_scale_float
vb = mha.get_value_buffer(0)[1:65].float() * dl.v_scale_float
report["mha_scales"] = [dl.k_scale_float, dl.v_scale_float]
report["mha_rel_err"] = max(((kb - k).abs() / k.abs().clamp(min=dl.k_scale_float * 2**-6)).max().item(),
                            ((vb - v).abs() / v.abs().clamp(min=dl.v_scale_float * 2**-6)).max().item())

# --- snapshot: both roles, as /server_info reports them
snap = K.snapshot()
report["roles"] = sorted(r for r in ("target", "draft") if r in snap)
report["target_layers"] = sorted(snap["target"]["layers"])
report["snapshot_amax"] = snap["target"]["layers"]["0"]["k_amax"]
report["true_amax"] = truth.abs().max().item()

# --- a scale file: applied at load, frozen, both roles
path = sys.argv[1]
target2, t2 = model("KimiK25ForConditionalGeneration", 3, mla=True)
assert K.setup_model(target2, "fp8_e4m3", env_mode=path) == "file"
draft2, d2 = model("DFlashDraftModel", 1, mla=False)
assert K.setup_model(draft2, "fp8_e4m3", env_mode=path) == "file"
report["file_scales"] = [t2[1].k_scale_float, t2[1].v_scale_float, d2[0].k_scale_float, d2[0].v_scale_float]
filepool = MLATokenToKVPool(size=64, page_size=1, dtype=FP8, kv_lora_rank=256, qk_rope_head_dim=32, layer_num=3,
                            device="cpu", enable_memory_saver=False)
filepool.set_kv_buffer(t2[1], torch.arange(1, 11), torch.randn(10, 1, 288) * 1e5, torch.randn(10, 1, 256))
report["file_scale_after_write"] = t2[1].k_scale_float
try:
    K.setup_model(model("KimiK25ForConditionalGeneration", 5, mla=True)[0], "fp8_e4m3", env_mode=path)
except K.KVScalesError as exc:
    report["missing_layers_error"] = str(exc)

# --- CUDA graphs bake the scale: dynamic mode refuses and keeps 1.0
K._cuda_graphs_enabled = lambda: True
report["with_graphs"] = K.setup_model(model("KimiK25ForConditionalGeneration", 1, mla=True)[0], "fp8_e4m3",
                                      env_mode="dynamic")
# --- bf16 KV: nothing to do unless observing
report["bf16_dynamic"] = K.setup_model(model("KimiK25ForConditionalGeneration", 1, mla=True)[0], "auto",
                                       env_mode="dynamic")
print("REPORT=" + json.dumps(report))
"""


def test_dynamic_and_file_scales_on_sglangs_pools(tmp_path):
    path = _document(tmp_path)
    env, _ = sglang_env(cpu=True)
    out = subprocess.run(
        [sys.executable, "-c", SGLANG_POOLS, str(path)], env=env, capture_output=True, text=True, timeout=900
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("REPORT=")), None)
    assert out.returncode == 0 and line, out.stdout[-2000:] + out.stderr[-4000:]
    r = json.loads(line[len("REPORT=") :])
    # MLA: the scale grew with the second batch (250 -> 2000 sigma), the first batch was re-encoded, K == V scale
    first, second = r["mla_scales"]
    assert second >= 4 * first and r["mla_v_equals_k"] and r["sibling_scale"] == second
    assert r["snapshot_amax"] == pytest.approx(r["true_amax"], rel=1e-6)  # /server_info reports the written rows
    assert r["mla_rel_err"] <= 2**-4 + 1e-6, r  # e4m3 relative precision over the whole cache, both batches
    assert r["unscaled_abs_err"] > 1000  # SGLang's default scale 1.0 clips the same rows at 448
    # MHA drafter: K and V each get their own scale
    k_scale, v_scale = r["mha_scales"]
    assert v_scale >= 64 * k_scale and r["mha_rel_err"] <= 2**-4 + 1e-6, r
    assert r["roles"] == ["draft", "target"] and r["target_layers"] == ["0", "1"]
    # a file: target and drafter layers get its scales, which stay frozen through writes
    assert r["file_scales"] == [8.0, 8.0, 0.125, 8.0] and r["file_scale_after_write"] == 8.0
    assert "no scales for target layers [3, 4]" in r["missing_layers_error"]
    assert r["with_graphs"] == "dynamic refused (CUDA graphs)"
    assert "--cuda-graph-backend-decode disabled" in out.stderr and "calibrate-kv" in out.stderr
    assert r["bf16_dynamic"] == "off"


# ---------------------------------------------------------------------------------------------------------------
# calibrate-kv: one error line naming the problem and the fix


def _calibrate(capsys, *args) -> tuple[int, str]:
    from sglang_kimi.cli import main as cli

    code = cli.main(["calibrate-kv", *args])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-prompts", "0"], "--num-prompts 0: give 1 or more"),
        (["--max-new-tokens", "-1"], "--max-new-tokens -1: give 1 or more"),
        (["--concurrency", "0"], "--concurrency 0: give 1 or more"),
        (["--headroom", "0.5"], "--headroom 0.5: give 1 or more (below 1 the scales clip"),
        (["--headroom", "nan"], "--headroom nan"),
    ],
)
def test_calibrate_kv_bad_numbers_refused_before_any_request(capsys, tmp_path, flags, message):
    # the URL answers nothing: a check made after contacting the server would report that instead
    code, line = _calibrate(capsys, "--base-url", "http://127.0.0.1:1", "--out", str(tmp_path / "s.json"), *flags)
    assert code == 2 and message in line


def test_calibrate_kv_errors(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "")  # no API key in this process
    from support.fake_servers import serve, sglang_payloads

    from sglang_kimi.launcher.checks import free_port

    data = tmp_path / "gsm8k"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"question": "How many?", "answer": "#### 1"}) + "\n")
    out = str(tmp_path / "s.json")
    code, line = _calibrate(
        capsys, "--base-url", f"http://127.0.0.1:{free_port()}", "--out", out, "--data-dir", str(data)
    )
    assert code == 2 and "cannot reach" in line and "connection refused" in line and "--base-url" in line
    code, line = _calibrate(capsys, "--base-url", "http://x", "--out", out, "--data-dir", str(tmp_path))
    assert code == 2 and "has no train.jsonl" in line and "--data-dir" in line
    payloads = sglang_payloads()
    with serve(payloads) as url:
        code, line = _calibrate(capsys, "--base-url", url, "--out", out, "--data-dir", str(data))
        assert code == 2 and "does not run the sglang-kimi plugin" in line
        # host:port and an OpenAI base URL (.../v1/) reach the same server, as in eval and bench
        for spelling in (url.removeprefix("http://"), url + "/v1/"):
            code, line = _calibrate(capsys, "--base-url", spelling, "--out", out, "--data-dir", str(data))
            assert code == 2 and "does not run the sglang-kimi plugin" in line, spelling
    with serve(payloads, api_key="k1") as url:
        code, line = _calibrate(capsys, "--base-url", url, "--out", out, "--data-dir", str(data))
        assert code == 2 and "the server wants an API key (HTTP 401" in line and "--api-key KEY" in line
    payloads[("GET", "/server_info")]["internal_states"] = [{"sglang_kimi": {"kv_scales": {"mode": "dynamic"}}}]
    with serve(payloads) as url:
        code, line = _calibrate(capsys, "--base-url", url, "--out", out, "--data-dir", str(data))
        assert code == 2 and "does not record its KV data" in line and "SGLANG_KIMI_KV_SCALES=observe" in line


def test_calibrate_kv_checks_before_sending_prompts(capsys, tmp_path, monkeypatch):
    """An unusable --out, an unreachable server and a server that refuses requests each end with one error line;
    the first two before any prompt is loaded or sent (no hub download, no wasted generation)."""
    monkeypatch.setenv("OPENAI_API_KEY", "")
    from support.fake_servers import serve, sglang_payloads

    from sglang_kimi.launcher.checks import free_port
    from sglang_kimi.models import kv_calibration

    def no_hub(data_dir, limit):
        assert data_dir is not None, "the hub was contacted before the server and --out were checked"
        return ["Question: How many?\nAnswer:"]

    monkeypatch.setattr(kv_calibration, "calibration_prompts", no_hub)
    folder = tmp_path / "scales"
    folder.mkdir()
    code, line = _calibrate(capsys, "--base-url", "http://127.0.0.1:1", "--out", str(folder))
    assert code == 2 and f"--out {folder} is a folder" in line
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, line = _calibrate(capsys, "--base-url", "http://127.0.0.1:1", "--out", str(blocker / "s.json"))
    assert code == 2 and "cannot create its folder" in line and "writable path" in line
    out = tmp_path / "new" / "s.json"
    code, line = _calibrate(capsys, "--base-url", f"http://127.0.0.1:{free_port()}", "--out", str(out))
    assert code == 2 and "cannot reach" in line and "--base-url" in line
    assert not out.exists()

    payloads = sglang_payloads()
    state = {"mode": "observe", "target": {"layers": {"0": {"mla": True, "k_amax": 1.0, "v_amax": 1.0, "tokens": 3}}}}
    payloads[("GET", "/server_info")]["internal_states"] = [{"sglang_kimi": {"kv_scales": state}}]
    payloads.pop(("POST", "/generate"), None)  # the fake server answers 404: a refused calibration request
    with serve(payloads) as url:
        code, line = _calibrate(capsys, "--base-url", url, "--out", str(out), "--data-dir", str(tmp_path))
    assert code == 2 and "refused a calibration request (HTTP 404" in line
    assert not out.exists()


def test_cuda_graph_phases_read_from_sglangs_resolved_config():
    """Dynamic scales need no CUDA graph in any phase: every spelling SGLang resolves into ``cuda_graph_config``
    (per-phase backends, the older --disable-cuda-graph) is read from there, not from the legacy boolean alone."""
    from types import SimpleNamespace as NS

    from sglang_kimi.models.kv_scales import cuda_graph_phases_on

    def config(decode, prefill):
        return NS(decode=NS(backend=decode), prefill=NS(backend=prefill))

    assert cuda_graph_phases_on(config("disabled", "disabled"), False) == []  # --cuda-graph-backend-* disabled
    assert cuda_graph_phases_on(config("disabled", "breakable"), True) == ["prefill"]  # the config, not the boolean
    assert cuda_graph_phases_on(config("full", "disabled"), False) == ["decode"]
    assert cuda_graph_phases_on(config("full", "breakable"), False) == ["decode", "prefill"]
    # no published config (an SGLang without one): the legacy flag decides
    assert cuda_graph_phases_on(None, True) == []
    assert cuda_graph_phases_on(None, False) == ["decode", "prefill"]


CUDA_GRAPHS_CHECK = """
from unittest import mock
from sglang.srt import runtime_context as rc
from sglang.srt.server_args import ServerArgs
from sglang_kimi.models import kv_scales as K
seen = []
for kwargs in ({}, {"disable_cuda_graph": True}):
    rc.publish(ServerArgs(model_path="dummy", **kwargs), role="test", ranks=rc.SpawnRanks(world_rank=0))
    with mock.patch("torch.cuda.is_available", return_value=True):
        seen.append(K._cuda_graphs_enabled())
    rc.reset_context()
print(seen)
"""


def test_cuda_graphs_read_from_sglangs_published_context():
    """On a CUDA device the dynamic-scale check reads the server arguments SGLang published for the process (every
    supported release retired ``get_global_server_args()``, which only raises): graphs on by default, off with the
    legacy flag. A fresh process, SGLang's serving modules imported with the CPU shims."""
    import os
    import subprocess
    import sys

    from sglang_kimi.launcher.server import SHIMS_DIR

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SHIMS_DIR), os.environ.get("PYTHONPATH")]))}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run(
        [sys.executable, "-c", CUDA_GRAPHS_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[True, False]"
