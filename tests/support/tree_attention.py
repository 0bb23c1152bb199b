"""Tree-masked attention over a verify batch, laid out as SGLang's ``triton`` backend hands it to its extend-attention
kernel (per request: the prefix's KV through ``kv_indptr`` / ``kv_indices``, then the window's own K/V), and the
reference it must equal: each node sees the whole prefix and itself and its ancestors. For the CPU test of that
kernel under Triton's interpreter and its GPU test under CUDA graphs."""

from __future__ import annotations

import torch

from sglang_kimi.speculators.trees import DraftTree

HEADS, QK_DIM, V_DIM, SCALE = 2, 80, 64, 0.1  # MLA-like: one shared latent head, V its leading columns


def random_trees(gen: torch.Generator, batch: int, n: int) -> DraftTree:
    parents = torch.full((batch, n), -1)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (batch,), generator=gen)  # any earlier node: a random tree
    tokens = torch.randint(0, 100, (batch, n), generator=gen)
    return DraftTree.from_parents(tokens, parents)


def verify_batch(prefix_lens: list[int], n: int, gen: torch.Generator, device="cpu") -> dict:
    """Random q, K/V and SGLang's index arrays for ``len(prefix_lens)`` requests of ``n`` window tokens each."""
    batch, total_prefix = len(prefix_lens), sum(prefix_lens)
    k_buffer = torch.randn(total_prefix + batch * n, 1, QK_DIM, generator=gen)  # [slots, 1, D]
    lens = torch.tensor(prefix_lens)
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(lens, 0)
    mask_indptr = torch.zeros(batch + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(n * (lens + n), 0)  # from the device lengths, as the backend lays it out
    arrays = {
        "q": torch.randn(batch * n, HEADS, QK_DIM, generator=gen),  # [B*N, H, D]
        "k_buffer": k_buffer,
        "v_buffer": k_buffer[..., :V_DIM].clone(),
        "qo_indptr": torch.arange(0, (batch + 1) * n, n, dtype=torch.int32),
        "kv_indptr": kv_indptr,
        "kv_indices": torch.arange(total_prefix, dtype=torch.int64),
        "mask_indptr": mask_indptr,
    }
    arrays["k_extend"] = arrays["k_buffer"][total_prefix:].clone()
    arrays["v_extend"] = arrays["v_buffer"][total_prefix:].clone()
    return {name: value.to(device) for name, value in arrays.items()}


def reference(arrays: dict, prefix_lens: list[int], ancestor: torch.Tensor) -> torch.Tensor:
    """[B*N, H, V_DIM]: softmax attention of each node over the prefix and its ancestors (ancestor bool [B, N, N])."""
    batch, n, _ = ancestor.shape
    a = {name: value.cpu() for name, value in arrays.items()}
    out = torch.empty(batch * n, HEADS, V_DIM)
    for b in range(batch):
        rows, prefix = slice(b * n, (b + 1) * n), slice(int(a["kv_indptr"][b]), int(a["kv_indptr"][b + 1]))
        keys = torch.cat([a["k_buffer"][prefix, 0], a["k_extend"][rows, 0]])  # [P+N, D]
        values = torch.cat([a["v_buffer"][prefix, 0], a["v_extend"][rows, 0]])
        allowed = torch.cat([torch.ones(n, prefix_lens[b], dtype=torch.bool), ancestor[b].cpu()], 1)  # [N, P+N]
        for h in range(HEADS):
            scores = (a["q"][rows, h] @ keys.T * SCALE).masked_fill(~allowed, float("-inf"))
            out[rows, h] = torch.softmax(scores, -1) @ values
    return out
