"""The Triton kernels at full Kimi shapes on a CUDA or ROCm GPU, bf16 where the serving path is bf16, against
their torch twins on the same device.

Tolerances (``docs/kernels.md``): relative norm error ||out - ref|| / ||ref||; bf16 operands land
between 1e-3 and 1e-2, so attention must be under 1e-2; NaN never passes; outputs are poisoned before each run.
Integer outputs (trees, verify decisions) must be identical (sampled verify: up to float32 rounding ties).

Skipped, with the reason, where there is no GPU. Run with ``pytest tests/gpu -q``.
"""

from __future__ import annotations

import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA or ROCm GPU (torch.cuda.is_available() is False)", allow_module_level=True)

from support.child_process import run_pytest_in_fresh_process  # noqa: E402

from sglang_kimi.kernels.interpret import interpreter_active  # noqa: E402

IN_PROCESS = not interpreter_active()  # unit tests may have loaded Triton's interpreter in this process

from support.verify_layout import twin  # noqa: E402

from sglang_kimi.kernels import ddtree_build as dd  # noqa: E402
from sglang_kimi.kernels import tree_mla_attention as tm  # noqa: E402
from sglang_kimi.kernels import tree_verify as tv  # noqa: E402
from sglang_kimi.speculators.ddtree import build_ddtree, rank_draft_logits  # noqa: E402
from sglang_kimi.speculators.trees import DraftTree  # noqa: E402
from sglang_kimi.speculators.verify import walk_tree  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
BF16_TOL = 1e-2
KIMI_VOCAB = 163840


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def random_parents(batch, nodes, gen):
    parents = torch.full((batch, nodes), -1, dtype=torch.long)
    for i in range(1, nodes):
        parents[:, i] = torch.randint(i, (batch,), generator=gen)
    return parents


