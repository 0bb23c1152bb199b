"""The ``kimi_cpu`` attention backend against dense attention computed from first principles, in every forward mode
speculative decoding uses, for grouped-query MHA (the drafters) and absorbed MLA (the target); tree masks come from
SGLang's own tree builder (``eagle_utils.build_tree_kernel_efficient``, CPU path) in both of its layouts.

SGLang's modules need the CPU import shims, so the tests run in a child process with ``SGLANG_USE_CPU_ENGINE=1``
and the shims on ``PYTHONPATH`` (shared with the session's other such files: ``cpu_sglang_child``); in the
parent, one test fails with the child's report of them.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.eagle_utils import TreeMaskMode, build_tree_kernel_efficient, organize_draft_results
from sglang.srt.speculative.spec_utils import select_top_k_tokens

from sglang_kimi.platform.cpu.attention_backend import KimiCpuAttnBackend, KimiCpuMultiStepDraftBackend

pytestmark = pytest.mark.cpu_sglang_child


SLOTS = 400
POOL_LEN = 64


class Pool:
    """A KV pool with SGLang's accessors; ``kv_lora_rank`` set: the MLA layout (value = key[..., :kv_lora])."""

    def __init__(self, heads, dk, dv, kv_lora_rank=None):
        self.k = torch.randn(SLOTS, heads, dk, dtype=torch.float32)
        self.kv_lora_rank = kv_lora_rank
        self.v = None if kv_lora_rank else torch.randn(SLOTS, heads, dv, dtype=torch.float32)

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.k[..., : self.kv_lora_rank] if self.kv_lora_rank else self.v

    def set_kv_buffer(self, layer, loc, k, v):
        slots = loc.loc.long()
        self.k[slots] = k.reshape(self.k[slots].shape)
        if self.v is not None:
            self.v[slots] = v.reshape(self.v[slots].shape)


def make(kind: str, gen: torch.Generator, max_reqs: int = 4):
    """(runner, layer) for "gqa" (4 query heads, 2 KV heads, head 16) or "mla" (4 heads, latent 32 + rope 8)."""
    torch.manual_seed(int(torch.randint(0, 1 << 30, (1,), generator=gen)))
    if kind == "gqa":
        pool = Pool(2, 16, 16)
        layer = dict(tp_q_head_num=4, tp_k_head_num=2, tp_v_head_num=2, qk_head_dim=16, v_head_dim=16)
    else:
        pool = Pool(1, 40, 32, kv_lora_rank=32)
        layer = dict(tp_q_head_num=4, tp_k_head_num=1, tp_v_head_num=1, qk_head_dim=40, v_head_dim=32)
    req_to_token = (torch.randperm(SLOTS - 1, generator=gen)[: max_reqs * POOL_LEN] + 1).view(max_reqs, POOL_LEN)
    runner = SimpleNamespace(
        device="cpu",
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token.to(torch.int32), size=max_reqs),
        token_to_kv_pool=pool,
        page_size=1,
    )
    layer = SimpleNamespace(
        layer_id=0,
        scaling=0.3,
        is_cross_attention=False,
        attn_type=AttentionType.DECODER,
        sliding_window_size=-1,
        logit_cap=0.0,
        **layer,
    )
    return runner, layer


def batch(mode, rpi, seq_lens, out_cache_loc, **extra):
    defaults = dict(
        forward_mode=mode,
        req_pool_indices=torch.tensor(rpi),
        seq_lens=torch.tensor(seq_lens),
        batch_size=len(rpi),
        out_cache_loc=out_cache_loc,
        encoder_out_cache_loc=None,
        out_cache_loc_is_physical=False,
        encoder_lens=None,
        spec_info=None,
        input_ids=None,
    )
    defaults.update(extra)
    return SimpleNamespace(**defaults)


