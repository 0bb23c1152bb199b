"""The torch stand-ins for SGLang's compiled CUDA ops (sglang_kimi.platform.cuda_stand_in), checked on CPU tensors
against
the ops' definitions written out step by step."""

import pytest
import torch
import torch.nn.functional as F

from sglang_kimi.platform.cuda_stand_in import missing_ops, ops


def reference_align(topk_ids: torch.Tensor, buckets: int, block_size: int):
    """The MoE align written out: bucket b = expert + 1 (0: filtered), buckets in order, slots in order within one,
    each bucket padded to a multiple of block_size with the pad index numel."""
    flat = topk_ids.reshape(-1).tolist()
    numel = len(flat)
    rows, experts = [], []
    for b in range(buckets):
        members = [i for i, e in enumerate(flat) if e + 1 == b]
        if not members:
            continue
        padded = -(-len(members) // block_size) * block_size
        rows += members + [numel] * (padded - len(members))
        experts += [b - 1] * (padded // block_size)
    return rows, experts


@pytest.mark.parametrize(
    "num_tokens,top_k,experts,block_size", [(1, 2, 8, 16), (7, 2, 8, 4), (33, 8, 64, 16), (5, 3, 4, 1)]
)
def test_moe_align_block_size_matches_its_definition(num_tokens, top_k, experts, block_size):
    gen = torch.Generator().manual_seed(num_tokens * 131 + experts)
    topk_ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(num_tokens)]).to(torch.int32)
    topk_ids[0, 0] = -1  # a filtered slot
    numel, buckets = topk_ids.numel(), experts + 1
    max_padded = numel + buckets * (block_size - 1)
    sorted_ids = torch.full((max_padded,), -7, dtype=torch.int32)
    blocks = -(-max_padded // block_size)
    expert_ids = torch.full((blocks,), -7, dtype=torch.int32)
    total = torch.zeros(1, dtype=torch.int32)
    cumsum = torch.zeros(buckets + 1, dtype=torch.int32)
    ops.moe_align_block_size(topk_ids, buckets, block_size, sorted_ids, expert_ids, total, cumsum, True)
    rows, experts_of_blocks = reference_align(topk_ids, buckets, block_size)
    assert int(total) == len(rows)
    assert sorted_ids[: len(rows)].tolist() == rows
    assert (sorted_ids[len(rows) :] == numel).all()
    assert expert_ids[: len(experts_of_blocks)].tolist() == experts_of_blocks
    assert (expert_ids[len(experts_of_blocks) :] == -1).all()
    assert int(cumsum[-1]) == len(rows) and int(cumsum[0]) == 0


def test_moe_align_block_size_refuses_what_it_does_not_implement():
    with pytest.raises(NotImplementedError, match="expert-parallel"):
        ops.moe_align_block_size(
            torch.zeros(1, 2, dtype=torch.int32), 9, 16, torch.empty(64, dtype=torch.int32),
            torch.empty(4, dtype=torch.int32), torch.empty(1, dtype=torch.int32), torch.empty(10, dtype=torch.int32),
            True, True,
        )  # fmt: skip


def test_moe_sum_reduce_sums_the_experts_and_scales():
    x = torch.randn(6, 3, 10, dtype=torch.bfloat16)
    out = torch.empty(6, 10, dtype=torch.bfloat16)
    ops.moe_sum_reduce(x, out, 2.5)
    torch.testing.assert_close(out, (x.float().sum(1) * 2.5).to(torch.bfloat16), rtol=0, atol=0)


def test_silu_and_mul_writes_silu_of_the_gate_times_the_up_half():
    x = torch.randn(5, 2 * 12)
    out = torch.full((5, 12), float("nan"))
    got = missing_ops.silu_and_mul(x, out, expert_ids=torch.zeros(1, dtype=torch.int32), expert_step=4)
    assert got is out
    torch.testing.assert_close(out, F.silu(x[:, :12]) * x[:, 12:], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(missing_ops.silu_and_mul(x), out, rtol=0, atol=0)


def test_stand_in_hooks_keep_the_signatures_of_what_they_replace():
    import inspect

    from sglang.kernels.ops.activation import activation
    from sglang.kernels.ops.speculative import tree

    for stand_in, original in [
        (missing_ops.silu_and_mul, activation.silu_and_mul),
        (missing_ops._build_tree_kernel_efficient, tree.build_tree_kernel_efficient),
        (missing_ops._verify_tree_greedy, tree.verify_tree_greedy),
    ]:
        assert list(inspect.signature(stand_in).parameters) == list(inspect.signature(original).parameters)


def test_top_k_renorm_keeps_the_k_largest_of_each_row():
    probs = torch.softmax(torch.randn(4, 50, dtype=torch.float64), dim=-1)
    top_ks = torch.tensor([1, 3, 50, 7])
    got = missing_ops.top_k_renorm_prob(probs, top_ks)
    for row, k in zip(range(4), top_ks.tolist()):
        idx = probs[row].topk(k).indices
        expected = torch.zeros(50, dtype=torch.float64)
        expected[idx] = probs[row, idx] / probs[row, idx].sum()
        torch.testing.assert_close(got[row], expected, rtol=1e-12, atol=1e-15)


def test_top_p_renorm_keeps_the_smallest_prefix_reaching_p(monkeypatch):
    import sys
    import types

    # sampler.top_p_normalize_probs_torch, without importing SGLang's sampler (it needs torchvision)
    def top_p_normalize_probs_torch(probs, top_ps):
        probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
        probs_sort[(torch.cumsum(probs_sort, dim=-1) - probs_sort) > top_ps.view(-1, 1)] = 0.0
        probs_sort.div_(probs_sort.sum(dim=-1, keepdim=True))
        return torch.zeros_like(probs_sort).scatter_(-1, probs_idx, probs_sort)

    monkeypatch.setitem(
        sys.modules,
        "sglang.srt.layers.sampler",
        types.SimpleNamespace(top_p_normalize_probs_torch=top_p_normalize_probs_torch),
    )
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]], dtype=torch.float64)
    got = missing_ops.top_p_renorm_prob(probs, torch.tensor([0.4, 0.65], dtype=torch.float64))
    torch.testing.assert_close(got, torch.tensor([[1.0, 0.0, 0.0], [0.0, 2 / 3, 1 / 3]], dtype=torch.float64))
