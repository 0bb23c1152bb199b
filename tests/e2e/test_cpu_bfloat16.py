"""A bfloat16 DFLASH server on CPU: the drafter's attention takes SGLang's torch q/k-norm and RoPE path (its fused
Triton kernel, chosen for bfloat16 activations, has no driver on CPU and ended the server at the first request).

bfloat16 output is not compared token for token with the float32 reference (a verify step and a decode step round
differently in bfloat16); the drafter's acceptance shows its attention is right: a drafter whose positions were
encoded wrongly would rarely be accepted past the first token.
"""

import pytest
from support.servers import server_config
from support.spec_e2e import DFLASH_TREE, KIMI_CPU, generate_all, gsm8k_prompts

from sglang_kimi.launcher.server import fetch_plugin_state

pytestmark = pytest.mark.e2e

NEW_TOKENS = 48


BF16_TREE = server_config("dflash-tree-bf16", KIMI_CPU + DFLASH_TREE + ["--dtype", "bfloat16"])
SERVERS = [BF16_TREE]


@pytest.fixture(scope="module")
def bf16_tree_server(request, server_pool):
    yield server_pool.get(BF16_TREE, request)
    server_pool.stop(BF16_TREE)


def test_bfloat16_dflash_tree_serves_with_the_drafter_accepted(bf16_tree_server):
    url = bf16_tree_server.base_url
    assert fetch_plugin_state(url)["registrations"]["cpu-dflash-draft-rope"] == "ok"
    outputs = generate_all(url, gsm8k_prompts(6), 2, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    assert [len(o["output_ids"]) for o in outputs] == [NEW_TOKENS] * 6
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outputs)
    steps = sum(o["meta_info"]["spec_verify_ct"] for o in outputs)
    assert tokens / steps > 2.5, f"{tokens} tokens in {steps} verify steps"
