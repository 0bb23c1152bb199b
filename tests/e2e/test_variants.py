"""Kimi-K2.6 quantized variants served by real SGLang on CPU with the plugin's dequantizing fallback, checked
against transformers' DeepseekV3 loaded with the dequantized weights (float32).

Three variants of the embedded tiny model, written by ``scripts/make_variants.py``'s functions into a temporary
folder and served at the same time (start-up dominates the runtime):

- ``int4``: Kimi-K2.6's INT4 compressed-tensors pack-quantized layout (routed experts);
- ``mxfp4``: the Kimi-K2.6 MXFP4 Quark layout (routed experts);
- ``mxfp4-amd-k25``: amd/Kimi-K2.5-MXFP4's wider layout (shared experts and the dense layer-0 MLP too: the
  Linear fallback, fused gate/up shards included).

Tolerance: |logprob(SGLang) - logprob(reference)| < 1e-3 for every prompt and generated token (float32 on both
sides; measured ~2e-6), and the greedy continuation equals the reference's.

The ``int4`` server also runs with ``SGLANG_KIMI_KV_SCALES=observe``: ``sglang-kimi calibrate-kv`` is run against
it and the per-layer maxima it writes are checked against the latent rows the reference computes for the same
tokens (and observing must not change the served logprobs).
"""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch
from support.data import GSM8K_DIR
from support.hf_reference import load_hf_reference
from support.served_logprobs import compare_logprobs

from sglang_kimi.assets import TINY_MODEL
from sglang_kimi.cli import main as cli
from sglang_kimi.launcher.server import (
    ANY_PORT,
    LaunchError,
    ServerProcess,
    fetch_plugin_state,
    group_alive,
    launch_command,
)
from sglang_kimi.models import kv_calibration, kv_scales
from sglang_kimi.models.quant import formats
from sglang_kimi.speculators.reference.deepseek_v3 import CompactDeepseekV3

pytestmark = pytest.mark.e2e

VARIANTS = ("int4", "mxfp4", "mxfp4-amd-k25")
LOGPROB_TOLERANCE = 1e-3
START_TIMEOUT = 900.0
PROMPT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:"
)
DATA_DIR = GSM8K_DIR
HEALTH_CHECK_IDS = [0]  # SGLang's /health generates one token from input_ids [0]: that row is observed too
FALLBACK_LOG = {
    "int4": "SGLang has no INT4 compressed-tensors kernel for cpu",
    "mxfp4": "SGLang has no MXFP4 Quark kernel for cpu",
}


@pytest.fixture(scope="module")
def variant_servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    paths = {name: formats.write_named_variant(TINY_MODEL, root / name, name) for name in VARIANTS}

    def launch(name):
        spec = launch_command(["--model-path", str(paths[name])], port=ANY_PORT)
        if name == "int4":
            spec.env[kv_scales.ENV] = "observe"
        server = ServerProcess(spec, root / f"{name}.log")
        try:
            server.wait_ready(START_TIMEOUT)
        except LaunchError:
            server.stop()
            raise
        return server

    with ThreadPoolExecutor(len(VARIANTS)) as pool:
        futures = {name: pool.submit(launch, name) for name in VARIANTS}
        servers, errors = {}, []
        for name, future in futures.items():
            try:
                servers[name] = future.result()
            except Exception as exc:  # stop the others before reporting
                errors.append(f"{name}: {exc}")
    try:
        if errors:
            raise RuntimeError("\n".join(errors))
        yield {name: (servers[name], paths[name], root / f"{name}.log") for name in VARIANTS}
    finally:
        for server in servers.values():
            server.stop()
            assert not group_alive(server.pgid)


def _latent_amax(model: CompactDeepseekV3, sequences: list[list[int]]) -> list[float]:
    """Per layer, max |x| over the MLA cache rows [normed latent | roped key] the reference computes for every
    token of ``sequences`` (what SGLang writes to its latent KV cache)."""
    amax = [0.0] * len(model.layers)
    for ids in sequences:
        x = model.embed_tokens(torch.tensor([ids]))  # [1, s, H]
        cos, sin = model.cos_sin(torch.arange(len(ids)), x.dtype)
        for i, layer in enumerate(model.layers):
            rows = layer.self_attn.latent_rows(layer.input_layernorm(x), cos, sin)  # [1, s, kv_lora + rope]
            amax[i] = max(amax[i], rows.abs().max().item())
            x = layer(x, cos, sin)
    return amax