def dense(q, runner, layer, rpi: int, positions: list[int]) -> torch.Tensor:
    """Attention of q [Hq, Dk] over the request's keys at ``positions``, in float64: the definition."""
    pool = runner.token_to_kv_pool
    slots = runner.req_to_token_pool.req_to_token[rpi, positions].long()
    keys = pool.get_key_buffer(0)[slots].double()  # [L, Hk, Dk]
    values = pool.get_value_buffer(0)[slots].double()
    group = layer.tp_q_head_num // layer.tp_k_head_num
    out = []
    for h in range(layer.tp_q_head_num):
        scores = keys[:, h // group] @ q[h].double() * layer.scaling
        out.append(torch.softmax(scores, 0) @ values[:, h // group])
    return torch.stack(out).float()


def slots_of(runner, rpi, start, count):
    return runner.req_to_token_pool.req_to_token[rpi, start : start + count].long()


@pytest.mark.parametrize("kind", ["gqa", "mla"])
@pytest.mark.parametrize("attn_type", [AttentionType.DECODER, AttentionType.ENCODER_ONLY])
def test_extend(kind, attn_type):
    gen = torch.Generator().manual_seed(1)
    runner, layer = make(kind, gen)
    layer.attn_type = attn_type
    rpi, prefix, extend = [2, 0, 3], [5, 0, 9], [4, 7, 1]
    out_loc = torch.cat([slots_of(runner, r, p, e) for r, p, e in zip(rpi, prefix, extend)])
    fb = batch(
        ForwardMode.EXTEND,
        rpi,
        [p + e for p, e in zip(prefix, extend)],
        out_loc,
        extend_prefix_lens=torch.tensor(prefix),
        extend_seq_lens=torch.tensor(extend),
    )
    T, H = sum(extend), layer.tp_q_head_num
    q = torch.randn(T, H * layer.qk_head_dim)
    k = torch.randn(T, layer.tp_k_head_num, layer.qk_head_dim)
    v = k[..., : layer.v_head_dim].clone() if kind == "mla" else torch.randn(T, layer.tp_k_head_num, 16)
    backend = KimiCpuAttnBackend(runner)
    backend.init_forward_metadata(fb)
    out = backend.forward_extend(q, k, v, layer, fb).view(T, H, -1)
    row = 0
    for r, p, e in zip(rpi, prefix, extend):
        for j in range(e):
            visible = list(range(p + e)) if attn_type == AttentionType.ENCODER_ONLY else list(range(p + j + 1))
            expected = dense(q.view(T, H, -1)[row], runner, layer, r, visible)
            assert torch.allclose(out[row], expected, atol=1e-5), (kind, r, j)
            row += 1
    if kind == "gqa" and attn_type == AttentionType.DECODER:  # and SGLang's own torch backend agrees
        native = TorchNativeAttnBackend.__new__(TorchNativeAttnBackend)
        native.req_to_token_pool, native.token_to_kv_pool, native.swa_out_cache_loc = (
            runner.req_to_token_pool,
            runner.token_to_kv_pool,
            None,
        )
        reference = native.forward_extend(q, k, v, layer, fb, save_kv_cache=False).view(T, H, -1)
        assert torch.allclose(out, reference, atol=1e-5)


@pytest.mark.parametrize("kind", ["gqa", "mla"])
def test_decode(kind):
    gen = torch.Generator().manual_seed(2)
    runner, layer = make(kind, gen)
    rpi, seq_lens = [1, 3], [6, 30]
    out_loc = torch.stack([slots_of(runner, r, n - 1, 1)[0] for r, n in zip(rpi, seq_lens)])
    fb = batch(ForwardMode.DECODE, rpi, seq_lens, out_loc)
    H = layer.tp_q_head_num
    q = torch.randn(2, H * layer.qk_head_dim)
    k = torch.randn(2, layer.tp_k_head_num, layer.qk_head_dim)
    v = k[..., : layer.v_head_dim].clone() if kind == "mla" else torch.randn(2, layer.tp_k_head_num, 16)
    backend = KimiCpuAttnBackend(runner)
    backend.init_forward_metadata(fb)
    out = backend.forward_decode(q, k, v, layer, fb).view(2, H, -1)
    for i, (r, n) in enumerate(zip(rpi, seq_lens)):
        assert torch.allclose(out[i], dense(q.view(2, H, -1)[i], runner, layer, r, list(range(n))), atol=1e-5)


def eagle_tree(gen, bs, topk, steps, n):
    """A draft tree as EAGLE's draft loop builds it, from random draft scores."""
    hidden, scores = torch.zeros(bs, 4), None
    score_list, token_list, parents_list = [], [], []
    for i in range(steps):
        rows = bs if i == 0 else bs * topk
        p = torch.rand(rows, topk, generator=gen)
        p = (p / p.sum(-1, keepdim=True)).sort(dim=-1, descending=True).values
        _, hidden, scores, info = select_top_k_tokens(
            i, p, torch.randint(0, 50, (rows, topk), generator=gen), hidden, scores, topk
        )
        score_list.append(info[0])
        token_list.append(info[1])
        parents_list.append(info[2])
    return organize_draft_results(score_list, token_list, parents_list, n)


def ancestors(retrieve_next_token, retrieve_next_sibling, n):
    """Node -> its root path (root first), from SGLang's first-child / next-sibling links."""
    paths = {0: [0]}
    stack = [0]
    while stack:
        node = stack.pop()
        child = int(retrieve_next_token[node])
        while child != -1:
            paths[child] = paths[node] + [child]
            stack.append(child)
            child = int(retrieve_next_sibling[child])
    assert len(paths) == n
    return paths


@pytest.mark.parametrize("kind", ["gqa", "mla"])
@pytest.mark.parametrize("layout", ["chain", "qlen_only_tree", "full_mask_tree", "encoder_only"])
def test_target_verify(kind, layout):
    """Node i of each request sees the prefix and its root path (tree), the nodes before it (chain), or the
    whole block (encoder-only): exactly what running that path as a sequence would see."""
    gen = torch.Generator().manual_seed(3)
    runner, layer = make(kind, gen)
    rpi, prefix = [3, 1, 0], [7, 1, 20]
    bs, topk, steps, n = 3, 2, 3, 6
    spec_info = SimpleNamespace(custom_mask=None, draft_token_num=n, num_tokens_per_req=n)
    paths = None
    if layout in ("qlen_only_tree", "full_mask_tree"):
        parent_list, top_scores_index, draft_tokens = eagle_tree(gen, bs, topk, steps, n)
        mode = TreeMaskMode.QLEN_ONLY if layout == "qlen_only_tree" else TreeMaskMode.FULL_MASK
        seq_lens_sum = sum(prefix) + 11  # SGLang may over-size a FULL_MASK buffer; the reader must cope
        mask, _, _, next_token, next_sibling, _ = build_tree_kernel_efficient(
            torch.zeros(bs, dtype=torch.long),
            parent_list,
            top_scores_index,
            draft_tokens,
            torch.tensor(prefix),
            seq_lens_sum,
            topk,
            steps,
            n,
            mode,
        )
        spec_info.custom_mask = mask
        paths = [ancestors(next_token[b], next_sibling[b], n) for b in range(bs)]
        assert any(len(p) < i + 1 for path in paths for i, p in path.items()), "the trees branch"
    if layout == "encoder_only":
        layer.attn_type = AttentionType.ENCODER_ONLY
    out_loc = torch.cat([slots_of(runner, r, p, n) for r, p in zip(rpi, prefix)])
    fb = batch(
        ForwardMode.TARGET_VERIFY,
        rpi,
        prefix,
        out_loc,
        spec_info=spec_info,
        input_ids=torch.zeros(bs * n, dtype=torch.long),
    )
    H = layer.tp_q_head_num
    q = torch.randn(bs * n, H * layer.qk_head_dim)
    k = torch.randn(bs * n, layer.tp_k_head_num, layer.qk_head_dim)
    v = k[..., : layer.v_head_dim].clone() if kind == "mla" else torch.randn(bs * n, layer.tp_k_head_num, 16)
    backend = KimiCpuAttnBackend(runner)
    backend.init_forward_metadata(fb)
    out = backend.forward_extend(q, k, v, layer, fb).view(bs * n, H, -1)
    for b, (r, p) in enumerate(zip(rpi, prefix)):
        for i in range(n):
            if layout == "encoder_only":
                nodes = list(range(n))
            elif layout == "chain":
                nodes = list(range(i + 1))
            else:
                nodes = paths[b][i]
            visible = list(range(p)) + [p + j for j in nodes]
            expected = dense(q.view(bs * n, H, -1)[b * n + i], runner, layer, r, visible)
            assert torch.allclose(out[b * n + i], expected, atol=1e-5), (kind, layout, b, i)


def test_eagle_multi_step_draft_decode_reads_each_branch():
    """Step i, row (request b, branch k): the prefix and the branch's own draft slots p + k*num_steps + 0..i."""
    gen = torch.Generator().manual_seed(4)
    runner, layer = make("gqa", gen)
    topk, num_steps = 2, 3
    rpi, seq_lens = [2, 0], [9, 4]
    multi = KimiCpuMultiStepDraftBackend(runner, topk, num_steps)
    assert len(multi.attn_backends) == num_steps - 1
    fb = batch(ForwardMode.DECODE, rpi, seq_lens, None)
    multi.init_forward_metadata(fb)
    H = layer.tp_q_head_num
    rows = len(rpi) * topk
    for step, backend in enumerate(multi.attn_backends):
        out_loc = torch.stack(
            [slots_of(runner, r, n + k * num_steps + step, 1)[0] for r, n in zip(rpi, seq_lens) for k in range(topk)]
        )
        fb.out_cache_loc = out_loc
        q = torch.randn(rows, H * 16)
        k = torch.randn(rows, 2, 16)
        v = torch.randn(rows, 2, 16)
        out = backend.forward_decode(q, k, v, layer, fb).view(rows, H, -1)
        for b, (r, n) in enumerate(zip(rpi, seq_lens)):
            for branch in range(topk):
                row = b * topk + branch
                visible = list(range(n)) + [n + branch * num_steps + s for s in range(step + 1)]
                expected = dense(q.view(rows, H, -1)[row], runner, layer, r, visible)
                assert torch.allclose(out[row], expected, atol=1e-5), (step, b, branch)


def test_full_mask_prefix_cells_are_not_read():
    """A FULL_MASK's prefix cells are not read: every node sees the prefix, as SGLang's Triton verify kernels
    take it (skip_prefix_custom_mask), so the DFLASH tree worker writes only the tree blocks."""
    from sglang_kimi.platform.cpu.attention_backend import read_verify_mask

    prefix, n = torch.tensor([3, 2]), 2
    blocks = [torch.ones(n, 3 + n, dtype=torch.bool), torch.ones(n, 2 + n, dtype=torch.bool)]
    blocks[1][0, 3] = False
    flat = torch.cat([b.reshape(-1) for b in blocks] + [torch.ones(7, dtype=torch.bool)])  # over-allocated
    tree = read_verify_mask(flat, prefix, n)
    blocks[0][:, :3] = torch.rand(n, 3) > 0.5  # whatever the prefix cells hold
    assert torch.equal(read_verify_mask(torch.cat([b.reshape(-1) for b in blocks]), prefix, n), tree)
    assert torch.equal(tree[0], blocks[0][:, 3:]) and torch.equal(tree[1], blocks[1][:, 2:])


def test_rows_padded_by_attention_data_parallelism_get_a_causal_tree():
    """SGLang pads a verify batch to the DP ranks' common size after the mask was built: the real rows keep
    their masks (either layout) and the padded rows, which have no cells, get a causal tree."""
    from sglang_kimi.platform.cpu.attention_backend import read_verify_mask

    n = 3
    trees = torch.rand(2, n, n) > 0.5  # two real requests, QLEN_ONLY layout
    tree = read_verify_mask(trees.reshape(-1), torch.tensor([5, 4, 1, 1]), n, real=2)
    assert tree.shape == (4, n, n)
    assert torch.equal(tree[:2], trees) and torch.equal(tree[2], torch.ones(n, n, dtype=torch.bool).tril())
    block = torch.ones(n, 2 + n, dtype=torch.bool)
    block[1, 3] = False  # FULL_MASK layout
    tree = read_verify_mask(block.reshape(-1), torch.tensor([2, 1, 1]), n, real=1)
    assert tree.shape == (3, n, n) and torch.equal(tree[0], block[:, 2:])
    assert torch.equal(tree[2], torch.ones(n, n, dtype=torch.bool).tril())