def attention_case(batch, nodes, heads, prefix_max, gen, kv_lora=512, rope=64):
    """bf16 q and latent cache, variable prefixes (prefix_max / 2 .. prefix_max), pool rows shuffled."""
    prefix = torch.randint(prefix_max // 2, prefix_max + 1, (batch,), generator=gen).to(torch.int32)
    lengths = (prefix + nodes).tolist()
    max_ctx = max(lengths) + 8
    total = sum(lengths)
    slots = torch.randperm(total + 64, generator=gen)[:total].to(torch.int32)  # scattered, distinct slots
    req_pool = torch.randperm(batch + 2, generator=gen)[:batch]
    req_to_token = torch.zeros(batch + 2, max_ctx, dtype=torch.int32)
    start = 0
    for b, n in enumerate(lengths):
        req_to_token[req_pool[b], :n] = slots[start : start + n]
        start += n
    kv = torch.randn(total + 64, 1, kv_lora + rope, generator=gen).to(torch.bfloat16)
    q = torch.randn(batch * nodes, heads, kv_lora + rope, generator=gen).to(torch.bfloat16)
    tree = DraftTree.from_parents(torch.zeros(batch, nodes, dtype=torch.long), random_parents(batch, nodes, gen))
    to = lambda t: t.to(DEV)  # noqa: E731
    return to(q), to(kv), to(req_to_token), to(req_pool), to(prefix), to(tree.ancestor_mask())


ATTENTION_SHAPES = [  # (batch, nodes, heads, prefix): Kimi TP8 (8 heads), TP4 (16), TP1 (64); prefixes 1k..32k
    (1, 8, 8, 32768),
    (8, 16, 8, 4096),
    (64, 8, 8, 1024),
    (4, 64, 8, 8192),
    (16, 4, 16, 2048),
    (2, 32, 64, 1024),
    (32, 1, 64, 4096),
]


@pytest.mark.parametrize("batch,nodes,heads,prefix", ATTENTION_SHAPES)
@pytest.mark.parametrize("splits", [None, 1])
def test_tree_mla_attention_bf16(batch, nodes, heads, prefix, splits):
    gen = torch.Generator().manual_seed(batch * 7 + nodes * 3 + heads + prefix)
    q, kv, r2t, pool, prefix_lens, mask = attention_case(batch, nodes, heads, prefix, gen)
    scale = tm.mla_sm_scale(128, 64)
    ref, ref_lse = tm.tree_mla_attention_ref(q, kv, r2t, pool, prefix_lens, mask, scale, return_lse=True)
    out = torch.full((batch * nodes, heads, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    got, lse = tm.tree_mla_attention(
        q, kv, r2t, pool, prefix_lens, mask, scale, out=out, return_lse=True, num_kv_splits=splits
    )
    torch.cuda.synchronize()
    assert not torch.isnan(got).any(), "unwritten output elements"
    assert rel_err(got, ref) < BF16_TOL
    assert torch.allclose(lse, ref_lse, atol=2e-2, rtol=1e-2)
    packed = tm.tree_mla_attention(q, kv, r2t, pool, prefix_lens, tm.pack_tree_mask(mask), scale, num_kv_splits=splits)
    assert torch.equal(packed, got), "bool and packed masks must give identical results"


def random_tree_gpu(batch, nodes, vocab, gen):
    parents = random_parents(batch, nodes, gen)
    tokens = torch.randint(vocab, (batch, nodes), generator=gen)
    tokens[:, 1:] = torch.randperm(vocab, generator=gen)[: nodes - 1]  # distinct tokens: distinct siblings
    return DraftTree.from_parents(tokens.to(DEV), parents.to(DEV))


def verify_args(tree):
    return tree.tokens, tree.retrieve_index(), tree.retrieve_next_token(), tree.retrieve_next_sibling()


def follow_logits(tree, vocab, gen):
    """Logits where every node's argmax is one of its children with probability ~0.8 (deep walks)."""
    logits = torch.randn(tree.batch_size, tree.num_slots, vocab, generator=gen).to(DEV)
    parents = tree.parents.cpu()
    for b in range(tree.batch_size):
        for i in range(1, tree.num_slots):
            if float(torch.rand((), generator=gen)) < 0.8:
                logits[b, parents[b, i], tree.tokens[b, i]] = 20.0 + float(torch.rand((), generator=gen))
    return logits


@pytest.mark.parametrize("batch,nodes", [(64, 16), (8, 64)])
def test_tree_verify_greedy_full_vocab(batch, nodes):
    gen = torch.Generator().manual_seed(batch + nodes)
    tree = random_tree_gpu(batch, nodes, KIMI_VOCAB, gen)
    logits = follow_logits(tree, KIMI_VOCAB, gen).to(torch.bfloat16)
    spec = tree.max_depth + 1
    expected = walk_tree(tree, target_logits=logits)  # the torch twin (verify_greedy would launch the kernel)
    for target in ({"target_logits": logits}, {"target_predict": logits.argmax(-1)}):
        poison = dict(
            predicts=torch.full((batch * nodes,), -7, dtype=torch.int32, device=DEV),
            accept_index=torch.full((batch, spec), -7, dtype=torch.int32, device=DEV),
            accept_token_num=torch.full((batch,), -7, dtype=torch.int32, device=DEV),
        )
        out = tv.tree_verify(*verify_args(tree), num_spec_tokens=spec, **poison, **target)
        ref = twin(*verify_args(tree), num_spec_tokens=spec, **target)
        assert torch.equal(out.accept_index, ref.accept_index)
        assert torch.equal(out.accept_token_num.long(), expected.num_accepted)
        idx = out.accept_index.long()
        local = torch.where(idx >= 0, idx - torch.arange(batch, device=DEV)[:, None] * nodes, -1)
        assert torch.equal(local, expected.accepted_nodes)
        bonus = out.predicts.long()[idx[torch.arange(batch, device=DEV), out.accept_token_num.long()]]
        assert torch.equal(bonus, expected.bonus)


@pytest.mark.parametrize("batch,nodes", [(64, 16), (8, 64)])
def test_tree_verify_sampled_full_vocab(batch, nodes):
    gen = torch.Generator().manual_seed(1000 + batch + nodes)
    tree = random_tree_gpu(batch, nodes, KIMI_VOCAB, gen)
    probs = torch.softmax(follow_logits(tree, KIMI_VOCAB, gen) * 0.3, dim=-1)
    coins = torch.rand(batch, nodes, generator=gen).to(DEV)
    final = torch.rand(batch, generator=gen).to(DEV)
    spec = tree.max_depth + 1
    kw = dict(num_spec_tokens=spec, target_probs=probs, uniform_samples=coins, uniform_samples_for_final_sampling=final)
    out = tv.tree_verify(*verify_args(tree), **kw)
    ref = twin(*verify_args(tree), **kw)
    assert torch.equal(out.accept_index, ref.accept_index)
    assert torch.equal(out.accept_token_num, ref.accept_token_num)
    rows = out.accept_index.long()[torch.arange(batch, device=DEV), out.accept_token_num.long()]
    mismatch = int((out.predicts[rows] != ref.predicts[rows]).sum())
    assert mismatch <= 1, f"{mismatch} bonus tokens differ (only float32 rounding ties may)"


def test_ddtree_build_kimi_block():
    """bs 64, budget 64, depth 7 (Kimi's DFlash block of 8), full vocab: identical to build_ddtree."""
    gen = torch.Generator().manual_seed(64)
    logits = (torch.randn(64, 7, KIMI_VOCAB, generator=gen) * 3).to(DEV)
    root = torch.randint(KIMI_VOCAB, (64,), generator=gen).to(DEV)
    expected = build_ddtree(root, logits, 64)
    lp, ids = rank_draft_logits(logits, 64)
    out = tuple(torch.full((64, 65), -99, dtype=torch.long, device=DEV) for _ in range(3))
    got = dd.ddtree_build(root, lp, ids, 64, out=out)
    for f in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(got, f), getattr(expected, f)), f


@pytest.mark.parametrize("batch,k", [(1, 8), (16, 16), (64, 32)])
def test_ranking_on_the_gpu_is_the_cpus(batch, k):
    """The ranking's survivors on the GPU (torch.topk's 2k + 16, ordered by the tie rule's keys; no host read) give
    the CPU's ids, which follow the lowest-index rule on every row, on bf16-rounded logits at Kimi's vocabulary
    (ties at the cut in a quarter to a half of the rows), and log-probs to float32 rounding; in place too."""
    gen = torch.Generator().manual_seed(batch * 100 + k)
    logits = (torch.randn(batch, 7, KIMI_VOCAB, generator=gen) * 3).bfloat16().float()
    ref_lp, ref_ids = rank_draft_logits(logits, k)
    on_gpu = logits.to(DEV)
    lp, ids = rank_draft_logits(on_gpu, k)
    assert torch.equal(ids.cpu(), ref_ids)
    torch.testing.assert_close(lp.cpu(), ref_lp, rtol=1e-5, atol=1e-5)
    lp2, ids2 = rank_draft_logits(on_gpu.clone(), k, overwrite=True)
    assert torch.equal(ids2, ids) and torch.equal(lp2, lp)


def _fused_moe_or_reason():
    try:
        from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts  # noqa: F401

        return None
    except Exception as exc:  # noqa: BLE001
        return f"SGLang's fused-MoE runner does not import in this environment: {type(exc).__name__}: {exc}"


def test_tune_moe_writes_a_table(tmp_path):
    reason = _fused_moe_or_reason()
    if reason:
        pytest.skip(reason)
    from sglang_kimi.kernels import moe_configs as mt
    from sglang_kimi.kernels import moe_tuner as tuner

    path = tuner.tune_moe(
        experts=8,
        intermediate=128,
        hidden=256,
        topk=2,
        dtype="bf16",
        block_shape=None,
        m_values=[2, 8],
        output_dir=tmp_path,
        warmup=1,
        iters=3,
        max_configs=4,
    )
    table = mt.read_table(path)
    assert {2, 8} <= set(table)
    assert mt.parse_config_file_name(path.name)["E"] == 8


def test_sm_scale_formula():
    assert math.isclose(tm.mla_sm_scale(128, 64, 1.0), 1 / math.sqrt(192))


if not IN_PROCESS:  # this process runs Triton's interpreter (unit tests came first): use a fresh process
    for _name in [n for n in list(globals()) if n.startswith("test_")]:
        del globals()[_name]

    def test_module_on_the_gpu_in_fresh_process():
        rc, output = run_pytest_in_fresh_process(__file__, interpret=False)
        assert rc == 0, output
