"""The torch stand-ins for SGLang's compiled CUDA ops (sglang_kimi.platform.cuda_stand_in) on a CUDA device: the MoE
align
against SGLang's own single-launch Triton align (same output contract), captured and replayed in a CUDA graph.

Skipped, with the reason, where there is no CUDA device. Run with ``pytest tests/gpu -q``.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available() or torch.version.cuda is None:
    pytest.skip("no CUDA device (torch.cuda.is_available() is False)", allow_module_level=True)

from sglang_kimi.platform.cuda_stand_in import ops  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")


def _buffers(numel: int, buckets: int, block_size: int):
    max_padded = (numel + buckets * (block_size - 1) + 3) // 4 * 4
    return (
        torch.full((max_padded,), -7, dtype=torch.int32, device=DEV),  # sorted_token_ids
        torch.full((-(-max_padded // block_size),), -7, dtype=torch.int32, device=DEV),  # expert_ids
        torch.zeros(1, dtype=torch.int32, device=DEV),  # num_tokens_post_pad
    )


def _random_topk(num_tokens: int, top_k: int, experts: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    scores = torch.rand(num_tokens, experts, generator=gen, device=DEV)
    ids = scores.topk(top_k, dim=1).indices.to(torch.int32)  # [num_tokens, top_k] distinct experts per token
    ids[0, 0] = -1  # one filtered slot
    return ids


@pytest.mark.parametrize("num_tokens,top_k,experts,block_size", [(1, 2, 8, 16), (8, 2, 8, 16), (4, 8, 384, 16)])
def test_moe_align_matches_sglang_triton_align(num_tokens, top_k, experts, block_size):
    from sglang.kernels.ops.moe.moe_align_small_numel import moe_align_small_numel

    topk_ids = _random_topk(num_tokens, top_k, experts, seed=num_tokens + experts)
    buckets = experts + 1
    mine, theirs = _buffers(topk_ids.numel(), buckets, block_size), _buffers(topk_ids.numel(), buckets, block_size)
    cumsum = torch.empty(buckets + 1, dtype=torch.int32, device=DEV)
    ops.moe_align_block_size(topk_ids, buckets, block_size, *mine, cumsum, True)
    moe_align_small_numel(topk_ids, buckets, block_size, *theirs)
    total = int(theirs[2][0])
    assert int(mine[2][0]) == total
    assert torch.equal(mine[0][:total], theirs[0][:total])
    blocks = total // block_size
    assert torch.equal(mine[1][:blocks], theirs[1][:blocks])


def test_moe_align_replays_in_a_cuda_graph():
    experts, block_size = 8, 16
    topk_ids = _random_topk(32, 2, experts, seed=1)
    out = _buffers(topk_ids.numel(), experts + 1, block_size)
    cumsum = torch.empty(experts + 2, dtype=torch.int32, device=DEV)
    ops.moe_align_block_size(topk_ids, experts + 1, block_size, *out, cumsum, True)  # warm-up outside the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.moe_align_block_size(topk_ids, experts + 1, block_size, *out, cumsum, True)
    expected = [t.clone() for t in out]
    topk_ids.copy_(_random_topk(32, 2, experts, seed=2))
    graph.replay()
    fresh = _buffers(topk_ids.numel(), experts + 1, block_size)
    ops.moe_align_block_size(topk_ids, experts + 1, block_size, *fresh, cumsum.clone(), True)
    total = int(fresh[2][0])
    assert int(out[2][0]) == total
    assert torch.equal(out[0][:total], fresh[0][:total])
    assert not torch.equal(out[0], expected[0]) or torch.equal(fresh[0], expected[0])
