"""The CPU sgl_kernel ops (``sglang_kimi/platform/cpu/sgl_kernel_ops.py``) against SGLang's own Triton kernels for the
same
steps, run on CPU tensors through Triton's interpreter, on random inputs shaped as SGLang makes them.

The ops are reached through the CPU ``sgl_kernel`` shim (``import sgl_kernel``), as SGLang's CPU path reaches them.
SGLang's modules import ``torchvision`` and Triton must be in interpreter mode before its first import, so the
comparisons run in a child process with ``TRITON_INTERPRET=1`` and the CPU shims on ``PYTHONPATH``; in the parent,
one test runs that child and fails with its output.
"""

from __future__ import annotations

import pytest
import torch

from sglang_kimi.kernels.interpret import interpreter_active, interpreter_imports

pytestmark = pytest.mark.interpreted_sglang_child


with interpreter_imports():
    from sglang.kernels.ops.kvcache import cache_move
    from sglang.kernels.ops.speculative import cache_locs, eagle, multi_layer_eagle, spec_tree
    from sglang.srt.mem_cache import allocation
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.speculative.spec_utils import select_top_k_tokens

import sgl_kernel  # noqa: E402 (after SGLang's kernels, imported under the interpreter)

assert interpreter_active(), "the child process must run Triton's interpreter"
assert getattr(sgl_kernel, "SHIM", False), "the CPU sgl_kernel shim must serve the ops"


def random_req_to_token(gen, max_reqs=6, pool_len=64, slots=500):
    return torch.randint(1, slots, (max_reqs, pool_len), generator=gen, dtype=torch.int32)


@pytest.mark.parametrize("seed", range(4))
def test_assign_req_to_token_pool(seed):
    gen = torch.Generator().manual_seed(seed)
    bs = 1 + seed
    rpi = torch.randperm(6, generator=gen)[:bs]
    start = torch.randint(0, 20, (bs,), generator=gen)
    end = start + torch.randint(0, 30, (bs,), generator=gen)
    locs = torch.randint(1, 1000, (int((end - start).sum()),), generator=gen, dtype=torch.int64)
    ref, ours = random_req_to_token(gen), None
    ours = ref.clone()
    allocation.assign_req_to_token_pool[(bs,)](rpi, ref, start, end, locs, ref.shape[1], 8)
    sgl_kernel.assign_req_to_token_pool_cpu(rpi, ours, start, end, locs, ours.shape[1])
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("topk,cols", [(1, 3), (1, 4), (2, 3), (4, 2)])
def test_assign_draft_cache_locs_contiguous(topk, cols):
    gen = torch.Generator().manual_seed(topk * 10 + cols)
    bs = 3
    r2t = random_req_to_token(gen)
    rpi = torch.tensor([4, 0, 2])
    seq_lens = torch.randint(1, 40, (bs,), generator=gen)
    ref = torch.full((bs * topk * cols,), -5, dtype=torch.int64)
    ours = ref.clone()
    cache_locs.assign_draft_cache_locs_contiguous_func(rpi, r2t, seq_lens, ref, topk, cols)
    sgl_kernel.assign_draft_cache_locs_contiguous_cpu(rpi, r2t, seq_lens, ours, r2t.shape[1], topk, cols)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("seed", range(3))
