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
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
import torch

from sglang_kimi.models.quant import formats
from sglang_kimi.models.tiny import TINY_MODEL_DIR, load_hf_reference
from sglang_kimi.server import free_port, group_alive, plugin_state, start_server

pytestmark = pytest.mark.e2e

VARIANTS = ("int4", "mxfp4", "mxfp4-amd-k25")
LOGPROB_TOLERANCE = 1e-3
START_TIMEOUT = 900.0
PROMPT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:"
)
FALLBACK_LOG = {"int4": "SGLang has no INT4 compressed-tensors kernel for cpu",
                "mxfp4": "SGLang has no MXFP4 Quark kernel for cpu"}


@pytest.fixture(scope="module")
def variant_servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants")
    paths = {name: formats.write_named_variant(TINY_MODEL_DIR, root / name, name) for name in VARIANTS}

    def launch(name):
        # a larger static fraction than the default 0.05: weights are dequantized after the memory baseline
        args = ["--model-path", str(paths[name]), "--mem-fraction-static", "0.3"]
        return start_server(args, port=free_port(), log_path=root / f"{name}.log", timeout=START_TIMEOUT)

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


def _reference(path, tmp_path):
    ref = formats.dequantize_checkpoint(path, tmp_path / "reference")
    return load_hf_reference(ref)


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_logprobs_match_the_dequantized_reference(variant_servers, name, tmp_path):
    server, path, log = variant_servers[name]
    fmt = formats.VARIANTS[name][0]
    state = plugin_state(server.base_url)
    assert state["registrations"]["kimi-quant-dequant-fallback"] == "ok"
    assert FALLBACK_LOG[fmt] in log.read_text()

    model, tokenizer = _reference(path, tmp_path)
    ids = tokenizer(PROMPT)["input_ids"]
    out = requests.post(
        server.base_url + "/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 16, "temperature": 0.0},
            "return_logprob": True,
            "logprob_start_len": 0,
        },
        timeout=600,
    ).json()
    prefill = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"]][1:]  # the first token has none
    decode = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
    tokens = torch.tensor([ids + out["output_ids"]])
    with torch.no_grad():
        reference = torch.log_softmax(model(tokens).logits.float(), dim=-1)[0]  # [T, V]
    expected = reference[:-1].gather(1, tokens[0, 1:, None])[:, 0]  # [T-1]
    got = torch.tensor(prefill + decode)
    error = (got - expected).abs().max().item()
    print(f"{name}: max |logprob - reference| = {error:.2e} over {len(got)} tokens")
    assert error < LOGPROB_TOLERANCE, error
    greedy = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids):].tolist()
    assert greedy == out["output_ids"]


def test_quantization_is_not_a_no_op(variant_servers):
    """The variants differ from the bf16 model and from each other: the packed weights really were used."""
    outputs = {}
    for name, (server, _, _) in variant_servers.items():
        body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                "return_logprob": True, "logprob_start_len": 0}
        meta = requests.post(server.base_url + "/generate", json=body, timeout=600).json()["meta_info"]
        outputs[name] = [lp for lp, _, _ in meta["input_token_logprobs"][1:]]
    for a in VARIANTS:
        for b in VARIANTS:
            if a < b:
                assert max(abs(x - y) for x, y in zip(outputs[a], outputs[b])) > 1e-3, (a, b)