def test_calibrate_kv_records_the_real_latent_maxima(variant_servers, tmp_path, capsys):
    """Runs first on the int4 server (observe mode): before it, only SGLang's health check wrote KV rows."""
    server, path, _ = variant_servers["int4"]
    out = tmp_path / "kv_scales.json"
    argv = [
        "calibrate-kv",
        "--base-url",
        server.base_url,
        "--out",
        str(out),
        "--data-dir",
        str(DATA_DIR),
        "--num-prompts",
        "3",
        "--max-new-tokens",
        "8",
        "--concurrency",
        "3",
    ]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "calibrated on 3 prompts" in printed and "kv_scales.json" in printed
    assert "calibration prompts" in captured.err and "3/3" in captured.err  # the progress bar
    doc = json.loads(out.read_text())
    assert doc["format"] == kv_scales.FORMAT and "draft" not in doc
    layers = doc["target"]["layers"]
    assert sorted(layers, key=int) == [str(i) for i in range(6)]
    assert kv_scales.read_scales(out)["target"].keys() == set(range(6))

    # the same prompts again (greedy: identical tokens), to know every token the server wrote
    prompts = kv_calibration.calibration_prompts(DATA_DIR, 3)
    _, sequences = kv_calibration.calibrate(server.base_url, prompts, max_new_tokens=8)
    with torch.no_grad():
        model = CompactDeepseekV3.from_pretrained(formats.dequantize_checkpoint(path, tmp_path / "reference"))
        expected = _latent_amax(model, [s[:-1] for s in sequences] + [HEALTH_CHECK_IDS])  # last token: never written
    for i, e in enumerate(expected):
        entry = layers[str(i)]
        assert entry["mla"] and entry["k_amax"] == entry["v_amax"]
        assert abs(entry["k_amax"] - e) <= 1e-3 * e, (i, entry["k_amax"], e)
        assert entry["k_scale"] == entry["v_scale"] == kv_scales.RULE.scale(entry["k_amax"])
        assert entry["k_amax"] * kv_scales.RULE.headroom / entry["k_scale"] <= kv_scales.FP8_E4M3_MAX
    assert json.loads(out.read_text())["target"]["layers"]["0"]["tokens"] > 0


def test_calibrate_kv_refuses_a_server_that_does_not_observe(variant_servers, tmp_path, capsys):
    server = variant_servers["mxfp4"][0]
    argv = [
        "calibrate-kv",
        "--base-url",
        server.base_url,
        "--out",
        str(tmp_path / "x.json"),
        "--data-dir",
        str(DATA_DIR),
        "--num-prompts",
        "1",
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "does not record its KV data" in err and "SGLANG_KIMI_KV_SCALES=observe" in err


def _reference(path, tmp_path):
    ref = formats.dequantize_checkpoint(path, tmp_path / "reference")
    return load_hf_reference(ref)


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_logprobs_match_the_dequantized_reference(variant_servers, name, tmp_path):
    server, path, log = variant_servers[name]
    fmt = formats.VARIANTS[name][0]
    state = fetch_plugin_state(server.base_url)
    assert state["registrations"]["kimi-quant-dequant-fallback"] == "ok"
    assert FALLBACK_LOG[fmt] in log.read_text()

    model, tokenizer = _reference(path, tmp_path)
    compared = compare_logprobs(server.base_url, model, tokenizer, PROMPT, timeout=600)
    error = compared.error()
    print(f"{name}: max |logprob - reference| = {error:.2e} over {len(compared.served)} tokens")
    assert error < LOGPROB_TOLERANCE, error
    assert compared.reference_greedy() == compared.output_ids  # teacher-forced argmax = the reference's greedy


def test_quantization_is_not_a_no_op(variant_servers):
    """The variants differ from the bf16 model and from each other: the packed weights really were used."""
    outputs = {}
    for name, (server, _, _) in variant_servers.items():
        body = {
            "text": PROMPT,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        }
        meta = requests.post(server.base_url + "/generate", json=body, timeout=600).json()["meta_info"]
        outputs[name] = [lp for lp, _, _ in meta["input_token_logprobs"][1:]]
    for a in VARIANTS:
        for b in VARIANTS:
            if a < b:
                assert max(abs(x - y) for x, y in zip(outputs[a], outputs[b])) > 1e-3, (a, b)