def test_assign_extend_cache_locs(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    bs = 2 + seed
    r2t = random_req_to_token(gen)
    rpi = torch.randperm(6, generator=gen)[:bs]
    start = torch.randint(0, 30, (bs,), generator=gen)
    end = start + torch.randint(0, 9, (bs,), generator=gen)
    total = int((end - start).sum())
    ref = torch.full((total,), -5, dtype=torch.int64)
    ours = ref.clone()
    cache_locs.assign_extend_cache_locs[(bs,)](rpi, r2t, start, end, ref, r2t.shape[1], 8)
    sgl_kernel.assign_extend_cache_locs_cpu(rpi, r2t, start, end, ours, r2t.shape[1])
    assert torch.equal(ours, ref)


def test_copy_all_layer_kv_cache_moves_rows_in_every_layer():
    gen = torch.Generator().manual_seed(7)
    k = [torch.randn(40, 2, 8, generator=gen) for _ in range(3)]
    v = [torch.randn(40, 2, 8, generator=gen) for _ in range(3)]
    tgt = torch.tensor([3, 4, 9, 10, 11])
    src = torch.tensor([4, 9, 20, 3, 30])  # overlapping source and target sets
    ref_k, ref_v = [t.clone() for t in k], [t.clone() for t in v]
    buffers = ref_k + ref_v
    ptrs = torch.tensor([t.data_ptr() for t in buffers], dtype=torch.uint64)
    strides = torch.tensor([t.stride(0) * t.element_size() for t in buffers])
    cfg = {"byte_tiles": 1, "bytes_per_tile": 64, "num_warps": 1}
    cache_move.copy_all_layer_kv_cache_func(ptrs, strides, tgt, src, 5, 8, cfg)
    ours = [t.clone() for t in k + v]
    ptrs = torch.tensor([t.data_ptr() for t in ours], dtype=torch.uint64)
    sgl_kernel.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for a, b, orig in zip(ours, buffers, k + v):
        assert torch.equal(a, b)
        assert torch.equal(a[tgt], orig[src])  # the old rows, not rows already overwritten


def eagle_tree(gen, bs, topk, steps, num_draft_tokens):
    """A draft tree as EAGLE's draft loop builds it (SGLang's own select_top_k_tokens / organize_draft_results
    over random draft scores)."""
    hidden = torch.zeros(bs, 4)
    scores = None
    score_list, token_list, parents_list = [], [], []
    for i in range(steps):
        rows = bs if i == 0 else bs * topk
        p = torch.rand(rows, topk, generator=gen)
        p = (p / p.sum(-1, keepdim=True)).sort(dim=-1, descending=True).values
        idx = torch.randint(0, 50, (rows, topk), generator=gen)
        _, hidden, scores, info = select_top_k_tokens(i, p, idx, hidden, scores, topk)
        score_list.append(info[0])
        token_list.append(info[1])
        parents_list.append(info[2])
    return organize_draft_results(score_list, token_list, parents_list, num_draft_tokens)


@pytest.mark.parametrize("mode", [spec_tree.TreeMaskMode.FULL_MASK, spec_tree.TreeMaskMode.QLEN_ONLY])
@pytest.mark.parametrize("topk,steps,n", [(1, 3, 4), (2, 3, 6), (4, 3, 8), (3, 4, 10)])
def test_build_tree_kernel_efficient(mode, topk, steps, n):
    gen = torch.Generator().manual_seed(topk * 100 + steps * 10 + n)
    bs = 3
    parent_list, top_scores_index, _ = eagle_tree(gen, bs, topk, steps, n)
    seq_lens = torch.randint(1, 12, (bs,), generator=gen)

    def run(fn):
        size = bs * n * n if mode == spec_tree.TreeMaskMode.QLEN_ONLY else int(seq_lens.sum()) * n + bs * n * n
        mask = torch.full((size,), True)
        positions = torch.full((bs * n,), -9, dtype=torch.long)
        retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
        fn(parent_list, top_scores_index, seq_lens, mask, positions, *retrieve, topk, steps, n, mode)
        return mask, positions, retrieve

    ref = run(spec_tree.sgl_build_tree_kernel_triton)
    ours = run(sgl_kernel.build_tree_kernel_efficient_cpu)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)
    assert ref[0].sum() > bs * n  # the tree has edges (not only the diagonal)


@pytest.mark.parametrize("topk,steps,n", [(1, 3, 4), (2, 3, 6), (4, 3, 8)])
def test_verify_tree_greedy(topk, steps, n):
    gen = torch.Generator().manual_seed(topk + 17 * n)
    bs = 4
    parent_list, top_scores_index, draft_tokens = eagle_tree(gen, bs, topk, steps, n)
    seq_lens = torch.randint(1, 12, (bs,), generator=gen)
    mask = torch.full((bs * n * n,), True)
    positions = torch.empty(bs * n, dtype=torch.long)
    retrieve = torch.full((3, bs, n), -1, dtype=torch.long)
    spec_tree.sgl_build_tree_kernel_triton(
        parent_list, top_scores_index, seq_lens, mask, positions, *retrieve, topk, steps, n, 1
    )
    candidates = torch.cat([torch.randint(0, 50, (bs, 1), generator=gen), draft_tokens], dim=1)
    # targets that follow the drafted tokens for a while, then deviate: exercises 0..steps accepts
    target = torch.randint(0, 50, (bs, n), generator=gen)
    for b in range(bs):
        node = 0
        for _ in range(b % (steps + 1)):
            child = int(retrieve[1, b, node])
            if child < 0:
                break
            while int(retrieve[2, b, child]) != -1 and torch.rand(1, generator=gen) < 0.5:
                child = int(retrieve[2, b, child])
            target[b, node] = candidates[b, child]
            node = child

    def run(fn):
        predicts = torch.full((bs * n,), -3, dtype=torch.int32)
        accept_index = torch.full((bs, steps + 1), -1, dtype=torch.int32)
        accept_num = torch.full((bs,), -3, dtype=torch.int32)
        fn(predicts, accept_index, accept_num, candidates, *retrieve, target)
        return predicts, accept_index, accept_num

    ref = run(spec_tree.verify_tree_greedy_triton)
    ours = run(
        lambda p, a, c, cand, ri, rn, rs, t: sgl_kernel.verify_tree_greedy_cpu(
            predicts=p,
            accept_index=a,
            accept_token_num=c,
            candidates=cand,
            retrive_index=ri,
            retrive_next_token=rn,
            retrive_next_sibling=rs,
            target_predict=t,
        )
    )
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)
    assert len(set(ref[2].tolist())) > 1  # several accept lengths


