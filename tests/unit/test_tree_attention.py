"""The target's verify attention on a DFLASH tree server (``speculative/workers/tree_attention.py``).

FlashAttention 3 verifies a tree through the path SGLang built for EAGLE trees: every node attends to the committed
prefix, and each node alone to the window slots its row of the FULL_MASK selects, found by index arithmetic. Here
SGLang's own ``FlashAttentionBackend.init_forward_metadata`` runs on CPU (its metadata is torch; the kernels need a
GPU) on the mask the tree worker writes, and the keys it hands FA3 for each node are exactly the committed prefix and
the node's ancestors, itself included; nothing outside the tree blocks is read. Which backends serve trees, and the
refusals naming the others, are checked on stand-in backends of SGLang's real classes.

SGLang's modules need the CPU import shims, so the tests run in the session's CPU SGLang child process.
"""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch
from sglang.srt.layers.attention.flashattention_backend import FlashAttentionBackend
from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_kimi.speculative.workers.tree_attention import FA3_TREE_TOPK, prepare_tree_verify
from sglang_kimi.speculative.workers.tree_verify_inputs import tree_mask_capacity, write_tree_mask
from sglang_kimi.speculators.trees import DraftTree

pytestmark = pytest.mark.cpu_sglang_child


CONTEXT, POOL_ROWS = 64, 8


def random_trees(gen, batch: int, n: int) -> DraftTree:
    """Trees of n nodes, node i's parent any earlier node (chains, stars and everything between)."""
    parents = torch.full((batch, n), -1, dtype=torch.long)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (batch,), generator=gen)
    depths = torch.zeros((batch, n), dtype=torch.long)
    for i in range(1, n):
        depths[:, i] = depths.gather(1, parents[:, i : i + 1])[:, 0] + 1
    return DraftTree(
        tokens=torch.randint(0, 100, (batch, n), generator=gen),
        parents=parents,
        depths=depths,
        num_nodes=torch.full((batch,), n, dtype=torch.long),
        max_depth=int(depths.max()),
    )


def fa3_backend(req_to_token: torch.Tensor, window: int, topk: int = FA3_TREE_TOPK):
    """FlashAttentionBackend's state that its eager target-verify metadata reads (page size 1, no sliding
    window, no KV translation), as SGLang builds it for a verify window of ``window`` tokens."""
    backend = object.__new__(FlashAttentionBackend)
    vars(backend).update(
        topk=topk, speculative_num_draft_tokens=window, max_context_len=CONTEXT, page_size=1, has_swa=False,
        req_to_token_pool=NS(req_to_token=req_to_token), req_to_token=req_to_token, device=torch.device("cpu"),
        use_sliding_window_kv_pool=False, _kv_shard_pool=None, kv_index_translator=NS(is_translating=False),
        local_attn_builder=None, is_prefill_aware_swa=False, fa_impl_ver=3,
    )  # fmt: skip
    return backend


@pytest.mark.parametrize("seed, prefix", [(0, [4, 9, 1]), (1, [0, 30]), (2, [17])])
@pytest.mark.parametrize("window", [2, 5, 9])
def test_fa3s_tree_verify_reads_each_nodes_ancestors_from_the_plugins_mask(seed, prefix, window):
    gen = torch.Generator().manual_seed(seed * 100 + window)
    prefix_lens = torch.tensor(prefix)  # [B]
    batch = len(prefix)
    req_to_token = torch.randperm(POOL_ROWS * CONTEXT, generator=gen).view(POOL_ROWS, CONTEXT).to(torch.int32)
    req_pool_indices = torch.randperm(POOL_ROWS, generator=gen)[:batch]
    tree = random_trees(gen, batch, window)
    ancestor = tree.ancestor_mask()  # [B, N, N]
    capacity = tree_mask_capacity(int(prefix_lens.sum()), batch, window, CONTEXT)
    mask = torch.randint(0, 2, (capacity,), dtype=torch.bool, generator=gen)  # stale cells outside the blocks
    write_tree_mask(mask, ancestor, prefix_lens)

    backend = fa3_backend(req_to_token, window)
    forward_batch = NS(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=batch, seq_lens=prefix_lens, seq_lens_cpu=prefix_lens,
        req_pool_indices=req_pool_indices, spec_info=NS(custom_mask=mask), encoder_lens=None,
    )  # fmt: skip
    backend.init_forward_metadata(forward_batch)  # SGLang's own metadata code
    prefix_part, window_part = backend.forward_metadata, backend.forward_metadata_spec_decode_expand

    rows = req_to_token[req_pool_indices.long()]  # [B, context]: each request's slots
    assert torch.equal(prefix_part.cache_seqlens_int32, prefix_lens.to(torch.int32))  # all nodes: the prefix
    for b, p in enumerate(prefix):
        assert torch.equal(prefix_part.page_table[b, :p], rows[b, :p])
        for i in range(window):
            r = b * window + i  # one query row a node
            keys = window_part.page_table[r, : int(window_part.cache_seqlens_int32[r])]
            expected = rows[b, p : p + window][ancestor[b, i]]  # the slots of i and its ancestors
            assert sorted(keys.tolist()) == sorted(expected.tolist()), (b, i)


def test_fa3_serves_a_static_tree_by_its_tree_path_and_refuses_changing_widths():
    fa3 = fa3_backend(torch.zeros(1, 1, dtype=torch.int32), window=9, topk=0)  # a DFLASH server's: no topk
    runner = NS(attn_backend=fa3)
    assert prepare_tree_verify(runner, "DFLASH draft trees", any_width=False) == "FlashAttentionBackend"
    assert fa3.topk == FA3_TREE_TOPK
    with pytest.raises(ValueError, match="keeps the width it was built with") as refused:
        prepare_tree_verify(NS(attn_backend=fa3_backend(fa3.req_to_token, 9)), "adaptive DFLASH", any_width=True)
    assert "--attention-backend triton" in str(refused.value)
    fa4 = fa3_backend(fa3.req_to_token, 9, topk=0)
    fa4.fa_impl_ver = 4  # Blackwell's FlashAttention 4: not the Hopper path checked here
    with pytest.raises(ValueError, match="verifies MLA chains only"):
        prepare_tree_verify(NS(attn_backend=fa4), "DFLASH draft trees", any_width=False)


def test_the_verify_backend_is_found_inside_sglangs_wrappers_and_chain_only_ones_are_refused():
    triton = object.__new__(TritonAttnBackend)
    hybrid = object.__new__(HybridAttnBackend)
    chosen = []
    hybrid._select_backend = lambda mode: chosen.append(mode) or triton  # the backend that runs TARGET_VERIFY
    assert prepare_tree_verify(NS(attn_backend=hybrid), "DFLASH draft trees", any_width=True) == "TritonAttnBackend"
    assert chosen == [ForwardMode.TARGET_VERIFY]

    class FlashInferMLAAttnBackend:  # a chain-only MLA backend's name
        pass

    with pytest.raises(ValueError) as refused:
        prepare_tree_verify(NS(attn_backend=FlashInferMLAAttnBackend()), "DFLASH draft trees", any_width=False)
    message = str(refused.value)
    assert "FlashInferMLAAttnBackend, which verifies MLA chains only" in message
    assert "--attention-backend triton, or fa3 on Hopper" in message
