"""SGLang's own Triton attention backend serving draft trees on CPU, through Triton's interpreter, in float32: EAGLE3
trees (SGLang builds their mask) and the plugin's DFLASH trees (the plugin builds theirs), as on a GPU.

For EAGLE3 this is the path ``cpu-tree-mask-mode`` fixes: SGLang builds QLEN_ONLY tree masks on CPU while the Triton
verify kernel reads FULL_MASK rows, so without the hook the verify attends under a garbage mask and greedy output
diverges. For DFLASH trees it is the FULL_MASK the plugin lays out for SGLang's Triton extend kernel. The
interpreter runs every Triton launch in Python (about 100x slower than compiled), so: one prompt, 16 tokens,
compared with the non-speculative server's greedy tokens, tau, and the log-probabilities the verify forwards report
for them with transformers' (one wrong mask cell moves them by ~1e-3).
"""

from __future__ import annotations

import pytest
import requests
import torch
from support.servers import server_config
from support.spec_e2e import TINY

from sglang_kimi.assets import TINY_EAGLE3
from sglang_kimi.cli.demo import mode_args
from sglang_kimi.launcher.server import fetch_plugin_state

pytestmark = pytest.mark.e2e

PROMPT = (
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:"
)
TOKENS = 16


def generate(url: str, max_new_tokens: int = TOKENS) -> dict:
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0},
        "return_logprob": True,
    }
    response = requests.post(url + "/generate", json=body, timeout=3600)
    response.raise_for_status()
    return response.json()


def transformers_logprobs(output_ids: list[int]) -> torch.Tensor:
    from support.hf_reference import load_hf_reference

    model, tokenizer = load_hf_reference()
    ids = tokenizer(PROMPT)["input_ids"]
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids + output_ids])).logits.float(), dim=-1)[0]
    return logp[len(ids) - 1 : -1].gather(1, torch.tensor(output_ids)[:, None])[:, 0]


TREES = {
    # the path ``cpu-tree-mask-mode`` fixes (SGLang builds the mask)
    "eagle3-tree": ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(TINY_EAGLE3),
                    "--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                    "--speculative-num-draft-tokens", "6"],
    # the plugin's DFLASH tree worker: its FULL_MASK, laid out from the verify batch's lengths, read by SGLang's
    # Triton extend kernel as on a GPU
    "dflash-tree-8": mode_args()["dflash-chain"] + ["--speculative-dflash-tree-budget", "8"],
}  # fmt: skip
TRITON_SERVERS = {
    mode: server_config(f"triton-{mode}", ["--attention-backend", "triton", *args], env={"TRITON_INTERPRET": "1"})
    for mode, args in TREES.items()
}
SERVERS = [TINY, *TRITON_SERVERS.values()]


@pytest.mark.parametrize("mode", list(TREES))
def test_tree_on_the_triton_backend_under_the_interpreter(request, server_pool, tiny_server, mode):
    reference = generate(tiny_server.base_url)["output_ids"]
    server = server_pool.get(TRITON_SERVERS[mode], request)
    try:
        state = fetch_plugin_state(server.base_url)
        assert state["registrations"]["cpu-tree-mask-mode"] == "ok"
        out = generate(server.base_url)
        assert out["output_ids"] == reference, f"{mode} on triton (CPU) differs from the non-speculative output"
        assert out["meta_info"]["spec_verify_ct"] > 0
        tau = (fetch_plugin_state(server.base_url).get("spec_metrics") or {}).get("tau")
        assert tau is not None and tau > 2.0, (
            f"{mode}: tau {tau}: the drafts are not being accepted"
        )  # 3.0 and 3.4 seen
        got = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
        error = (got - transformers_logprobs(reference)).abs().max().item()
        assert error < 1e-4, f"verify log-probabilities differ from transformers' by {error}"
    finally:
        server_pool.stop(TRITON_SERVERS[mode])