def test_fill_bonus_tokens():
    gen = torch.Generator().manual_seed(3)
    bs, stride = 5, 4
    accept_tokens = torch.randint(0, 100, (bs, stride), generator=gen, dtype=torch.int32)
    accept_lens = torch.randint(1, stride + 1, (bs,), generator=gen, dtype=torch.int32)
    ref = torch.full((bs,), -1, dtype=torch.int32)
    ours = ref.clone()
    eagle.fill_bonus_tokens[(bs,)](accept_tokens, accept_lens, ref, stride)
    sgl_kernel.fill_bonus_tokens_cpu(accept_tokens, accept_lens, ours, stride)
    assert torch.equal(ours, ref)


def test_fill_accept_out_cache_loc():
    gen = torch.Generator().manual_seed(4)
    bs, s, n = 4, 4, 6
    accept_index = torch.full((bs, s), -1, dtype=torch.int32)
    for b in range(bs):
        k = int(torch.randint(1, s + 1, (1,), generator=gen))
        accept_index[b, :k] = torch.sort(torch.randperm(n, generator=gen)[:k]).values.to(torch.int32) + b * n
    out_cache_loc = torch.randint(1, 999, (bs * n,), generator=gen)
    ref = torch.zeros(bs * s, dtype=torch.int64)
    ours = ref.clone()
    eagle.fill_accept_out_cache_loc_func(accept_index, out_cache_loc, ref, bs * s)
    sgl_kernel.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, ours)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("with_select", [False, True])
def test_rotate_input_ids(with_select):
    gen = torch.Generator().manual_seed(5)
    lens = torch.tensor([3, 1, 5])
    starts = torch.cumsum(lens, 0) - lens
    ids = torch.randint(0, 100, (int(lens.sum()),), generator=gen)
    new = torch.tensor([1001, 1002, 1003])
    select = (starts + lens - 2).clamp(min=starts) if with_select else None
    ref, ours = ids.clone(), ids.clone()
    multi_layer_eagle.rotate_input_ids_kernel[(3,)](ref, starts, lens, new, select, BLOCK_SIZE=4)
    sgl_kernel.rotate_input_ids_cpu(ours, starts, lens, new, select)
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("n", [1, 4, 8, 13])
@pytest.mark.parametrize("kind", ["tree", "any mask"])
def test_reconstruct_indices_from_tree_mask(n, kind):
    from sglang.kernels.ops.speculative import reconstruct_tree
    from support.spec_helpers import random_tree

    gen = torch.Generator().manual_seed(n)
    bs = 3
    if kind == "tree":  # NGRAM's verify mask: node j an ancestor of node i, or i itself
        mask = random_tree(gen, bs, n, vocab=100, min_nodes=n).ancestor_mask()  # [bs, n, n]
    else:  # the op's contract holds for any boolean mask, not only a tree's
        mask = torch.rand(bs, n, n, generator=gen) < 0.4
    verified = torch.randint(1, 50, (bs,), generator=gen)

    def run(fn):  # positions flat, the retrieve rows [bs, n], as the NGRAM worker allocates them
        outs = [torch.full((bs * n,), -9, dtype=torch.int64)] + [
            torch.full((bs, n), -9, dtype=torch.int64) for _ in range(3)
        ]
        fn(mask.reshape(-1), verified, *outs, bs, n)
        return outs

    ref = run(reconstruct_tree.reconstruct_indices_from_tree_mask_triton)
    ours = run(sgl_kernel.speculative.reconstruct_indices_from_tree_mask)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)
    if n > 1:
        assert (ref[2] >= 0).any(), "no node has a child: the comparison covered no edge"
