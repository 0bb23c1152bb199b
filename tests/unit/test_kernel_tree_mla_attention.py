"""Tree-masked absorbed-MLA attention: the Triton kernel (CPU, float32, Triton's interpreter) against its torch
twin, and the twin against a per-row float64 softmax written from the definition.

Shapes are small (the interpreter runs ~0.1 s per launch); one case uses Kimi's real widths (512 + 64).
Tolerance: float32 arithmetic, relative norm error < 1e-5 (``docs/kernels.md``: float32 lands far below it).
See ``kernels/interpret.py`` for why TRITON_INTERPRET is set around the first Triton import.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from support.child_process import rerun_in_fresh_process

from sglang_kimi.kernels.interpret import interpreter_active, interpreter_imports

_ENV_BEFORE = os.environ.get("TRITON_INTERPRET")
with interpreter_imports():
    from sglang_kimi.kernels import tree_mla_attention as tm
IN_PROCESS = interpreter_active()

from sglang_kimi.speculators.trees import DraftTree  # noqa: E402

FP32_TOL = 1e-5


def make_case(batch, nodes, heads, kv_lora, rope, prefix_lens, gen, pad=False, slots=4096, max_ctx=None):
    """Random q, latent cache, req_to_token (unique slots per request, random pool rows) and tree masks."""
    D = kv_lora + rope
    prefix = torch.tensor(prefix_lens, dtype=torch.int32)
    max_ctx = max_ctx or int(prefix.max()) + nodes + 5
    pool_rows = batch + 3
    req_pool = torch.randperm(pool_rows, generator=gen)[:batch].to(torch.int64)
    req_to_token = torch.randint(0, slots, (pool_rows, max_ctx), generator=gen, dtype=torch.int32)
    for b in range(batch):  # a request's positions map to distinct slots, as in SGLang
        req_to_token[req_pool[b]] = torch.randperm(slots, generator=gen)[:max_ctx].to(torch.int32)
    kv = torch.randn(slots, 1, D, generator=gen)
    q = torch.randn(batch * nodes, heads, D, generator=gen)
    parents = torch.full((batch, nodes), -1, dtype=torch.long)
    for i in range(1, nodes):
        parents[:, i] = torch.randint(i, (batch,), generator=gen)
    num_nodes = torch.randint(1, nodes + 1, (batch,), generator=gen) if pad else None
    tree = DraftTree.from_parents(torch.zeros(batch, nodes, dtype=torch.long), parents, num_nodes)
    return q, kv, req_to_token, req_pool, prefix, tree.ancestor_mask()


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def check(case, sm_scale, kv_lora, mask_form="bool", **kw):
    q, kv, r2t, pool, prefix, mask = case
    ref, ref_lse = tm.tree_mla_attention_ref(
        q, kv, r2t, pool, prefix, mask, sm_scale, kv_lora_rank=kv_lora, return_lse=True
    )
    if mask_form == "int64":
        mask = tm.pack_tree_mask(mask)
    elif mask_form == "int32":
        mask = tm.pack_tree_mask(mask).to(torch.int32)
    out = torch.full_like(ref, float("nan"))  # poisoned: every element must be written
    got, lse = tm.tree_mla_attention(
        q, kv, r2t, pool, prefix, mask, sm_scale, kv_lora_rank=kv_lora, out=out, return_lse=True, **kw
    )
    assert got.data_ptr() == out.data_ptr()
    assert not torch.isnan(got).any(), "unwritten output elements"
    assert rel_err(got, ref) < FP32_TOL
    finite = torch.isfinite(ref_lse)
    assert torch.equal(finite, torch.isfinite(lse))
    assert torch.allclose(lse[finite], ref_lse[finite], atol=1e-5, rtol=1e-5)
    return ref


@pytest.mark.parametrize("k_rows", [False, True])  # the key tile as [D, keys] (HIP tile) or [keys, D] (CUDA tile)
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("mask_form", ["bool", "int32", "int64"])
def test_kernel_matches_ref_variable_prefixes(splits, mask_form, k_rows):
    gen = torch.Generator().manual_seed(splits * 10 + len(mask_form))
    case = make_case(3, 4, 2, 32, 16, [37, 0, 90], gen, pad=True)
    check(case, 0.3, 32, mask_form, num_kv_splits=splits, block_n=16, k_rows=k_rows)


@pytest.mark.parametrize("nodes,heads", [(1, 3), (8, 2), (16, 1)])
def test_kernel_matches_ref_tree_sizes(nodes, heads):
    gen = torch.Generator().manual_seed(nodes)
    case = make_case(2, nodes, heads, 32, 16, [20, 45], gen)
    check(case, 0.25, 32, "int64", num_kv_splits=2, block_n=16, block_m=16)


def test_kernel_64_nodes_uses_bit_63():
    gen = torch.Generator().manual_seed(64)
    q, kv, r2t, pool, prefix, _ = make_case(1, 64, 1, 16, 16, [9], gen)
    mask = torch.rand(1, 64, 64, generator=gen) < 0.5
    mask[0, 63, 63] = True
    mask[0, 5, 63] = True  # node 5 sees node 63: bit 63 of row 5
    bits = tm.pack_tree_mask(mask)
    assert int(bits[0, 5]) < 0, "bit 63 lands on the sign bit"
    assert torch.equal(tm.unpack_tree_mask(bits, 64), mask)
    check((q, kv, r2t, pool, prefix, mask), 0.5, 16, "int64", num_kv_splits=1, block_m=32, block_n=16)


def test_kernel_kimi_widths_fused_and_split():
    gen = torch.Generator().manual_seed(576)
    case = make_case(2, 4, 4, 512, 64, [40, 17], gen, pad=True)
    scale = tm.mla_sm_scale(128, 64)
    assert math.isclose(scale, 1 / math.sqrt(192))
    for splits in (1, 2):
        check(case, scale, 512, "bool", num_kv_splits=splits, block_n=32)


def test_default_config_path():
    gen = torch.Generator().manual_seed(5)
    case = make_case(2, 4, 8, 32, 16, [300, 7], gen, max_ctx=400)
    cfg = tm.default_config(4, 8, 2, 400, torch.device("cpu"))
    assert cfg["num_kv_splits"] > 1  # exercises the split + merge path with the library's own choices
    check(case, 0.2, 32, "bool")


@pytest.mark.parametrize("hip", [False, True])
def test_each_vendor_tile_matches_ref(hip):
    gen = torch.Generator().manual_seed(6)
    case = make_case(2, 8, 4, 32, 16, [150, 70], gen, max_ctx=200)
    cfg = tm.default_config(8, 4, 2, 200, torch.device("cpu"), hip=hip)
    assert cfg["k_rows"] is (not hip)
    check(case, 0.2, 32, "int64", **cfg)


def test_row_that_sees_nothing_gives_zero_and_minus_inf_lse():
    gen = torch.Generator().manual_seed(9)
    q, kv, r2t, pool, prefix, mask = make_case(2, 2, 2, 16, 16, [0, 5], gen)
    mask = mask.clone()
    mask[0, 1] = False  # request 0 has no prefix: node 1 sees no key at all
    for splits in (1, 2):
        ref = check((q, kv, r2t, pool, prefix, mask), 0.5, 16, "bool", num_kv_splits=splits, block_n=16)
        assert torch.all(ref[1] == 0)


def test_ref_matches_definition_in_float64():
    gen = torch.Generator().manual_seed(3)
    q, kv, r2t, pool, prefix, mask = make_case(2, 3, 2, 24, 8, [6, 11], gen, pad=True)
    ref = tm.tree_mla_attention_ref(q, kv, r2t, pool, prefix, mask, 0.7, kv_lora_rank=24)
    B, N, H = 2, 3, 2
    for b in range(B):
        P = int(prefix[b])
        rows = r2t[pool[b], : P + N].long()
        keys = kv[rows, 0].double()  # [P+N, 32]
        for i in range(N):
            visible = torch.cat([torch.ones(P, dtype=torch.bool), mask[b, i]])
            for h in range(H):
                s = keys @ q[b * N + i, h].double() * 0.7
                s[~visible] = float("-inf")
                expected = torch.softmax(s, 0) @ keys[:, :24]
                assert torch.allclose(ref[b * N + i, h].double(), expected, atol=1e-5)


def test_ref_chunking_is_invisible():
    gen = torch.Generator().manual_seed(4)
    q, kv, r2t, pool, prefix, mask = make_case(4, 4, 2, 16, 16, [10, 60, 3, 33], gen)
    whole = tm.tree_mla_attention_ref(q, kv, r2t, pool, prefix, mask, 0.4, kv_lora_rank=16)
    chunked = tm.tree_mla_attention_ref(q, kv, r2t, pool, prefix, mask, 0.4, kv_lora_rank=16, max_elements=1)
    # other matmul shapes (padded to the chunk's longest request): float32 rounding of sums over <= 64 keys of O(1)
    # values, up to 64 * 6e-8 ~ 4e-6 absolute; reading another request's rows or mask moves outputs by > 0.8
    assert torch.allclose(whole, chunked, atol=1e-5)


def test_bad_masks_rejected():
    gen = torch.Generator().manual_seed(1)
    q, kv, r2t, pool, prefix, mask = make_case(1, 4, 1, 16, 16, [4], gen)
    with pytest.raises(ValueError):
        tm.tree_mla_attention(q, kv, r2t, pool, prefix, mask[:, :3], 0.5, kv_lora_rank=16)
    with pytest.raises(ValueError):
        tm.pack_tree_mask(torch.ones(1, 65, 65, dtype=torch.bool))


def test_env_restored_after_import():
    assert os.environ.get("TRITON_INTERPRET") == _ENV_BEFORE


if not IN_PROCESS:  # Triton was imported here before without the interpreter: run this module in a fresh process
    rerun_in_fresh_process(globals(), interpret=True)
