"""The reference DDTree build: one Python ``heapq`` best-first loop per request.

The oracle the batched build (``speculators/ddtree.py``) and the Triton kernel are tested against, and the
per-request baseline ``bench/bench_trees.py`` times them against. Each request's positions are ranked alone
(``rank_draft_logits`` on its ``[L, V]`` rows), then popped in the order of the key (-score, depth, parent node, rank),
scores summed in float32 root to leaf exactly as the batched build sums them. Lazy enumeration: the heap starts with
(depth 1, rank 0); popping (d, parent, r) creates node n and pushes its next sibling (d, parent, r + 1) and its first
child (d + 1, n, 0); both keys are >= the popped key, so pops come out in global key order (``docs/ddtree.md``).
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

from ..ddtree import rank_draft_logits
from ..trees import NO_PARENT, DraftTree


def ddtree_heap(root: torch.Tensor, draft_logits: torch.Tensor, budget: int) -> DraftTree:
    """root [B]; draft_logits [B, L, V] -> the DDTree of each request, built one request at a time."""
    batch, length, vocab = draft_logits.shape
    if budget < 1 or length < 1:
        raise ValueError(f"ddtree_heap needs budget >= 1 and at least one draft position, got {budget}, {length}")
    k = min(budget, vocab)
    rows = []
    for b in range(batch):
        ranked_lp, ranked_ids = rank_draft_logits(draft_logits[b], k)  # [L, K]
        lp = ranked_lp.cpu().numpy()  # float32: sums round as the batched build's
        ids = ranked_ids.tolist()
        tokens, parents, depths = [int(root[b])], [NO_PARENT], [0]
        scores = [np.float32(0.0)]
        heap = [(-lp[0, 0], 1, 0, 0)]  # (-score, depth, parent node, rank)
        while heap and len(tokens) <= budget:
            neg_score, depth, parent, rank = heapq.heappop(heap)
            node = len(tokens)
            tokens.append(ids[depth - 1][rank])
            parents.append(parent)
            depths.append(depth)
            scores.append(np.float32(-neg_score))
            if rank + 1 < k:
                heapq.heappush(heap, (-np.float32(scores[parent] + lp[depth - 1, rank + 1]), depth, parent, rank + 1))
            if depth < length:
                heapq.heappush(heap, (-np.float32(scores[node] + lp[depth, 0]), depth + 1, node, 0))
        rows.append((tokens, parents, depths))
    device = draft_logits.device
    tokens, parents, depths = (torch.tensor([r[i] for r in rows], device=device) for i in range(3))
    num_nodes = torch.full((batch,), tokens.shape[1], dtype=torch.long, device=device)
    return DraftTree(tokens, parents, depths, num_nodes, max_depth=min(length, budget))  # as the batched build
